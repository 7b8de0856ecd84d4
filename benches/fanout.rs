//! Broadcast fan-out (docs/benchmarks.md): deliveries/s and publish-to-receive latency
//! (p50/p99/p999) with N subscribers on one channel, for each subscriber count × payload size,
//! and the server's CPU per delivery.
//!
//! `cargo bench --bench fanout`. Env: FANOUT_SUBS ("1000,10000,19000"), FANOUT_SIZES
//! ("64,1024", bytes of `data`), FANOUT_OFFERED (offered deliveries/s, 50000: each run
//! publishes FANOUT_OFFERED / subs messages/s, at least 1), FANOUT_RATE (messages/s for every
//! run instead; a high value such as 20 saturates the box and measures peak deliveries/s; a
//! comma list such as "100,600" runs each rate), FANOUT_DURATION (seconds of publishing, 5),
//! FANOUT_CORES (2), FANOUT_PUBLISH (ws|http, ws), FANOUT_SEND_BATCH (the `io.send_batch`
//! values to compare, "sendmsg"; e.g. "sendmsg,io_uring"; a value may name the
//! `io.readiness` too after a slash, e.g. "sendmsg/io_uring,sendmsg/epoll"), FANOUT_ROUNDS (1): every round
//! runs every send path once, alternating, each on a fresh server, so the noise of a shared
//! box falls on both; with several rounds a summary gives each path's medians and the ratio
//! of each path to the first.
//!
//! Server CPU per delivery is the server process's CPU time (user + system, all threads,
//! sampled every 20 ms) over the load's measured window divided by the deliveries counted in
//! it, in µs. Latency is publish-to-receive on one host clock; the load generator shares the
//! cores with the server, so past saturation the figures include the generator's own
//! queueing.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// One measured run: the send path, its round, and the cells that the summary takes medians of.
struct Run {
    mode: String,
    key: (usize, usize, String),
    deliveries_per_s: f64,
    p99_ms: f64,
    cpu_us: f64,
}

fn main() {
    if !should_run() {
        return;
    }
    let subs = env_list("FANOUT_SUBS", "1000,10000,19000");
    let sizes = env_list("FANOUT_SIZES", "64,1024");
    let fixed_rates: Vec<f64> = std::env::var("FANOUT_RATE")
        .ok()
        .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_default();
    let offered: f64 = env_or("FANOUT_OFFERED", 50000.0);
    let duration: f64 = env_or("FANOUT_DURATION", 5.0);
    let cores: usize = env_or("FANOUT_CORES", 2);
    let publish: String = env_or("FANOUT_PUBLISH", "ws".to_string());
    let modes: Vec<String> = env_or("FANOUT_SEND_BATCH", "sendmsg".to_string())
        .split(',')
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .collect();
    let rounds: usize = env_or("FANOUT_ROUNDS", 1);
    pin_binary("fanout");
    let mut runs = Vec::new();
    let mut rows = Vec::new();
    let mut measured = Vec::new();
    for round in 1..=rounds {
        for mode in &modes {
            let (send_batch, readiness) = mode.split_once('/').unwrap_or((mode, "epoll"));
            let config = format!("[io]\nsend_batch = \"{send_batch}\"\nreadiness = \"{readiness}\"\n");
            let server = serve("fanout", cores, &config);
            let url = server.ws_url();
            for &n in &subs {
                let rates = if fixed_rates.is_empty() {
                    vec![((offered / n.max(1) as f64).max(1.0) * 100.0).round() / 100.0]
                } else {
                    fixed_rates.clone()
                };
                for &rate in &rates {
                    for &size in &sizes {
                        let mut args = fanout_args(url.clone(), n, rate, size, duration);
                        args.extend(["--publish".into(), publish.clone()]);
                        let load_before = loadavg();
                        let stat = vec![std::path::PathBuf::from(format!("/proc/{}/stat", server.pid))];
                        let sampler = ProcSampler::start(vec![stat], Duration::from_millis(20));
                        let r = load(&args);
                        let trace = sampler.finish();
                        let (from, to) = (num(&r, "start_ns") as u64, num(&r, "end_ns") as u64);
                        let cpu_s = trace.at(0, to) - trace.at(0, from);
                        let window_s = to.saturating_sub(from) as f64 / 1e9;
                        let delivered = num(&r, "deliveries_per_s") * window_s;
                        let cpu_us = if delivered > 0.0 { cpu_s / delivered * 1e6 } else { f64::NAN };
                        let cell = |k: &str| common::cell(&r, k);
                        rows.push(vec![
                            round.to_string(),
                            mode.clone(),
                            n.to_string(),
                            size.to_string(),
                            rate.to_string(),
                            cell("deliveries_per_s"),
                            cell("p50_ms"),
                            cell("p99_ms"),
                            cell("p999_ms"),
                            cell("max_ms"),
                            format!("{cpu_us:.3}"),
                            cell("lost"),
                            cell("reordered"),
                            cell("errors"),
                            format!("{load_before:.2}"),
                        ]);
                        measured.push(Run {
                            mode: mode.clone(),
                            key: (n, size, rate.to_string()),
                            deliveries_per_s: num(&r, "deliveries_per_s"),
                            p99_ms: num(&r, "p99_ms"),
                            cpu_us,
                        });
                        runs.push(json!({"round": round, "send_batch": mode, "subs": n, "size": size,
                            "rate": rate, "server_cpu_us_per_delivery": cpu_us, "loadavg": load_before,
                            "report": r}));
                        // Let the server reap the previous run's connections before the next one.
                        wait_connections(&server, 0, Duration::from_secs(20));
                    }
                }
            }
        }
    }
    table(
        &format!("fanout ({cores} cores, {duration} s of publishing over {publish}, {} allocator)", allocator()),
        &[
            "round",
            "send",
            "subs",
            "size B",
            "msg/s",
            "deliveries/s",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "max ms",
            "cpu µs/deliv",
            "lost",
            "reordered",
            "errors",
            "load 1m",
        ],
        &rows,
    );
    let summary = summarize(&modes, &measured);
    write_json("fanout", &json!({"allocator": allocator(), "cores": cores, "runs": runs, "summary": summary}));
}

/// Medians per send path and workload, and each path's ratio to the first path (printed and
/// returned for the JSON), when more than one path or round ran.
fn summarize(modes: &[String], measured: &[Run]) -> Value {
    let mut keys: Vec<&(usize, usize, String)> = Vec::new();
    for r in measured {
        if !keys.contains(&&r.key) {
            keys.push(&r.key);
        }
    }
    let med = |mode: &str, key: &(usize, usize, String), f: fn(&Run) -> f64| {
        median(&measured.iter().filter(|r| r.mode == mode && &r.key == key).map(f).collect::<Vec<_>>())
    };
    let mut rows = Vec::new();
    let mut out = Vec::new();
    for key in keys {
        for mode in modes {
            let d = med(mode, key, |r| r.deliveries_per_s);
            let p = med(mode, key, |r| r.p99_ms);
            let c = med(mode, key, |r| r.cpu_us);
            let (d0, p0, c0) = (
                med(&modes[0], key, |r| r.deliveries_per_s),
                med(&modes[0], key, |r| r.p99_ms),
                med(&modes[0], key, |r| r.cpu_us),
            );
            let n = measured.iter().filter(|r| &r.mode == mode && &r.key == key).count();
            rows.push(vec![
                mode.clone(),
                key.0.to_string(),
                key.1.to_string(),
                key.2.clone(),
                n.to_string(),
                format!("{d:.0}"),
                format!("{p:.1}"),
                format!("{c:.3}"),
                format!("{:.3}", d / d0),
                format!("{:.3}", p / p0),
                format!("{:.3}", c / c0),
            ]);
            out.push(json!({"send_batch": mode, "subs": key.0, "size": key.1, "rate": key.2, "runs": n,
                "deliveries_per_s": d, "p99_ms": p, "cpu_us_per_delivery": c,
                "ratio_deliveries": d / d0, "ratio_p99": p / p0, "ratio_cpu": c / c0}));
        }
    }
    if modes.len() > 1 || measured.len() > rows.len() {
        table(
            &format!("medians per send path; ratios to {}", modes[0]),
            &[
                "send",
                "subs",
                "size B",
                "msg/s",
                "runs",
                "deliveries/s",
                "p99 ms",
                "cpu µs/deliv",
                "× deliv",
                "× p99",
                "× cpu",
            ],
            &rows,
        );
    }
    Value::Array(out)
}
