//! Server-Sent Events against WebSockets (issue 29; docs/benchmarks.md): N subscribers of one
//! channel over each transport in turn, the same publisher and payload, and for each
//! deliveries/s, publish-to-receive p50/p99 and the server's CPU per delivery.
//!
//! `cargo bench --bench sse`. Env: SSE_SUBS (10000), SSE_RATE (messages/s, 10), SSE_SIZE
//! (bytes of `data`, 64), SSE_DURATION (seconds of publishing, 10), SSE_CORES (2), SSE_ROUNDS
//! (3): each round runs both transports, alternating, each on a fresh server, so the noise of
//! the shared box falls on both; the summary gives each transport's medians over the rounds and
//! SSE's ratio to WebSocket. Writes target/bench/sse.json.
//!
//! The subscribers are `tether load fanout` (with `--sse`: `GET /sse?ch=…` on a raw socket,
//! every `data:` line taken as the message). Server CPU per delivery is the server process's
//! CPU time (all threads, sampled every 20 ms) over the load's measured window, divided by the
//! deliveries in it, in µs.

mod common;

use common::*;
use serde_json::json;

const TRANSPORTS: [&str; 2] = ["websocket", "sse"];

fn main() {
    if !should_run() {
        return;
    }
    let knobs = FanoutKnobs::read("SSE", 64);
    let FanoutKnobs { subs, rate, size, duration, cores, rounds } = knobs;
    pin_binary("sse");
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    // Per transport: (deliveries/s, p50 ms, p99 ms, cpu µs per delivery) of each round.
    let mut cells: [Vec<[f64; 4]>; 2] = [Vec::new(), Vec::new()];
    for round in 1..=rounds {
        for (t, transport) in TRANSPORTS.iter().enumerate() {
            let server = serve("sse", cores, "");
            let mut args = knobs.args(server.ws_url());
            if *transport == "sse" {
                args.push("--sse".into());
            }
            let (r, cpu_s, delivered) = load_with_cpu(server.pid, &args);
            let cpu_us = cpu_s / delivered * 1e6;
            let c = [num(&r, "deliveries_per_s"), num(&r, "p50_ms"), num(&r, "p99_ms"), cpu_us];
            cells[t].push(c);
            rows.push(vec![
                round.to_string(),
                transport.to_string(),
                format!("{:.0}", c[0]),
                format!("{:.1}", c[1]),
                format!("{:.1}", c[2]),
                format!("{cpu_us:.3}"),
                common::cell(&r, "lost"),
                common::cell(&r, "errors"),
            ]);
            runs.push(
                json!({"round": round, "transport": transport, "server_cpu_us_per_delivery": cpu_us, "report": r}),
            );
        }
    }
    let title = format!("{subs} subscribers, {rate} msg/s of {size} B, {duration} s, {cores} cores");
    let headers = ["round", "transport", "deliveries/s", "p50 ms", "p99 ms", "cpu µs/deliv", "lost", "errors"];
    table(&title, &headers, &rows);
    let med = |t: usize, i: usize| median(&cells[t].iter().map(|c| c[i]).collect::<Vec<_>>());
    let names = ["deliveries_per_s", "p50_ms", "p99_ms", "cpu_us_per_delivery"];
    let mut summary = serde_json::Map::new();
    let mut srows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let (ws, sse) = (med(0, i), med(1, i));
        summary.insert(name.to_string(), json!({"websocket": ws, "sse": sse, "ratio_sse_to_websocket": sse / ws}));
        srows.push(vec![name.to_string(), format!("{ws:.3}"), format!("{sse:.3}"), format!("{:.3}", sse / ws)]);
    }
    table(&format!("medians of {rounds} rounds"), &["figure", "websocket", "sse", "sse ÷ websocket"], &srows);
    write_json(
        "sse",
        &json!({"subs": subs, "rate": rate, "size": size, "duration_s": duration, "cores": cores,
            "rounds": rounds, "allocator": allocator(), "runs": runs, "summary": summary}),
    );
}
