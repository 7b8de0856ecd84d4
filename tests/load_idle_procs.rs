//! `tether load idle --procs 2` holds 30,000 connections against two server processes on two
//! ports, with no errors (issue 5, Tests). A bounded behaviour test, not a benchmark: the hold
//! is short and the whole run has a deadline. `LOAD_IDLE_CONNS` lowers the count on small boxes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tether");

/// A `tether serve` child, killed on drop.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `tether serve` on a free port; returns it and the `ws://…/ws` URL.
fn serve() -> (Serve, String) {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--cores", "1"])
        .env("TETHER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("tether serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().rsplit(' ').next().unwrap().to_string();
    assert!(line.starts_with("tether listening on"), "unexpected first line {line:?}");
    (Serve(child), format!("ws://{addr}/ws"))
}

#[test]
fn idle_with_two_procs_holds_30000_connections_on_two_servers() {
    let conns: usize = std::env::var("LOAD_IDLE_CONNS").ok().and_then(|v| v.parse().ok()).unwrap_or(30_000);
    let (_a, url_a) = serve();
    let (_b, url_b) = serve();
    let started = Instant::now();
    let mut load = Command::new(BIN)
        .args(["load", "idle", &url_a, &url_b, "--conns", &conns.to_string(), "--procs", "2"])
        .args(["--channels", "10", "--hold", "2s", "--sources", "127.0.0.2-127.0.0.254"])
        .env("TETHER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("tether load starts");
    let out = load.stdout.take().unwrap();
    let deadline = Duration::from_secs(120);
    let watchdog_pid = load.id();
    let watchdog = std::thread::spawn(move || {
        let step = Duration::from_millis(200);
        let mut waited = Duration::ZERO;
        while waited < deadline {
            std::thread::sleep(step);
            waited += step;
            // SAFETY: kill(pid, 0) only probes whether our child is still there.
            if unsafe { libc::kill(watchdog_pid as i32, 0) } != 0 {
                return;
            }
        }
        // SAFETY: SIGTERM to the load process this test started; it then reports and exits.
        unsafe {
            libc::kill(watchdog_pid as i32, libc::SIGTERM);
        }
    });
    let last = BufReader::new(out).lines().map_while(Result::ok).last().unwrap_or_default();
    let status = load.wait().unwrap();
    let _ = watchdog.join();
    let report: serde_json::Value = serde_json::from_str(&last).unwrap_or_else(|e| panic!("report {last:?}: {e}"));
    assert_eq!(report["scenario"], "idle");
    assert_eq!(report["procs"], 2, "{report}");
    assert_eq!(report["connections"], conns as u64, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert!(status.success(), "exit {status:?}: {report}");
    assert!(started.elapsed() < deadline, "took {:?}", started.elapsed());
}
