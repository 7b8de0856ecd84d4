//! A real `tether serve` process for the integration tests and the benches: started on a
//! listen address of the caller's (port 0 picks a free one), waited for (bounded) until it
//! prints `tether listening on ADDR`, stopped by its PID; its `/metrics` read with a blocking
//! scrape ([`Server::scrape`]) and summed by [`Metrics`].
//!
//! One copy for both: benches/common includes this file (and `wait.rs`, the one module it
//! names) with `#[path]`, so it names nothing else of tests/common. The async helpers that need
//! the tests' HTTP client (`metrics`, `wait_metric`, `publish`, …) are in tests/common/mod.rs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::wait::within_sync;

/// The `tether` binary cargo built for this test or bench target (same profile and features).
pub const BIN: &str = env!("CARGO_BIN_EXE_tether");

/// How long a started server may take to print its listening line.
const LISTEN_LIMIT: Duration = Duration::from_secs(15);

/// Bound of one blocking `/metrics` scrape (connect, request, whole answer).
const SCRAPE_LIMIT: Duration = Duration::from_secs(5);

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Starts `bin load ARGS` (a `tether load` run) with `TETHER_LOG=warn`, stdout piped (its
/// final JSON line) and stderr inherited (its table).
pub fn spawn_load_with(bin: &Path, args: &[String]) -> Child {
    Command::new(bin)
        .arg("load")
        .args(args)
        .env("TETHER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {} load: {e}", bin.display()))
}

/// A `tether serve` child process. Dropping it SIGKILLs the process if it still runs (or, after
/// [`Server::stop_on_drop`], stops it with SIGTERM first) and removes the files the harness
/// wrote for it; if the thread is panicking, the tail of the server log is printed.
pub struct Server {
    child: Child,
    /// The address it listens on, as it printed it.
    pub addr: SocketAddr,
    /// Its process id.
    pub pid: i32,
    /// The file its stderr goes to; `None` when it is inherited (a bench's terminal).
    log_path: Option<PathBuf>,
    /// Files written for this server alone (a temporary config and log), removed on drop.
    scratch: Vec<PathBuf>,
    /// On drop: SIGKILL at once (`None`), or SIGTERM and this long to exit before SIGKILL.
    drop_grace: Option<Duration>,
    exited: Option<ExitStatus>,
}

impl Server {
    /// Starts `tether serve --listen 127.0.0.1:0 --config <tmp file with config_toml> <extra>`
    /// and waits (bounded) for the `tether listening on ADDR` line.
    pub fn start(config_toml: &str, extra: &[&str]) -> Server {
        Server::start_at(config_toml, "127.0.0.1:0".parse().expect("address"), extra)
    }

    /// Like [`Server::start`] but listening on `listen` (e.g. `127.0.0.1:PORT` to restart a
    /// server on the port a previous one used; the server binds with `SO_REUSEADDR`).
    pub fn start_at(config_toml: &str, listen: SocketAddr, extra: &[&str]) -> Server {
        Server::start_with_env(config_toml, listen, extra, &[])
    }

    /// Like [`Server::start_at`] with extra environment variables for the server process
    /// (e.g. `TETHER_LOG=debug`). The config and the log are temporary files, removed on drop;
    /// `TETHER_LOG` is the test's own, else `info`.
    pub fn start_with_env(config_toml: &str, listen: SocketAddr, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = std::env::temp_dir().join(format!("tether-it-{}-{n}", std::process::id()));
        let (config, log) = (base.with_extension("toml"), base.with_extension("log"));
        std::fs::write(&config, config_toml).expect("write config");
        let level = std::env::var("TETHER_LOG").unwrap_or_else(|_| "info".into());
        let env: Vec<(&str, &str)> =
            std::iter::once(("TETHER_LOG", level.as_str())).chain(env.iter().copied()).collect();
        let mut srv = Server::spawn(Path::new(BIN), &config, listen, extra, &env, Some(log.clone()));
        srv.scratch = vec![config, log];
        srv
    }

    /// Starts `bin serve --listen LISTEN --config CONFIG EXTRA…` with `env` added to the
    /// environment and stderr appended to `log` (inherited when `None`), and waits up to 15 s for
    /// its `tether listening on ADDR` line (stdout is drained after it, so the server never
    /// blocks on a full pipe). Panics with the log's tail when the line does not come.
    pub fn spawn(
        bin: &Path,
        config: &Path,
        listen: SocketAddr,
        extra: &[&str],
        env: &[(&str, &str)],
        log: Option<PathBuf>,
    ) -> Server {
        let stderr = match &log {
            Some(path) => Stdio::from(std::fs::File::create(path).expect("create the server log")),
            None => Stdio::inherit(),
        };
        let mut child = Command::new(bin)
            .args(["serve", "--listen", &listen.to_string(), "--config"])
            .arg(config)
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let pid = child.id() as i32;
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the child never blocks on a full pipe.
            let mut sink = Vec::new();
            let _ = r.read_to_end(&mut sink);
        });
        let mut srv =
            Server { child, addr: listen, pid, log_path: log, scratch: Vec::new(), drop_grace: None, exited: None };
        let line = rx.recv_timeout(LISTEN_LIMIT).unwrap_or_default();
        match line.trim().strip_prefix("tether listening on ").and_then(|a| a.parse().ok()) {
            Some(addr) => srv.addr = addr,
            None => {
                panic!("no listening line on {listen} within {LISTEN_LIMIT:?} (got {line:?})\n{}", srv.log_tail(40))
            }
        }
        srv
    }

    /// This server, stopped on drop with SIGTERM and up to `grace` to exit (a drain, leases
    /// released) before SIGKILL, instead of SIGKILL at once.
    pub fn stop_on_drop(mut self, grace: Duration) -> Server {
        self.drop_grace = Some(grace);
        self
    }

    /// `ws://ADDR/ws`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    /// The server's whole stderr log, as bytes (whatever they are; empty when inherited).
    pub fn log_bytes(&self) -> Vec<u8> {
        self.log_path.as_ref().and_then(|p| std::fs::read(p).ok()).unwrap_or_default()
    }

    /// The last `n` lines of the server's stderr log (empty when inherited).
    pub fn log_tail(&self, n: usize) -> String {
        let text = String::from_utf8_lossy(&self.log_bytes()).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Sends `sig` (e.g. `libc::SIGTERM`) to the server.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.pid, sig);
        }
    }

    /// Waits up to `limit` for the process to exit and returns its status (None: still running).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        if let Some(st) = self.exited {
            return Some(st);
        }
        let st = within_sync(limit, || match self.child.try_wait() {
            Ok(Some(st)) => Ok(st),
            _ => Err(()),
        })
        .ok()?;
        self.exited = Some(st);
        Some(st)
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL; returns how it exited.
    pub fn stop(&mut self, grace: Duration) -> ExitStatus {
        if self.exited.is_none() {
            self.signal(libc::SIGTERM);
        }
        if let Some(st) = self.wait_exit(grace) {
            return st;
        }
        self.signal(libc::SIGKILL);
        let st = self.child.wait().expect("reap tether serve");
        self.exited = Some(st);
        st
    }

    /// Server resident set size in KiB (`VmRSS` from /proc/PID/status).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Number of open file descriptors of the server (/proc/PID/fd).
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).map(|d| d.count()).unwrap_or(0)
    }

    /// `GET /metrics` over a fresh blocking connection, bounded by 5 s: `None` when the server
    /// did not answer 200 in time (a bench reads on; a test asserts).
    pub fn scrape(&self) -> Option<Metrics> {
        let mut s = TcpStream::connect_timeout(&self.addr, SCRAPE_LIMIT).ok()?;
        s.set_read_timeout(Some(SCRAPE_LIMIT)).ok()?;
        s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.addr).as_bytes())
            .ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200 ").then(|| Metrics(body.to_owned()))
    }

    /// Sum of the samples of `name` whose labels contain every `label="value"` in `labels`,
    /// from a blocking [`Server::scrape`]; `None` when the server did not answer.
    pub fn metric_sync(&self, name: &str, labels: &[&str]) -> Option<f64> {
        self.scrape().map(|m| m.sum(name, labels))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.exited.is_none() && !matches!(self.child.try_wait(), Ok(Some(_))) {
            match self.drop_grace {
                Some(grace) => {
                    self.stop(grace);
                }
                None => {
                    self.signal(libc::SIGKILL);
                    let _ = self.child.wait();
                }
            }
        }
        if std::thread::panicking() {
            eprintln!("---- tether log tail ----\n{}", self.log_tail(60));
        }
        for file in &self.scratch {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// One scrape of `/metrics` (the Prometheus text format).
pub struct Metrics(pub String);

impl Metrics {
    /// Sum of the samples of `name` whose labels contain every `label="value"` in `labels`.
    pub fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.samples(name).filter(|(l, _)| labels.iter().all(|want| l.contains(want))).map(|(_, v)| v).sum()
    }

    /// Every `(labels, value)` sample of `name`.
    pub fn samples<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
        self.0.lines().filter(|l| !l.starts_with('#')).filter_map(move |l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = if let Some(r) = rest.strip_prefix('{') {
                let close = r.find('}')?;
                (&r[..close], r[close + 1..].trim())
            } else if rest.starts_with(' ') {
                ("", rest.trim())
            } else {
                return None;
            };
            Some((labels, value.parse().ok()?))
        })
    }
}
