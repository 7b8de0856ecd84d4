//! Connect rate (docs/benchmarks.md): full WebSocket handshakes per second and handshake time,
//! without auth and with a JWT to verify on every upgrade (docs/security.md).
//!
//! `cargo bench --bench connect`. Env: CONNECT_CONNS (10000), CONNECT_CONCURRENCY ("16,64,256":
//! one run per value), CONNECT_CORES (2), CONNECT_AUTH ("none,hs256,es256": one server per
//! variant, each run with every concurrency; with a key, every handshake carries a token on the
//! URL and the server verifies it).

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
    let variants = auth_variants("CONNECT_AUTH", "none,hs256,es256", &["*"]);
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    // Handshakes per second at the highest concurrency, per variant.
    let mut peak = Vec::new();
    for v in &variants {
        let server = serve(&format!("connect-{}", v.name), cores, &v.config);
        let mut last = 0.0;
        for &c in &concurrency {
            let args: Vec<String> = vec![
                "connect".into(),
                v.url(&server.ws_url()),
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
                v.name.clone(),
                c.to_string(),
                cell("handshakes_per_s"),
                cell("p50_ms"),
                cell("p99_ms"),
                cell("max_ms"),
                cell("errors"),
            ]);
            last = num(&r, "handshakes_per_s");
            runs.push(json!({"auth": v.name, "conns": conns, "concurrency": c, "report": r}));
            wait_connections(&server, 0, std::time::Duration::from_secs(20));
        }
        peak.push(format!("{} {last:.0}", v.name));
    }
    table(
        &format!("connect ({conns} handshakes per run, {cores} cores, {} allocator)", allocator()),
        &["auth", "in flight", "handshakes/s", "p50 ms", "p99 ms", "max ms", "errors"],
        &rows,
    );
    println!("\n  handshakes/s at {} in flight: {}", concurrency.last().copied().unwrap_or(0), peak.join(" / "));
    write_json("connect", &json!({"allocator": allocator(), "cores": cores, "runs": runs}));
}
