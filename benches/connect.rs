//! Connect rate (README, benchmarks): full WebSocket handshakes per second and handshake time.
//!
//! `cargo bench --bench connect`. Env: CONNECT_CONNS (10000), CONNECT_CONCURRENCY ("16,64,256":
//! one run per value), CONNECT_CORES (2).

mod common;

use common::*;
use serde_json::json;

fn main() {
    if !should_run() {
        return;
    }
    let conns: usize = env_or("CONNECT_CONNS", 10000);
    let concurrency = env_list("CONNECT_CONCURRENCY", "16,64,256");
    let cores: usize = env_or("CONNECT_CORES", 2);
    let server = Serve::start("connect", cores, 0, "");
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for &c in &concurrency {
        let args: Vec<String> = vec![
            "connect".into(),
            server.url(),
            "--conns".into(),
            conns.to_string(),
            "--concurrency".into(),
            c.to_string(),
            "--sources".into(),
            "127.0.0.2-127.0.0.254".into(),
        ];
        let r = load(&args);
        let cell = |k: &str| common::cell(&r, k);
        rows.push(vec![
            c.to_string(),
            cell("handshakes_per_s"),
            cell("p50_ms"),
            cell("p99_ms"),
            cell("max_ms"),
            cell("errors"),
        ]);
        runs.push(json!({"conns": conns, "concurrency": c, "report": r}));
        server.wait_connections(0, std::time::Duration::from_secs(20));
    }
    table(
        &format!("connect ({conns} handshakes per run, {cores} cores, {} allocator)", allocator()),
        &["in flight", "handshakes/s", "p50 ms", "p99 ms", "max ms", "errors"],
        &rows,
    );
    write_json("connect", &json!({"allocator": allocator(), "cores": cores, "runs": runs}));
}
