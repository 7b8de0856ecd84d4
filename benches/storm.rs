//! Reconnect storm (docs/benchmarks.md): N subscribers dropped at once; time until all are back and
//! resumed, attempts, peak reconnects per 100 ms, errors.
//!
//! - `cut`: the load generator resets all its sockets; clients resume (gapless, `recovered`).
//! - `drain`: the server gets SIGTERM (drain over `drain.window_ms`, close 1012) and a
//!   replacement starts on the same port at once; with the in-memory broker the replacement
//!   has a new epoch, so clients resume through `reset`.
//!
//! `cargo bench --bench storm`. Env: STORM_CONNS (10000), STORM_TRIGGERS ("cut,drain"),
//! STORM_DRAIN_WINDOW_MS (1000), STORM_CORES (2).

mod common;

use common::*;
use serde_json::{json, Value};

fn main() {
    if !should_run() {
        return;
    }
    let conns: usize = env_or("STORM_CONNS", 10000);
    let triggers: String = env_or("STORM_TRIGGERS", "cut,drain".to_string());
    let window: u64 = env_or("STORM_DRAIN_WINDOW_MS", 1000);
    let cores: usize = env_or("STORM_CORES", 2);
    let config = format!("[drain]\nwindow_ms = {window}\n");
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for trigger in triggers.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let mut server = serve("storm", cores, &config);
        let mut args: Vec<String> = vec![
            "storm".into(),
            server.ws_url(),
            "--conns".into(),
            conns.to_string(),
            "--trigger".into(),
            trigger.into(),
            "--sources".into(),
            "127.0.0.2-127.0.0.254".into(),
        ];
        if trigger == "drain" {
            args.extend([
                "--server-pid".into(),
                server.pid.to_string(),
                "--restart-cmd".into(),
                restart_cmd(&server, "storm", cores),
            ]);
        }
        let r = load(&args);
        // The drained server exits by itself; the replacement is ours to stop.
        if let Some(pid) = r.get("restart_pid").and_then(Value::as_i64) {
            // SAFETY: kill(2) on the replacement server the storm started for this bench.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
        server.stop(STOP_GRACE);
        let cell = |k: &str| common::cell(&r, k);
        rows.push(vec![
            trigger.to_string(),
            cell("connected"),
            cell("recovered"),
            cell("resets"),
            cell("recovery_s"),
            cell("attempts"),
            cell("peak_reconnects_per_100ms"),
            cell("errors"),
        ]);
        runs.push(json!({"trigger": trigger, "conns": conns, "drain_window_ms": window, "report": r}));
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    table(
        &format!("storm ({conns} clients, {cores} cores, full jitter 500 ms / 30 s, {} allocator)", allocator()),
        &["trigger", "connected", "recovered", "resets", "recovery s", "attempts", "peak/100ms", "errors"],
        &rows,
    );
    write_json("storm", &json!({"allocator": allocator(), "cores": cores, "runs": runs}));
}
