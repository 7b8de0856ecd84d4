//! `tether check-limits [--target N] [--config F]`: reads the OS limits that bound how many
//! connections this box can hold, prints each against the value the target needs, predicts
//! capacity, and says exactly which lines to change (docs/operations.md, check-limits).
//!
//! Capacity is the smallest of these bounds on concurrent connections of one `tether serve`:
//! - the nofile hard limit (the server raises its soft limit to the hard one at start),
//!   less [`RESERVED_FDS`];
//! - `fs.nr_open` (no process's hard limit can exceed it), less [`RESERVED_FDS`];
//! - `fs.file-max` less the handles already open system-wide, less [`RESERVED_FDS`];
//! - `MemAvailable / (per_conn_user_bytes + per_conn_kernel_bytes)`;
//! - the config's `max_connections`.
//!
//! The ephemeral port range bounds connections per (source IP, destination) pair, which limits
//! the load generator, not the server (accepted sockets use no ephemeral port); it is shown
//! but does not cap. `somaxconn` and `tcp_max_syn_backlog` bound connection bursts (a
//! reconnect storm), not concurrent connections: below the recommendation they are marked
//! `<- advised` and listed as changes, but need nothing for the target. So does the size of
//! the TCP established hash (`net.ipv4.tcp_ehash_entries`): with fewer buckets than the target
//! has sockets, every segment received walks a chain of them (at one million on a table of
//! 262,144, the lookup was a third of a node's CPU in a broadcast, docs/operations.md); it is
//! sized at boot (`thash_entries=`), so the advice is a note, not a sysctl line.
//!
//! # Layout
//! - this file: options, the capacity arithmetic, the table and the change list.
//! - `probe`: reading procfs under a configurable root.

mod probe;

#[cfg(test)]
mod tests;

pub use probe::{meminfo_bytes, parse_nofile, read, Readings};

use crate::config::{Config, ConfigError};
use std::io::{self, Write};
use std::path::PathBuf;

/// Default `--target`: the C1M goal.
pub const DEFAULT_TARGET: u64 = 1_000_000;

/// Budget of user-space RSS per idle subscribed connection, bytes: about 2.5× the 208 B
/// measured with one readiness set per core and no task per connection (docs/benchmarks.md,
/// "Allocator"), leaving room for a few subscriptions per connection and allocator slack. A
/// budget figure, not a measurement: replace it with the slope measured by `benches/density`
/// on the deployment's allocator and subscription pattern (`--conn-user-bytes`).
pub const USER_BYTES_PER_CONN: u64 = 512;

/// Kernel memory per idle TCP connection, bytes: socket, inode, dentry, file and io_uring
/// bookkeeping with empty socket buffers. Measured by `benches/density` on a 2-core Linux 6.x
/// box: the `Slab:` growth was 9.7–11.3 KB per loopback connection *pair* (client and server
/// socket both live there), so about 5 KiB per server-side connection. Replace it with your
/// own measurement (`--conn-kernel-bytes`). Socket buffers holding unsent data come on top,
/// bounded by `net.ipv4.tcp_mem`.
pub const KERNEL_BYTES_PER_CONN: u64 = 5120;

/// File descriptors one `tether serve` uses besides connections: stdio, one listener, one
/// io_uring or epoll instance and wake-up eventfds per core, broker connections, logs.
pub const RESERVED_FDS: u64 = 256;

/// Recommended `net.core.somaxconn` and `net.ipv4.tcp_max_syn_backlog`: the largest value
/// every kernel accepts (65535 fits the 16-bit field of older kernels).
pub const RECOMMENDED_BACKLOG: u64 = 65535;

/// Recommended `net.ipv4.ip_local_port_range`: every non-privileged port.
pub const RECOMMENDED_PORT_RANGE: (u64, u64) = (1024, 65535);

/// Inputs of [`check_limits`].
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Connections this box should hold, per process. Default [`DEFAULT_TARGET`].
    pub target: u64,
    /// The server config, for `max_connections`; `None` uses [`Config::default`] (what
    /// `tether serve` runs without `--config`).
    pub config: Option<Config>,
    /// Where procfs is mounted, `/proc` by default; tests pass a fake tree.
    pub proc_root: PathBuf,
    /// User-space bytes per connection for the memory bound. Default [`USER_BYTES_PER_CONN`].
    pub per_conn_user_bytes: u64,
    /// Kernel bytes per connection for the memory bound. Default [`KERNEL_BYTES_PER_CONN`].
    pub per_conn_kernel_bytes: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            target: DEFAULT_TARGET,
            config: None,
            proc_root: PathBuf::from("/proc"),
            per_conn_user_bytes: USER_BYTES_PER_CONN,
            per_conn_kernel_bytes: KERNEL_BYTES_PER_CONN,
        }
    }
}

/// Command-line arguments of `tether check-limits`, to `#[command(flatten)]` or use as a
/// subcommand's args in the binary's clap tree.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckLimitsArgs {
    /// Connections the box should hold (per process).
    #[arg(long, default_value_t = DEFAULT_TARGET)]
    pub target: u64,
    /// Server config file; its `max_connections` is one of the bounds.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// User-space bytes per idle connection (measured by benches/density).
    #[arg(long, default_value_t = USER_BYTES_PER_CONN)]
    pub conn_user_bytes: u64,
    /// Kernel bytes per idle connection (measured by benches/density).
    #[arg(long, default_value_t = KERNEL_BYTES_PER_CONN)]
    pub conn_kernel_bytes: u64,
    /// Root of procfs; tests point it at a fake tree.
    #[arg(long, hide = true, default_value = "/proc")]
    pub proc_root: PathBuf,
}

impl CheckLimitsArgs {
    /// Builds [`CheckOptions`], loading `--config` when given.
    pub fn to_options(&self) -> Result<CheckOptions, ConfigError> {
        let config = self.config.as_deref().map(Config::load).transpose()?;
        Ok(CheckOptions {
            target: self.target,
            config,
            proc_root: self.proc_root.clone(),
            per_conn_user_bytes: self.conn_user_bytes,
            per_conn_kernel_bytes: self.conn_kernel_bytes,
        })
    }

    /// Runs the check on stdout and returns the process exit code of docs/operations.md
    /// (check-limits): 0 when the target is reachable, 1 when not, 2 for a bad config file or an
    /// output error (the message goes to stderr).
    pub fn run(&self) -> i32 {
        let opts = match self.to_options() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("{e}");
                return 2;
            }
        };
        match check_limits(&opts, &mut io::stdout().lock()) {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(e) => {
                eprintln!("check-limits: {e}");
                2
            }
        }
    }
}

/// Where a change goes; the list is printed grouped in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    LimitsD,
    Unit,
    Sysctl,
    ConfigFile,
    Note,
}

impl Target {
    fn header(self) -> &'static str {
        match self {
            Target::LimitsD => "# /etc/security/limits.d/tether.conf  (applies to new login sessions)",
            Target::Unit => "# /etc/systemd/system/tether.service, [Service]  (then: systemctl daemon-reload && systemctl restart tether)",
            Target::Sysctl => "# /etc/sysctl.d/99-tether.conf  (then: sysctl --system)",
            Target::ConfigFile => "# /etc/tether/tether.toml",
            Target::Note => "# also:",
        }
    }
}

/// What a row says about connections.
enum Bound {
    /// Caps the server's concurrent connections at this many.
    Caps(u64),
    /// Shown for information only.
    Info(String),
}

struct Row {
    limit: &'static str,
    current: String,
    /// The least value that reaches the target (`-` when the row does not bound connections);
    /// the change lines may recommend more (a power of two, room to grow).
    needed: String,
    bound: Bound,
    /// Lines to change; empty when the row is fine.
    fixes: Vec<(Target, String)>,
}

fn show(v: Option<u64>) -> String {
    match v {
        None => "unreadable".to_owned(),
        Some(u64::MAX) => "unlimited".to_owned(),
        Some(n) => n.to_string(),
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// nofile value to recommend for `target` connections: room for the reserve, rounded up to a
/// power of two (1048576 for 1M), never below the common 1024.
pub fn recommended_nofile(target: u64) -> u64 {
    target.saturating_add(RESERVED_FDS).checked_next_power_of_two().unwrap_or(u64::MAX).max(1024)
}

fn rows(r: &Readings, opts: &CheckOptions) -> Vec<Row> {
    let target = opts.target;
    let need_fds = target.saturating_add(RESERVED_FDS);
    let rec_fds = recommended_nofile(target);
    let mut rows = Vec::new();

    // nofile: the hard limit is what counts, the server lifts its soft limit to it.
    let hard_bound = r.nofile_hard.map(|h| h.saturating_sub(RESERVED_FDS));
    let nofile_short = r.nofile_hard.is_some_and(|h| h < need_fds);
    rows.push(Row {
        limit: "nofile soft/hard",
        current: format!("{}/{}", show(r.nofile_soft), show(r.nofile_hard)),
        needed: format!(">= {need_fds} hard"),
        bound: hard_bound.map_or(Bound::Info("unknown (not counted)".into()), Bound::Caps),
        fixes: if nofile_short {
            vec![
                (Target::LimitsD, format!("tether soft nofile {rec_fds}")),
                (Target::LimitsD, format!("tether hard nofile {rec_fds}")),
                (Target::Unit, format!("LimitNOFILE={rec_fds}")),
            ]
        } else {
            Vec::new()
        },
    });

    // fs.nr_open: raising nofile past it fails, so it must follow a nofile change.
    // Recommended at twice the nofile figure, as in sysctl/99-tether.conf, so LimitNOFILE can
    // later be raised without touching sysctl.
    let rec_nr_open = rec_fds.saturating_mul(2);
    let nr_short = r.nr_open.is_some_and(|n| n < need_fds || (nofile_short && n < rec_fds));
    rows.push(Row {
        limit: "fs.nr_open",
        current: show(r.nr_open),
        needed: format!(">= {need_fds}"),
        bound: r
            .nr_open
            .map(|n| n.saturating_sub(RESERVED_FDS))
            .map_or(Bound::Info("unknown (not counted)".into()), Bound::Caps),
        fixes: if nr_short { vec![(Target::Sysctl, format!("fs.nr_open = {rec_nr_open}"))] } else { Vec::new() },
    });

    // fs.file-max: system-wide, shared with everything else on the box (a local load
    // generator needs as many again), hence twice the per-process figure.
    let rec_file_max = rec_fds.saturating_mul(2);
    let file_bound = r.file_max.map(|m| m.saturating_sub(r.file_allocated.unwrap_or(0)).saturating_sub(RESERVED_FDS));
    rows.push(Row {
        limit: "fs.file-max",
        current: match r.file_allocated {
            Some(a) => format!("{} ({a} in use)", show(r.file_max)),
            None => show(r.file_max),
        },
        needed: format!(">= {}", need_fds.saturating_add(r.file_allocated.unwrap_or(0))),
        bound: file_bound.map_or(Bound::Info("unknown (not counted)".into()), Bound::Caps),
        fixes: if file_bound.is_some_and(|b| b < target) {
            vec![(Target::Sysctl, format!("fs.file-max = {rec_file_max}"))]
        } else {
            Vec::new()
        },
    });

    // Memory: what is available now, over the per-connection budget.
    let per_conn = opts.per_conn_user_bytes.saturating_add(opts.per_conn_kernel_bytes).max(1);
    let mem = r.mem_available.or(r.mem_total);
    let mem_need = target.saturating_mul(per_conn);
    let mem_bound = mem.map(|m| m / per_conn);
    rows.push(Row {
        limit: "memory available/total",
        current: format!(
            "{}/{}",
            r.mem_available.map_or("unreadable".into(), gib),
            r.mem_total.map_or("unreadable".into(), gib)
        ),
        needed: format!(">= {} available", gib(mem_need)),
        bound: mem_bound.map_or(Bound::Info("unknown (not counted)".into()), Bound::Caps),
        fixes: if mem_bound.is_some_and(|b| b < target) {
            vec![(
                Target::Note,
                format!(
                    "memory: {target} connections x ({} user + {} kernel) B = {} needed, {} available: add memory, free it, or lower the target",
                    opts.per_conn_user_bytes,
                    opts.per_conn_kernel_bytes,
                    gib(mem_need),
                    mem.map_or("unknown".into(), gib)
                ),
            )]
        } else {
            Vec::new()
        },
    });

    // The server's own admission limit.
    let default_config = Config::default();
    let (config, label) = match &opts.config {
        Some(c) => (c, "max_connections"),
        None => (&default_config, "max_connections (default)"),
    };
    let max_conn = config.max_connections as u64;
    rows.push(Row {
        limit: label,
        current: max_conn.to_string(),
        needed: format!(">= {target}"),
        bound: Bound::Caps(max_conn),
        fixes: if max_conn < target {
            vec![(Target::ConfigFile, format!("max_connections = {target}"))]
        } else {
            Vec::new()
        },
    });

    // Port range: per source IP of a client, so the load generator's problem, not the server's.
    let (rec_lo, rec_hi) = RECOMMENDED_PORT_RANGE;
    let ports = r.port_range.map(|(lo, hi)| hi.saturating_sub(lo) + 1);
    rows.push(Row {
        limit: "net.ipv4.ip_local_port_range",
        current: r.port_range.map_or("unreadable".into(), |(lo, hi)| format!("{lo} {hi}")),
        needed: "-".into(),
        bound: Bound::Info(match ports {
            Some(p) => {
                let ips = target.div_ceil(p.max(1));
                format!(
                    "none (load generator: {p} per client source IP, {ips} {} for the target)",
                    if ips == 1 { "IP" } else { "IPs" }
                )
            }
            None => "unknown".into(),
        }),
        fixes: if ports.is_some_and(|p| p < rec_hi - rec_lo + 1) {
            vec![(Target::Sysctl, format!("net.ipv4.ip_local_port_range = {rec_lo} {rec_hi}"))]
        } else {
            Vec::new()
        },
    });

    for (limit, value, what) in [
        ("net.core.somaxconn", r.somaxconn, "none (accept queue per listener: bursts)"),
        ("net.ipv4.tcp_max_syn_backlog", r.tcp_max_syn_backlog, "none (SYN queue per listener: bursts)"),
    ] {
        rows.push(Row {
            limit,
            current: show(value),
            needed: "-".into(),
            bound: Bound::Info(what.into()),
            fixes: if value.is_some_and(|v| v < RECOMMENDED_BACKLOG) {
                vec![(Target::Sysctl, format!("{limit} = {RECOMMENDED_BACKLOG}"))]
            } else {
                Vec::new()
            },
        });
    }

    // The established hash: sized at boot from memory unless `thash_entries=` says otherwise
    // (a network namespace may get its own, `tcp_child_ehash_entries`). Advice only.
    let rec_ehash = target.checked_next_power_of_two().unwrap_or(u64::MAX);
    rows.push(Row {
        limit: "net.ipv4.tcp_ehash_entries",
        current: show(r.tcp_ehash_entries),
        needed: "-".into(),
        bound: Bound::Info(match r.tcp_ehash_entries {
            Some(n) => format!("none ({:.1} sockets per bucket at the target)", target as f64 / n.max(1) as f64),
            None => "none".into(),
        }),
        fixes: if r.tcp_ehash_entries.is_some_and(|n| n < target) {
            vec![(
                Target::Note,
                format!(
                    "TCP established hash: {} buckets for {target} connections; it is sized at boot: add `thash_entries={rec_ehash}` to the kernel command line (twice that with a load generator or proxy on the same box), or run tether in a network namespace made after `sysctl net.ipv4.tcp_child_ehash_entries={rec_ehash}`",
                    show(r.tcp_ehash_entries)
                ),
            )]
        } else {
            Vec::new()
        },
    });

    rows.push(Row {
        limit: "cores",
        current: r.cores.to_string(),
        needed: "-".into(),
        bound: Bound::Info(format!(
            "none ({} connections per core at the target)",
            target.div_ceil(r.cores.max(1) as u64)
        )),
        fixes: Vec::new(),
    });
    rows
}

/// Reads the limits under `opts.proc_root`, prints the table (limit | current | needed for the
/// target | bound on connections), the predicted capacity and, when something falls short, the
/// exact lines to change, to `out`. Returns `Ok(true)` when the capacity reaches `opts.target`.
///
/// Errors: only write errors on `out`; unreadable limits are shown as `unreadable` and do not
/// bound the capacity.
pub fn check_limits(opts: &CheckOptions, out: &mut dyn Write) -> io::Result<bool> {
    let readings = read(&opts.proc_root);
    report(&readings, opts, out)
}

/// [`check_limits`] on readings already taken.
pub fn report(readings: &Readings, opts: &CheckOptions, out: &mut dyn Write) -> io::Result<bool> {
    let rows = rows(readings, opts);
    writeln!(
        out,
        "tether check-limits: target {} connections per process; budget {} B user + {} B kernel per connection",
        opts.target, opts.per_conn_user_bytes, opts.per_conn_kernel_bytes
    )?;
    writeln!(out)?;
    let bound_text = |b: &Bound| match b {
        Bound::Caps(n) => n.to_string(),
        Bound::Info(s) => s.clone(),
    };
    let w0 = rows.iter().map(|r| r.limit.len()).chain([5]).max().unwrap_or(0);
    let w1 = rows.iter().map(|r| r.current.len()).chain([7]).max().unwrap_or(0);
    let w2 = rows.iter().map(|r| r.needed.len()).chain([17]).max().unwrap_or(0);
    writeln!(out, "{:w0$}  {:w1$}  {:w2$}  bound on connections", "limit", "current", "needed for target")?;
    for r in &rows {
        let mark = match (&r.bound, r.fixes.is_empty()) {
            (_, true) => "",
            (Bound::Caps(_), false) => "  <- change",
            (Bound::Info(_), false) => "  <- advised",
        };
        writeln!(out, "{:w0$}  {:w1$}  {:w2$}  {}{mark}", r.limit, r.current, r.needed, bound_text(&r.bound))?;
    }

    let (capacity, by) = rows
        .iter()
        .filter_map(|r| match r.bound {
            Bound::Caps(n) => Some((n, r.limit)),
            Bound::Info(_) => None,
        })
        .min_by_key(|&(n, _)| n)
        .unwrap_or((u64::MAX, "nothing"));
    let reachable = capacity >= opts.target;
    writeln!(out)?;
    writeln!(out, "capacity: {capacity} connections per process (bound by {by})")?;
    writeln!(out, "target {}: {}", opts.target, if reachable { "reachable" } else { "NOT reachable" })?;
    if opts.proc_root == std::path::Path::new("/proc") {
        writeln!(out, "note: nofile is this shell's limit; under systemd the unit's LimitNOFILE applies instead")?;
    }

    let mut fixes: Vec<(Target, String)> = rows.into_iter().flat_map(|r| r.fixes).collect();
    fixes.sort_by_key(|(t, _)| *t);
    fixes.dedup();
    if !fixes.is_empty() {
        writeln!(out)?;
        if reachable {
            writeln!(out, "recommended changes (not required for this target):")?;
        } else {
            writeln!(out, "change these lines:")?;
        }
        let mut last = None;
        for (target, line) in &fixes {
            if last != Some(*target) {
                writeln!(out, "{}", target.header())?;
                last = Some(*target);
            }
            writeln!(out, "{line}")?;
        }
    }
    Ok(reachable)
}
