//! Reading the limits that bound connection capacity from procfs.
//!
//! Every path is taken under a root (normally `/proc`) so tests can point at a fake tree.
//! A missing or unparsable file gives `None`: containers often hide parts of `/proc/sys`, and
//! an unknown limit is reported as such rather than failing the whole check.

use std::path::Path;

/// The values `tether check-limits` reads. Counts are plain numbers; `unlimited` in
/// `/proc/self/limits` reads as `u64::MAX`; memory is in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Readings {
    /// `RLIMIT_NOFILE` soft limit ("Max open files" in `self/limits`).
    pub nofile_soft: Option<u64>,
    /// `RLIMIT_NOFILE` hard limit; `tether serve` raises its soft limit to this at start.
    pub nofile_hard: Option<u64>,
    /// `fs.file-max` (`sys/fs/file-max`): system-wide open file limit.
    pub file_max: Option<u64>,
    /// File handles allocated right now (first field of `sys/fs/file-nr`), taken from the
    /// system-wide budget before tether opens any.
    pub file_allocated: Option<u64>,
    /// `fs.nr_open` (`sys/fs/nr_open`): ceiling for any process's nofile hard limit.
    pub nr_open: Option<u64>,
    /// `net.ipv4.ip_local_port_range` as (first, last), inclusive.
    pub port_range: Option<(u64, u64)>,
    /// `net.core.somaxconn`: cap on every listener's accept queue.
    pub somaxconn: Option<u64>,
    /// `net.ipv4.tcp_max_syn_backlog`: half-open connections per listener.
    pub tcp_max_syn_backlog: Option<u64>,
    /// `net.ipv4.tcp_ehash_entries` (Linux 6.1+): buckets of the TCP established hash the
    /// current network namespace uses, which every received segment is looked up in. The
    /// kernel writes a namespace that shares the initial namespace's table as a negative
    /// number; this is its magnitude either way.
    pub tcp_ehash_entries: Option<u64>,
    /// `MemTotal` from `meminfo`, bytes.
    pub mem_total: Option<u64>,
    /// `MemAvailable` from `meminfo`, bytes.
    pub mem_available: Option<u64>,
    /// CPUs: under the real `/proc`, `available_parallelism()` (it honours affinity and cgroup
    /// quotas, which `cpuinfo` does not); under any other root, the `processor` lines of its
    /// `cpuinfo` when present, else `available_parallelism()`.
    pub cores: usize,
}

/// Reads every limit under `proc_root` (normally `/proc`).
pub fn read(proc_root: &Path) -> Readings {
    let file = |rel: &str| std::fs::read_to_string(proc_root.join(rel)).ok();
    let number = |rel: &str| file(rel).and_then(|s| first_u64(&s));
    let (nofile_soft, nofile_hard) =
        file("self/limits").and_then(|s| parse_nofile(&s)).map_or((None, None), |(s, h)| (Some(s), Some(h)));
    let meminfo = file("meminfo").unwrap_or_default();
    Readings {
        nofile_soft,
        nofile_hard,
        file_max: number("sys/fs/file-max"),
        file_allocated: number("sys/fs/file-nr"),
        nr_open: number("sys/fs/nr_open"),
        port_range: file("sys/net/ipv4/ip_local_port_range").and_then(|s| parse_pair(&s)),
        somaxconn: number("sys/net/core/somaxconn"),
        tcp_max_syn_backlog: number("sys/net/ipv4/tcp_max_syn_backlog"),
        tcp_ehash_entries: file("sys/net/ipv4/tcp_ehash_entries")
            .and_then(|s| s.split_whitespace().next()?.parse::<i64>().ok())
            .map(i64::unsigned_abs),
        mem_total: meminfo_bytes(&meminfo, "MemTotal"),
        mem_available: meminfo_bytes(&meminfo, "MemAvailable"),
        cores: cores(proc_root),
    }
}

fn cores(proc_root: &Path) -> usize {
    let parallelism = || std::thread::available_parallelism().map_or(1, |n| n.get());
    if proc_root == Path::new("/proc") {
        return parallelism();
    }
    match std::fs::read_to_string(proc_root.join("cpuinfo")) {
        Ok(s) => {
            let n = s.lines().filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor")).count();
            if n == 0 {
                parallelism()
            } else {
                n
            }
        }
        Err(_) => parallelism(),
    }
}

/// First whitespace-separated field as a number (`file-max`, `file-nr`, `somaxconn` …).
fn first_u64(s: &str) -> Option<u64> {
    s.split_whitespace().next()?.parse().ok()
}

/// Two numbers, e.g. `32768\t60999` from `ip_local_port_range`.
fn parse_pair(s: &str) -> Option<(u64, u64)> {
    let mut it = s.split_whitespace().map(|f| f.parse::<u64>());
    match (it.next(), it.next()) {
        (Some(Ok(a)), Some(Ok(b))) => Some((a, b)),
        _ => None,
    }
}

/// A limit value from `/proc/<pid>/limits`: a number or `unlimited`.
fn limit_value(s: &str) -> Option<u64> {
    if s == "unlimited" {
        Some(u64::MAX)
    } else {
        s.parse().ok()
    }
}

/// Soft and hard `RLIMIT_NOFILE` from the text of `/proc/<pid>/limits`, whose rows look like
/// `Max open files            1024                 1048576              files     `
/// (the name itself contains spaces, so the values are the two fields after it).
pub fn parse_nofile(limits: &str) -> Option<(u64, u64)> {
    let rest = limits.lines().find_map(|l| l.strip_prefix("Max open files"))?;
    let mut fields = rest.split_whitespace();
    let soft = limit_value(fields.next()?)?;
    let hard = limit_value(fields.next()?)?;
    Some((soft, hard))
}

/// A `meminfo` field in bytes (`MemTotal:       16318412 kB`).
pub fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.split(':').next() == Some(field))?;
    let mut parts = line.split(':').nth(1)?.split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    Some(match parts.next() {
        Some("kB") => n.saturating_mul(1024),
        _ => n,
    })
}
