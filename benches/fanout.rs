//! Broadcast fan-out (README, benchmarks): deliveries/s and publish-to-receive latency
//! (p50/p99/p999) with N subscribers on one channel, for each subscriber count × payload size.
//!
//! `cargo bench --bench fanout`. Env: FANOUT_SUBS ("1000,10000,19000"), FANOUT_SIZES
//! ("64,1024", bytes of `data`), FANOUT_OFFERED (offered deliveries/s, 50000: each run
//! publishes FANOUT_OFFERED / subs messages/s, at least 1), FANOUT_RATE (messages/s for every
//! run instead; a high value such as 20 saturates the box and measures peak deliveries/s),
//! FANOUT_DURATION (seconds of publishing, 5), FANOUT_CORES (2), FANOUT_PUBLISH (ws|http, ws).
//!
//! Latency is publish-to-receive on one host clock; the load generator shares the cores with
//! the server, so past saturation the figures include the generator's own queueing.

mod common;

use common::*;
use serde_json::json;

fn main() {
    if !should_run() {
        return;
    }
    let subs = env_list("FANOUT_SUBS", "1000,10000,19000");
    let sizes = env_list("FANOUT_SIZES", "64,1024");
    let fixed_rate: Option<f64> = std::env::var("FANOUT_RATE").ok().and_then(|v| v.parse().ok());
    let offered: f64 = env_or("FANOUT_OFFERED", 50000.0);
    let duration: f64 = env_or("FANOUT_DURATION", 5.0);
    let cores: usize = env_or("FANOUT_CORES", 2);
    let publish: String = env_or("FANOUT_PUBLISH", "ws".to_string());
    let server = Serve::start("fanout", cores, 0, "");
    let url = server.url();
    let mut runs = Vec::new();
    let mut rows = Vec::new();
    for &n in &subs {
        let rate = fixed_rate.unwrap_or_else(|| (offered / n.max(1) as f64).max(1.0));
        let rate = (rate * 100.0).round() / 100.0;
        for &size in &sizes {
            let args: Vec<String> = vec![
                "fanout".into(),
                url.clone(),
                "--subs".into(),
                n.to_string(),
                "--rate".into(),
                rate.to_string(),
                "--size".into(),
                size.to_string(),
                "--duration".into(),
                format!("{duration}s"),
                "--publish".into(),
                publish.clone(),
                "--sources".into(),
                "127.0.0.2-127.0.0.254".into(),
            ];
            let r = load(&args);
            let cell = |k: &str| common::cell(&r, k);
            rows.push(vec![
                n.to_string(),
                size.to_string(),
                rate.to_string(),
                cell("deliveries_per_s"),
                cell("p50_ms"),
                cell("p99_ms"),
                cell("p999_ms"),
                cell("max_ms"),
                cell("lost"),
                cell("reordered"),
                cell("errors"),
            ]);
            runs.push(json!({"subs": n, "size": size, "rate": rate, "report": r}));
            // Let the server reap the previous run's connections before the next one.
            server.wait_connections(0, std::time::Duration::from_secs(20));
        }
    }
    table(
        &format!("fanout ({cores} cores, {duration} s of publishing over {publish}, {} allocator)", allocator()),
        &[
            "subs",
            "size B",
            "msg/s",
            "deliveries/s",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "max ms",
            "lost",
            "reordered",
            "errors",
        ],
        &rows,
    );
    write_json("fanout", &json!({"allocator": allocator(), "cores": cores, "runs": runs}));
}
