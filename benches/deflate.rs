//! permessage-deflate against plain WebSockets (issue 29; docs/benchmarks.md): N subscribers of
//! one channel, once offering `permessage-deflate` and once not, for a ~1 KiB JSON order-book
//! snapshot and a ~120 B trade tick; and the memory per idle connection with deflate agreed
//! against without.
//!
//! `cargo bench --bench deflate`. Env: DEFLATE_SUBS (10000), DEFLATE_RATE (messages/s, 10),
//! DEFLATE_SIZE (bytes of the snapshot's `data`, 1024), DEFLATE_DURATION (seconds of
//! publishing, 10), DEFLATE_CORES (2), DEFLATE_ROUNDS (3), DEFLATE_IDLE (most idle connections,
//! 8000), DEFLATE_IDLE_POINTS (4). The servers run the default `[compression]` (on,
//! `min_bytes` 256), so the tick goes out plain to both kinds of subscriber (what an agreed
//! extension costs when it does not compress); a third case, `tick_min0`, runs the tick on
//! servers with `min_bytes = 0`, so that it is compressed.
//!
//! Each round runs, for each case, both kinds of subscriber, each on a fresh server, in
//! alternating order (plain first in odd rounds), so the noise of the shared box falls on
//! both; then the idle memory of both. The summary gives each figure's median over the rounds
//! and the ratio deflate ÷ plain. Writes target/bench/deflate.json.
//!
//! - Bytes on the wire per delivery: the WebSocket frame bytes (headers included) of the data
//!   messages the subscribers received, over the deliveries (`tether load fanout`'s
//!   `wire_bytes_per_delivery`); the server's `tether_deflate_bytes_total{form}` is kept next
//!   to it in the JSON (frame bytes of each compressed message, once, plain and deflated).
//! - Server CPU per publish and per delivery: the server process's CPU time (all threads,
//!   /proc/PID/stat, sampled every 20 ms) over the load's measured window (first publish to
//!   last delivery), over the messages published and the deliveries, in µs.
//! - Deliveries/s and publish-to-receive p50/p99 from the load report.
//! - Idle memory: server RSS at DEFLATE_IDLE_POINTS connection counts up to DEFLATE_IDLE
//!   (`tether load idle`, with `--deflate` or not), the least-squares slope in bytes per
//!   connection, as benches/density.rs measures it.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const MODES: [&str; 2] = ["plain", "deflate"];
/// (name, `--payload`, server config): the snapshot and the tick on the default
/// `[compression]` (`min_bytes` 256: the tick goes plain to everyone), and the tick again with
/// `min_bytes = 0`, so that it is compressed.
const CASES: [(&str, &str, &str); 3] =
    [("book", "book", ""), ("tick", "tick", ""), ("tick_min0", "tick", "[compression]\nmin_bytes = 0\n")];
/// Per fan-out run: wire B/delivery, cpu µs/publish, cpu µs/delivery, deliveries/s, p50, p99.
const FIGURES: [&str; 6] =
    ["wire_bytes_per_delivery", "cpu_us_per_publish", "cpu_us_per_delivery", "deliveries_per_s", "p50_ms", "p99_ms"];

fn main() {
    if !should_run() {
        return;
    }
    let knobs = FanoutKnobs::read("DEFLATE", 1024);
    let FanoutKnobs { subs, rate, size, duration, cores, rounds } = knobs;
    let idle_max: usize = env_or("DEFLATE_IDLE", 8000);
    let idle_points: usize = env_or("DEFLATE_IDLE_POINTS", 4).max(2);
    pin_binary("deflate");
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    // cells[case][mode]: FIGURES of each round.
    let mut cells = vec![vec![Vec::<[f64; 6]>::new(); 2]; CASES.len()];
    // idle[mode]: bytes per connection of each round.
    let mut idle: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut idle_runs = Vec::new();
    for round in 1..=rounds {
        let order: [usize; 2] = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        for (p, (case, payload, config)) in CASES.iter().enumerate() {
            for m in order {
                let (c, run) = fanout(&knobs, payload, config, m == 1);
                rows.push(
                    [round.to_string(), case.to_string(), MODES[m].to_string()]
                        .into_iter()
                        .chain(c.iter().map(|v| format!("{v:.3}")))
                        .chain([cell(&run["report"], "lost"), cell(&run["report"], "errors")])
                        .collect(),
                );
                cells[p][m].push(c);
                runs.push(json!({"round": round, "case": case, "payload": payload, "config": config,
                    "mode": MODES[m], "run": run}));
            }
        }
        for m in order {
            let (per_conn, points) = idle_memory(idle_max, idle_points, cores, m == 1);
            idle[m].push(per_conn);
            idle_runs.push(json!({"round": round, "mode": MODES[m], "bytes_per_conn": per_conn, "points": points}));
        }
    }
    let title = format!("{subs} subscribers, {rate} msg/s, {duration} s, {cores} cores, snapshot {size} B");
    let headers = [
        "round",
        "case",
        "mode",
        "wire B/deliv",
        "cpu µs/pub",
        "cpu µs/deliv",
        "deliveries/s",
        "p50 ms",
        "p99 ms",
        "lost",
        "errors",
    ];
    table(&title, &headers, &rows);
    let mut summary = serde_json::Map::new();
    let mut srows = Vec::new();
    for (p, (case, _, _)) in CASES.iter().enumerate() {
        let med = |m: usize, i: usize| median(&cells[p][m].iter().map(|c| c[i]).collect::<Vec<_>>());
        let mut figures = serde_json::Map::new();
        for (i, name) in FIGURES.iter().enumerate() {
            let (plain, deflate) = (med(0, i), med(1, i));
            let ratio = deflate / plain;
            figures
                .insert(name.to_string(), json!({"plain": plain, "deflate": deflate, "ratio_deflate_to_plain": ratio}));
            srows.push(vec![
                case.to_string(),
                name.to_string(),
                format!("{plain:.3}"),
                format!("{deflate:.3}"),
                format!("{ratio:.3}"),
            ]);
        }
        summary.insert(case.to_string(), figures.into());
    }
    let (plain, deflate) = (median(&idle[0]), median(&idle[1]));
    srows.push(vec![
        "idle".into(),
        "rss_bytes_per_conn".into(),
        format!("{plain:.0}"),
        format!("{deflate:.0}"),
        format!("{:.3}", deflate / plain),
    ]);
    summary.insert(
        "idle".into(),
        json!({"rss_bytes_per_conn": {"plain": plain, "deflate": deflate, "ratio_deflate_to_plain": deflate / plain,
            "difference_bytes": deflate - plain}}),
    );
    table(&format!("medians of {rounds} rounds"), &["case", "figure", "plain", "deflate", "deflate ÷ plain"], &srows);
    println!("\n  idle connection with deflate agreed: {:+.0} B against plain (median RSS slopes)", deflate - plain);
    write_json(
        "deflate",
        &json!({"subs": subs, "rate": rate, "size": size, "duration_s": duration, "cores": cores,
            "rounds": rounds, "idle_max": idle_max, "idle_points": idle_points, "allocator": allocator(),
            "loadavg_at_end": loadavg(), "runs": runs, "idle_runs": idle_runs, "summary": summary}),
    );
}

/// One fan-out on a fresh server with `config`; returns [`FIGURES`] and the run's JSON (load report, CPU,
/// the server's deflate counters).
fn fanout(knobs: &FanoutKnobs, payload: &str, config: &str, deflate: bool) -> ([f64; 6], Value) {
    let server = serve("deflate", knobs.cores, config);
    let mut args = knobs.args(server.ws_url());
    args.extend(["--payload".into(), payload.into()]);
    if deflate {
        args.push("--deflate".into());
    }
    let (r, cpu_s, delivered) = load_with_cpu(server.pid, &args);
    let counter = |name: &str, label: &str| server.metric_sync(name, &[label]).unwrap_or(f64::NAN);
    let server_counts = json!({
        "deflate_bytes_plain": counter("tether_deflate_bytes_total", "form=\"plain\""),
        "deflate_bytes_deflated": counter("tether_deflate_bytes_total", "form=\"deflated\""),
        "deflate_messages_compressed": counter("tether_deflate_messages_total", "result=\"compressed\""),
        "deflate_messages_plain": counter("tether_deflate_messages_total", "result=\"plain\""),
    });
    let c = [
        num(&r, "wire_bytes_per_delivery"),
        cpu_s / num(&r, "published") * 1e6,
        cpu_s / delivered * 1e6,
        num(&r, "deliveries_per_s"),
        num(&r, "p50_ms"),
        num(&r, "p99_ms"),
    ];
    if deflate && num(&r, "deflate_agreed") < num(&r, "subscribed") {
        eprintln!(
            "deflate: only {} of {} subscribers agreed deflate",
            num(&r, "deflate_agreed"),
            num(&r, "subscribed")
        );
    }
    (c, json!({"server_cpu_s": cpu_s, "server_counters": server_counts, "report": r}))
}

/// Server RSS per idle subscribed connection on a fresh server (least-squares slope over
/// `points` counts up to `max`), with every connection offering deflate or none; returns the
/// slope and the `(connections, rss bytes)` samples.
fn idle_memory(max: usize, points: usize, cores: usize, deflate: bool) -> (f64, Vec<(f64, f64)>) {
    let server = serve("deflate-idle", cores, "");
    std::thread::sleep(Duration::from_millis(500));
    let mut loads = Vec::new();
    let mut samples = Vec::new();
    let mut held = 0usize;
    for i in 1..=points {
        let target = max * i / points;
        let mut args: Vec<String> = ["idle", &server.ws_url(), "--conns", &(target - held).to_string()]
            .into_iter()
            .chain(["--channels", "100", "--hold", "600s", "--threads", "1", "--sources", "127.0.0.2-127.0.0.254"])
            .map(String::from)
            .collect();
        if deflate {
            args.push("--deflate".into());
        }
        eprintln!("$ tether load {}", args.join(" "));
        loads.push(spawn_load(&args));
        held = target;
        let got = wait_connections(&server, held as u64, Duration::from_secs(60));
        // Let the allocator and the kernel settle (deferred frees, timers).
        std::thread::sleep(Duration::from_millis(1500));
        let rss = rss_bytes(server.pid);
        eprintln!("deflate idle ({}): {got} connections, server RSS {} KiB", MODES[deflate as usize], rss / 1024);
        samples.push((got as f64, rss as f64));
    }
    for child in loads {
        let report = stop_load(child);
        if deflate && num(&report, "deflate_agreed") < num(&report, "connections") {
            eprintln!("deflate idle: not every connection agreed deflate: {report}");
        }
    }
    (slope(&samples), samples)
}
