//! The clock is tickless (docs/architecture.md, the clock): an idle core sleeps until its next
//! deadline instead of waking every 10 ms, and a deadline filed while it sleeps still fires on
//! time. Checked as behaviour, not timing: the context switches of the core threads
//! (`/proc/PID/task/TID/status`) over a quiet window, against the ~200 per second-pair a
//! 10 ms tick costs, with a generous bound.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::AsyncReadExt;

/// Quiet window over which the core threads' context switches are counted.
const WINDOW: Duration = Duration::from_secs(2);
/// Most context switches one core thread may make in [`WINDOW`] when idle. A 10 ms tick makes
/// about 200; a tickless idle core makes close to none (the bound leaves room for a stray
/// wake-up, a sweep, a scrape of `/metrics` answered by that core).
const MAX_SWITCHES: u64 = 20;

/// Context switches (voluntary + involuntary) of each `tether-core-N` thread of `pid`, by name.
fn core_switches(pid: i32) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("read /proc/PID/task");
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let name = comm.trim();
        if !name.starts_with("tether-core-") {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let n: u64 = status
            .lines()
            .filter(|l| l.starts_with("voluntary_ctxt_switches:") || l.starts_with("nonvoluntary_ctxt_switches:"))
            .filter_map(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
            .sum();
        out.push((name.to_owned(), n));
    }
    out.sort();
    out
}

/// Counts each core thread's context switches over [`WINDOW`] and checks the bound.
async fn assert_cores_sleep(srv: &Server, what: &str) {
    let before = core_switches(srv.pid);
    assert_eq!(before.len(), 2, "expected 2 core threads, saw {before:?}");
    tokio::time::sleep(WINDOW).await;
    let after = core_switches(srv.pid);
    let deltas: Vec<(String, u64)> =
        before.iter().zip(&after).map(|((name, b), (_, a))| (name.clone(), a.saturating_sub(*b))).collect();
    for (name, d) in &deltas {
        assert!(
            *d <= MAX_SWITCHES,
            "{what}: {name} switched {d} times in {WINDOW:?} (all: {deltas:?}); a tickless idle core should sleep"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_does_not_wake_its_cores() {
    let _g = serial().await;
    let srv = Server::start("", &["--cores", "2"]);
    assert_cores_sleep(&srv, "no connections").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_subscribers_between_pings_do_not_wake_their_cores() {
    let _g = serial().await;
    let srv = Server::start("[heartbeat]\nping_interval_ms = 60000\n", &["--cores", "2"]);
    let mut clients = Vec::new();
    for i in 0..20 {
        let mut ws = RawWs::connect(srv.addr, "/ws").await;
        ws.subscribe(&format!("idle.{}", i % 4)).await;
        clients.push(ws);
    }
    srv.wait_gauge(20.0, STEP).await;
    // The first pings come 30 s or more after the upgrade: the window is quiet.
    assert_cores_sleep(&srv, "20 idle subscribers").await;
}

/// A deadline filed while the clock sleeps with nothing due (a fresh TCP connection's
/// handshake deadline) must wake it: the silent connection is cut at the handshake timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_filed_while_the_clock_sleeps_fires_on_time() {
    let _g = serial().await;
    let srv = Server::start("[limits]\nhandshake_timeout_ms = 500\n", &["--cores", "2"]);
    // Let both clocks fall asleep with nothing due.
    assert_cores_sleep(&srv, "before the connection").await;
    let t0 = Instant::now();
    let mut s = connect(srv.addr).await;
    let mut buf = [0u8; 256];
    // The server closes the connection (EOF, or a reset): either ends the read.
    let r = tokio::time::timeout(STEP, s.read(&mut buf))
        .await
        .expect("the silent connection was not cut within 10 s: its handshake deadline did not wake the clock");
    let waited = t0.elapsed();
    assert!(!matches!(r, Ok(n) if n > 0), "the server sent bytes to a connection that sent none: {r:?}");
    assert!(
        waited >= Duration::from_millis(480) && waited < Duration::from_millis(3000),
        "cut after {waited:?}, want about handshake_timeout_ms = 500"
    );
}
