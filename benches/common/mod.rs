//! Shared plumbing of the bench targets: start the release `tether serve` (the binary cargo
//! builds for benches, `CARGO_BIN_EXE_tether`, same profile and features as the bench), drive
//! it with `tether load`, sample /proc, print tables, write `target/bench/NAME.json`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `tether` binary built by `cargo bench` (release profile, the bench's features).
pub const BIN: &str = env!("CARGO_BIN_EXE_tether");

/// `target/` (the directory holding `release/tether`).
pub fn target_dir() -> PathBuf {
    let bin = PathBuf::from(BIN);
    bin.parent().and_then(|p| p.parent()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("target"))
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

/// A running `tether serve`; SIGTERM then SIGKILL on drop.
pub struct Serve {
    pub child: Option<Child>,
    pub pid: i32,
    pub port: u16,
    pub config: PathBuf,
    pub cores: usize,
}

impl Serve {
    /// Starts `tether serve --listen 127.0.0.1:PORT --cores CORES --config F` (port 0 = free
    /// one) with `config_toml` written to `target/bench/NAME.toml`.
    pub fn start(name: &str, cores: usize, port: u16, config_toml: &str) -> Serve {
        let dir = target_dir().join("bench");
        std::fs::create_dir_all(&dir).expect("create target/bench");
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, config_toml).expect("write bench config");
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--cores", &cores.to_string()])
            .arg("--config")
            .arg(&config)
            .env("TETHER_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut line).expect("read listen line");
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line from tether serve: {line:?}"));
        let pid = child.id() as i32;
        Serve { child: Some(child), pid, port, config, cores }
    }

    /// `ws://127.0.0.1:PORT/ws`.
    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/ws", self.port)
    }

    /// The shell command that starts a replacement on the same port (for `storm --restart-cmd`).
    pub fn restart_cmd(&self) -> String {
        format!(
            "TETHER_LOG=warn exec {BIN} serve --listen 127.0.0.1:{} --cores {} --config {}",
            self.port,
            self.cores,
            self.config.display()
        )
    }

    /// Sum of the `tether_connections` gauge samples from `GET /metrics`.
    pub fn connections(&self) -> Option<u64> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        let sum = body
            .lines()
            .filter(|l| l.starts_with("tether_connections"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        Some(sum as u64)
    }

    /// Waits until the gauge reads `n` (or `limit` passes); returns the last reading.
    pub fn wait_connections(&self, n: u64, limit: Duration) -> u64 {
        let start = Instant::now();
        loop {
            let got = self.connections().unwrap_or(0);
            if got == n || start.elapsed() > limit {
                return got;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, then wait up to 15 s, then SIGKILL.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, Duration::from_secs(15));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.stop();
    }
}

/// SIGTERM `child`, wait up to `grace`, then SIGKILL.
pub fn terminate(child: &mut Child, grace: Duration) {
    // SAFETY: kill(2) on a child this bench started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Starts `tether load ARGS` with stdout piped (the report) and stderr inherited (the table).
pub fn spawn_load(args: &[String]) -> Child {
    Command::new(BIN)
        .arg("load")
        .args(args)
        .env("TETHER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {BIN} load: {e}"))
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
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir).expect("create target/bench");
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(value).expect("JSON")).expect("write bench JSON");
    println!("\nwrote {}", path.display());
}

/// `cargo bench` passes `--bench` (and maybe a filter); a bench given `--list` or run by
/// `cargo test --benches` only checks that it starts.
pub fn should_run() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--list") && args.iter().any(|a| a == "--bench")
}
