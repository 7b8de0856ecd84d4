//! What the bench targets share beyond the tests' harness: start the release `tether serve`
//! as a bench wants it ([`serve`]), drive it with `tether load`, sample /proc, print tables,
//! write `target/bench/NAME.json`; what the broker benches read off their Redis
//! ([`redis_figures`]).
//!
//! The server process, the redis-server, the TLS proxies and the bounded waits are the tests'
//! own (tests/common/server.rs, redis.rs, proxy.rs and wait.rs, compiled in here by
//! `#[path]`): one harness, so a fix to how a server is started, waited for or stopped reaches
//! tests and benches alike.
//! `BIN` is the binary cargo builds for benches (`CARGO_BIN_EXE_tether`, same profile and
//! features as the bench).

#![allow(dead_code)]

pub mod floor;
pub mod kernel;
#[path = "../../tests/common/proxy.rs"]
pub mod proxy;
#[path = "../../tests/common/redis.rs"]
pub mod redis;
pub mod redis_figures;
#[path = "../../tests/common/server.rs"]
pub mod server;
#[path = "../../tests/common/wait.rs"]
pub mod wait;

// Not every bench uses every one.
#[allow(unused_imports)]
pub use redis::RedisProc;
#[allow(unused_imports)]
pub use redis_figures::RedisFigures;
#[allow(unused_imports)]
pub use server::{Metrics, Server, BIN};
#[allow(unused_imports)]
pub use wait::{check, eventually, eventually_reaches, eventually_sync, within_sync};

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::Value;

/// How long a bench's server may take to stop on SIGTERM (drain, release its leases) before
/// SIGKILL: on drop, and for an explicit [`Server::stop`].
pub const STOP_GRACE: Duration = Duration::from_secs(15);

/// The private copy of [`BIN`] made by [`pin_binary`], if any.
static PINNED: OnceLock<PathBuf> = OnceLock::new();

/// The `tether` binary this bench runs: [`BIN`], or its private copy after [`pin_binary`].
pub fn bin() -> PathBuf {
    PINNED.get().cloned().unwrap_or_else(|| PathBuf::from(BIN))
}

/// Copies [`BIN`] to `target/bench/NAME.tether` and runs that copy from now on: the target
/// directory may be shared, and a build that replaces `release/tether` in the middle of a run
/// would otherwise change what the later rounds measure.
pub fn pin_binary(name: &str) {
    let copy = bench_file(&format!("{name}.tether"));
    // A stale copy may still be running from an interrupted run: replace it by rename.
    let tmp = bench_file(&format!("{name}.tether.tmp"));
    std::fs::copy(BIN, &tmp).unwrap_or_else(|e| panic!("cannot copy {BIN}: {e}"));
    std::fs::rename(&tmp, &copy).unwrap_or_else(|e| panic!("cannot place {}: {e}", copy.display()));
    // Only the first pin counts; a bench pins once, at its start.
    let _ = PINNED.set(copy);
}

/// `target/` (the directory holding `release/tether`).
pub fn target_dir() -> PathBuf {
    let bin = PathBuf::from(BIN);
    bin.parent().and_then(|p| p.parent()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("target"))
}

/// `target/bench/FILE` (the directory made when missing): where a bench's configs, pinned
/// binary and JSON go.
pub fn bench_file(file: &str) -> PathBuf {
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir).expect("create target/bench");
    dir.join(file)
}

/// Environment variable `name` parsed, or `default`.
pub fn env_or<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// Comma-separated list from environment variable `name`, or `default`.
pub fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// The allocator the binary was built with (`--features mimalloc` or the system one).
pub fn allocator() -> &'static str {
    if cfg!(feature = "mimalloc") {
        "mimalloc"
    } else {
        "system"
    }
}

/// Starts `tether serve --cores CORES` on 127.0.0.1:0 (the tests' [`Server`]) with
/// `config_toml` written to `target/bench/NAME.toml` (kept: it says what ran), `TETHER_LOG=warn`
/// and stderr on the terminal; dropped, it is stopped with SIGTERM (up to [`STOP_GRACE`]).
pub fn serve(name: &str, cores: usize, config_toml: &str) -> Server {
    serve_bin(&bin(), name, cores, config_toml)
}

/// [`serve`] with another `tether` binary (e.g. a build of `main` to compare with).
pub fn serve_bin(bin: &Path, name: &str, cores: usize, config_toml: &str) -> Server {
    let config = bench_file(&format!("{name}.toml"));
    std::fs::write(&config, config_toml).expect("write bench config");
    let (listen, cores) = ("127.0.0.1:0".parse().expect("address"), cores.to_string());
    Server::spawn(bin, &config, listen, &["--cores", &cores], &[("TETHER_LOG", "warn")], None).stop_on_drop(STOP_GRACE)
}

/// The shell command that starts a replacement for `server` (started by [`serve`] as `name`
/// with `cores`) on the same port, for `storm --restart-cmd`.
pub fn restart_cmd(server: &Server, name: &str, cores: usize) -> String {
    format!(
        "TETHER_LOG=warn exec {} serve --listen {} --cores {cores} --config {}",
        bin().display(),
        server.addr,
        bench_file(&format!("{name}.toml")).display()
    )
}

/// Sum of the `tether_connections` gauge samples of `server`; `None` when it did not answer.
pub fn connections(server: &Server) -> Option<u64> {
    server.metric_sync("tether_connections", &[]).map(|v| v as u64)
}

/// Waits until `server`'s connection gauge reads `n`, for at most `limit`; returns the last
/// reading (the bench goes on with what it got and says so).
pub fn wait_connections(server: &Server, n: u64, limit: Duration) -> u64 {
    within_sync(limit, || {
        let got = connections(server).unwrap_or(0);
        check(got == n, || got).map(|()| got)
    })
    .unwrap_or_else(|got| got)
}

/// SIGTERM `child`, wait up to `grace`, then SIGKILL.
pub fn terminate(child: &mut Child, grace: Duration) {
    // SAFETY: kill(2) on a child this bench started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    if within_sync(grace, || check(matches!(child.try_wait(), Ok(Some(_))), || ())).is_err() {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// The arguments of `tether load fanout URL` with `subs` subscribers, `rate` msg/s of `size`
/// bytes for `duration_s` seconds, from the loopback sources 127.0.0.2–127.0.0.254 (callers
/// add their own flags after these).
#[allow(dead_code)] // not every bench runs a fan-out
pub fn fanout_args(url: String, subs: usize, rate: f64, size: usize, duration_s: f64) -> Vec<String> {
    let mut args = vec!["fanout".to_string(), url];
    for (k, v) in [
        ("--subs", subs.to_string()),
        ("--rate", rate.to_string()),
        ("--size", size.to_string()),
        ("--duration", format!("{duration_s}s")),
        ("--sources", "127.0.0.2-127.0.0.254".to_string()),
    ] {
        args.extend([k.to_string(), v]);
    }
    args
}

/// Starts `tether load ARGS` with stdout piped (the report) and stderr inherited (the table).
pub fn spawn_load(args: &[String]) -> Child {
    server::spawn_load_with(&bin(), args)
}

/// Waits for a `tether load` child and returns its final JSON line (`null` if none).
pub fn finish_load(mut child: Child) -> Value {
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    let _ = child.wait();
    out.lines().rev().find_map(|l| serde_json::from_str(l).ok()).unwrap_or(Value::Null)
}

/// Ends a `tether load` child that holds connections (SIGTERM: it ends its hold and
/// reports) and returns its final JSON line.
pub fn stop_load(child: Child) -> Value {
    // SAFETY: kill(2) on a child this bench started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    finish_load(child)
}

/// Runs `tether load ARGS` to completion; returns its report.
pub fn load(args: &[String]) -> Value {
    eprintln!("$ tether load {}", args.join(" "));
    finish_load(spawn_load(args))
}

/// `VmRSS` of `pid` in bytes (from /proc/PID/status).
pub fn rss_bytes(pid: i32) -> u64 {
    proc_kb(&format!("/proc/{pid}/status"), "VmRSS:") * 1024
}

/// `Slab:` of /proc/meminfo in bytes (kernel slab caches, system-wide).
pub fn slab_bytes() -> u64 {
    proc_kb("/proc/meminfo", "Slab:") * 1024
}

fn proc_kb(path: &str, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// CPU time (user + system, all threads) that process `pid` has used, in seconds, from
/// /proc/PID/stat; `None` when the process is gone.
pub fn cpu_seconds(pid: i32) -> Option<f64> {
    stat_cpu_seconds(&PathBuf::from(format!("/proc/{pid}/stat")))
}

/// CPU time (user + system) from a `stat` file (`/proc/PID/stat`, or a thread's
/// `/proc/PID/task/TID/stat`), in seconds: fields 14 and 15 (utime, stime) in clock ticks of
/// `sysconf(_SC_CLK_TCK)`; `None` when it cannot be read.
pub fn stat_cpu_seconds(path: &Path) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may contain spaces; the fields after it are plain.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3, so utime (14) and stime (15) are at 11 and 12.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks as f64 / if hz > 0 { hz as f64 } else { 100.0 })
}

/// CPU time of every thread of `pid` in seconds, to the nanosecond: the sum of the first field
/// of `/proc/PID/task/TID/schedstat` (time on a CPU); finer than [`cpu_seconds`], whose 10 ms
/// clock ticks are too coarse for an idle process. `None` when the process is gone.
pub fn cpu_seconds_fine(pid: i32) -> Option<f64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Some(ns as f64 / 1e9)
}

/// Time a task spent runnable but waiting for a CPU, in seconds, from a `schedstat` file
/// (`/proc/PID/schedstat` for the main thread, `/proc/PID/task/TID/schedstat`): its second
/// field, in nanoseconds. On a shared box this says how much of a process's slowness is
/// waiting for a core rather than work.
pub fn schedstat_wait_seconds(path: &Path) -> Option<f64> {
    let s = std::fs::read_to_string(path).ok()?;
    Some(s.split_whitespace().nth(1)?.parse::<u64>().ok()? as f64 / 1e9)
}

/// Seconds read from a /proc file: CPU time from a `stat`, run-queue wait from a `schedstat`.
pub fn proc_seconds(path: &Path) -> Option<f64> {
    if path.file_name().is_some_and(|n| n == "schedstat") {
        schedstat_wait_seconds(path)
    } else {
        stat_cpu_seconds(path)
    }
}

/// The files named `file` (`stat`, `schedstat`) of the threads of `pid` whose name (`comm`)
/// starts with `prefix`, e.g. `tether-core-` or `tether-broker`.
pub fn thread_files(pid: i32, prefix: &str, file: &str) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    dir.filter_map(Result::ok)
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix)))
        .map(|t| t.path().join(file))
        .collect()
}

/// `n` loopback TCP connection pairs for the benches of one path alone (`send_path`,
/// `recv_path`): the connecting ends (blocking, `TCP_NODELAY`) and the accepted ends
/// (non-blocking, as the server's). Panics when a connect or accept fails.
pub fn loopback_pairs(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = l.local_addr().expect("listener address");
    let (mut connected, mut accepted) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let a = TcpStream::connect(addr).expect("connect");
        let (b, _) = l.accept().expect("accept");
        b.set_nonblocking(true).expect("non-blocking");
        a.set_nodelay(true).expect("TCP_NODELAY");
        connected.push(a);
        accepted.push(b);
    }
    (connected, accepted)
}

/// The calling thread's CPU time, nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Pins the calling thread to `cpu` (`sched_setaffinity`); panics naming the CPU when refused.
pub fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes bit `cpu` (below CPU_SETSIZE) of it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is valid for its size; 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        panic!("cannot pin a thread to CPU {cpu}: {}", std::io::Error::last_os_error());
    }
}

/// The 1-minute load average (what else the shared box was doing).
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap_or(0.0)
}

/// Nanoseconds since the UNIX epoch (the clock of the `start_ns` / `end_ns` of load reports).
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Samples several targets every `every` on a thread of its own, each the sum of some /proc
/// files read by [`proc_seconds`] (CPU of a process or of a group of its threads, or their
/// run-queue wait), so that what was used over an interval known only afterwards (a load
/// report's `start_ns` … `end_ns`) can be read off by interpolation. A file that can no longer
/// be read (the process exited) keeps its last value.
pub struct ProcSampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(u64, Vec<f64>)>>,
}

impl ProcSampler {
    /// Starts sampling `targets` (each a list of /proc `stat` or `schedstat` files, summed)
    /// every `every`.
    pub fn start(targets: Vec<Vec<PathBuf>>, every: Duration) -> ProcSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut last: Vec<Vec<f64>> = targets.iter().map(|paths| vec![f64::NAN; paths.len()]).collect();
            loop {
                let done = flag.load(Ordering::Relaxed);
                let values = targets
                    .iter()
                    .zip(&mut last)
                    .map(|(paths, last)| {
                        let mut sum = 0.0;
                        for (p, l) in paths.iter().zip(last.iter_mut()) {
                            if let Some(v) = proc_seconds(p) {
                                *l = v;
                            }
                            sum += *l;
                        }
                        sum
                    })
                    .collect();
                samples.push((unix_ns(), values));
                if done {
                    return samples;
                }
                std::thread::sleep(every);
            }
        });
        ProcSampler { stop, handle }
    }

    /// Takes a last sample and returns them all.
    pub fn finish(self) -> ProcTrace {
        self.stop.store(true, Ordering::Relaxed);
        ProcTrace(self.handle.join().unwrap_or_default())
    }
}

/// What a [`ProcSampler`] saw: `(unix ns, seconds per target)`, in time order.
pub struct ProcTrace(pub Vec<(u64, Vec<f64>)>);

impl ProcTrace {
    /// Seconds of target `i` at `ns`, interpolated between the samples around it (NaN
    /// outside the sampled span).
    pub fn at(&self, i: usize, ns: u64) -> f64 {
        let s = &self.0;
        let Some(after) = s.iter().position(|(t, _)| *t >= ns) else { return f64::NAN };
        if after == 0 {
            return if s[0].0 == ns { s[0].1[i] } else { f64::NAN };
        }
        let ((t0, a), (t1, b)) = (&s[after - 1], &s[after]);
        let f = if t1 > t0 { (ns - t0) as f64 / (t1 - t0) as f64 } else { 1.0 };
        a[i] + (b[i] - a[i]) * f
    }

    /// Seconds of target `i` per second from `from_ns` to `to_ns`, in percent (CPU: % of one
    /// core). The interval is clamped to the sampled span (a load process may end before the
    /// nominal end of its interval).
    pub fn pct(&self, i: usize, from_ns: u64, to_ns: u64) -> f64 {
        let (Some(first), Some(last)) = (self.0.first(), self.0.last()) else { return f64::NAN };
        let (from_ns, to_ns) = (from_ns.max(first.0), to_ns.min(last.0));
        let secs = to_ns.saturating_sub(from_ns) as f64 / 1e9;
        (self.at(i, to_ns) - self.at(i, from_ns)) / secs * 100.0
    }
}

/// Median of `values` (NaN when empty); the mean of the middle two for an even count.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Least-squares slope of y over x.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// Theil–Sen slope (median of pairwise slopes): robust to one disturbed sample, e.g. slab
/// growth from another process on the box.
pub fn median_slope(points: &[(f64, f64)]) -> f64 {
    let mut slopes = Vec::new();
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            if b.0 != a.0 {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    if slopes.is_empty() {
        return 0.0;
    }
    slopes.sort_by(f64::total_cmp);
    slopes[slopes.len() / 2]
}

/// A number field of a report (0 when absent).
pub fn num(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// Prints a table with `headers` to stdout.
pub fn table(title: &str, headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.len());
            }
        }
    }
    println!("\n{title}");
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:>w$}", w = widths[i])).collect();
        println!("  {}", parts.join("  "));
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Writes `value` to `target/bench/NAME.json` and says where.
pub fn write_json(name: &str, value: &Value) {
    let path = bench_file(&format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(value).expect("JSON")).expect("write bench JSON");
    println!("\nwrote {}", path.display());
}

/// `cargo bench` passes `--bench` (and maybe a filter); a bench given `--list` or run by
/// `cargo test --benches` only checks that it starts.
pub fn should_run() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--list") && args.iter().any(|a| a == "--bench")
}

/// One table cell from a load report: numbers as printed, objects as `k:v,…`, else `-`.
pub fn cell(r: &Value, k: &str) -> String {
    match r.get(k) {
        Some(Value::Number(x)) => x.to_string(),
        Some(Value::Object(o)) => o.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(","),
        _ => "-".into(),
    }
}

/// One connection-auth setting a bench compares (docs/security.md): the server's `[auth]`
/// section and the token its clients carry as `?token=`.
pub struct AuthVariant {
    /// `none`, `hs256`, `rs256`, `es256` or `eddsa`.
    pub name: String,
    /// The `[auth]` section (empty for `none`).
    pub config: String,
    /// The token, valid for a day, allowing `sub` on `subs` (None for `none`).
    pub token: Option<String>,
}

impl AuthVariant {
    /// `url` with the token as `?token=` (unchanged for `none`).
    pub fn url(&self, url: &str) -> String {
        match &self.token {
            Some(t) => format!("{url}?token={t}"),
            None => url.to_string(),
        }
    }
}

/// The variants named in env `name` (comma-separated, default `default`), with tokens allowing
/// `sub` on the globs `subs`. Keys: the committed test keys (tests/keys/).
pub fn auth_variants(name: &str, default: &str, subs: &[&str]) -> Vec<AuthVariant> {
    use tether::auth::mint::{ChannelGlobs, Signer, TokenClaims};
    let keys = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/keys");
    let secret = "bench-secret-0123456789abcdef-0123456789";
    let list = std::env::var(name).unwrap_or_else(|_| default.to_string());
    list.split(',')
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
        .map(|v| {
            let (config, signer) = match v.as_str() {
                "none" => return AuthVariant { name: v, config: String::new(), token: None },
                "hs256" => (format!("[auth]\njwt_hs256_secret = \"{secret}\"\n"), Signer::hs256(secret)),
                "rs256" | "es256" | "eddsa" => {
                    let stem = if v == "eddsa" { "ed25519" } else { v.as_str() };
                    let public = keys.join(format!("{stem}.pub.pem")).display().to_string();
                    let config = format!("[auth]\njwt_public_key_file = {public:?}\n");
                    (config, Signer::from_pem_file(&keys.join(format!("{stem}.key.pem"))))
                }
                other => panic!("{name}: unknown auth variant {other:?} (none, hs256, rs256, es256, eddsa)"),
            };
            let exp = tether::auth::unix_now_ms() / 1000 + 86_400;
            let mut claims = TokenClaims::new("bench", exp);
            claims.channels = ChannelGlobs { sub: subs.iter().map(|s| s.to_string()).collect(), publish: Vec::new() };
            let token = signer.and_then(|s| s.sign(&claims)).unwrap_or_else(|e| panic!("{name}: {v}: {e}"));
            AuthVariant { name: v, config, token: Some(token) }
        })
        .collect()
}

/// The knobs of a bench that compares two kinds of subscriber in fan-outs (benches/sse.rs,
/// benches/deflate.rs), read from `{PREFIX}_SUBS` (10000), `_RATE` (messages/s, 10), `_SIZE`
/// (bytes of `data`, the caller's default), `_DURATION` (seconds of publishing, 10), `_CORES`
/// (2) and `_ROUNDS` (3).
pub struct FanoutKnobs {
    pub subs: usize,
    pub rate: f64,
    pub size: usize,
    pub duration: f64,
    pub cores: usize,
    pub rounds: usize,
}

impl FanoutKnobs {
    /// Reads the knobs (see the type) with `size` as the default `{PREFIX}_SIZE`.
    pub fn read(prefix: &str, size: usize) -> FanoutKnobs {
        let knob = |name: &str| format!("{prefix}_{name}");
        FanoutKnobs {
            subs: env_or(&knob("SUBS"), 10000),
            rate: env_or(&knob("RATE"), 10.0),
            size: env_or(&knob("SIZE"), size),
            duration: env_or(&knob("DURATION"), 10.0),
            cores: env_or(&knob("CORES"), 2),
            rounds: env_or(&knob("ROUNDS"), 3),
        }
    }

    /// `tether load fanout` against `url` with these knobs ([`fanout_args`]).
    pub fn args(&self, url: String) -> Vec<String> {
        fanout_args(url, self.subs, self.rate, self.size, self.duration)
    }
}

/// Runs `tether load ARGS` (a fan-out) while sampling the CPU of process `pid` every 20 ms;
/// returns the report, the process's CPU seconds over the report's measured window
/// (`start_ns` … `end_ns`) and the deliveries in that window.
pub fn load_with_cpu(pid: i32, args: &[String]) -> (Value, f64, f64) {
    let stat = vec![PathBuf::from(format!("/proc/{pid}/stat"))];
    let sampler = ProcSampler::start(vec![stat], Duration::from_millis(20));
    let r = load(args);
    let trace = sampler.finish();
    let (from, to) = (num(&r, "start_ns") as u64, num(&r, "end_ns") as u64);
    let delivered = num(&r, "deliveries_per_s") * to.saturating_sub(from) as f64 / 1e9;
    let cpu_s = trace.at(0, to) - trace.at(0, from);
    (r, cpu_s, delivered)
}
