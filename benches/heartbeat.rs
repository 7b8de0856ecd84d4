//! The cost of heartbeats (docs/operations.md, heartbeats: the timer wheel and the pings):
//! server CPU for N idle subscribed connections that answer every ping, with
//! `heartbeat.ping_interval_ms = 1000` against the 25000 default (the baseline).
//!
//! `cargo bench --bench heartbeat`. Env: HB_CONNS (15000 per server), HB_ROUNDS (4),
//! HB_WINDOW (seconds per measuring window, 12), HB_SETTLE (seconds between the last connection
//! and the first window, 3), HB_CORES (2), HB_FAST_MS (1000), HB_BASE_MS (25000).
//!
//! Both servers run at once, each with its own `tether load idle` process (the per-process
//! open-file limit is 20000), and every window measures both over the same seconds, so the
//! noise of the shared box hits both alike. Per window and server: CPU seconds per second
//! from /proc/PID/stat (utime + stime), and pings per second from the delta of
//! `tether_pings_sent_total`. Cost per ping = (CPU/s fast − CPU/s base) / (pings/s fast −
//! pings/s base): the baseline's own pings and its timer wheel are subtracted out, so what is
//! left is what the extra pings cost (the ping frame, the pong read, the timer re-arm).
//! Reported per window, as the median over windows, and pooled over all windows.
//!
//! The baseline's ping rate moves between windows: a new connection's first ping falls in the
//! second half of its first interval and the next ones follow one interval apart, so with the
//! connections opened within seconds its pings come in bursts (12.5–25 s, 37.5–50 s, … after
//! connect). The formula uses the measured rates, so the bursts do not bias it.

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// One server under test and the load process that holds its connections.
struct Side {
    label: String,
    interval_ms: u64,
    server: Server,
    load: Option<Child>,
}

/// CPU seconds and pings sent by one side at one instant.
#[derive(Clone, Copy)]
struct Sample {
    cpu_s: f64,
    load_cpu_s: f64,
    pings: f64,
}

impl Side {
    fn sample(&self) -> Sample {
        Sample {
            cpu_s: cpu_seconds(self.server.pid).unwrap_or(f64::NAN),
            load_cpu_s: self.load.as_ref().and_then(|c| cpu_seconds(c.id() as i32)).unwrap_or(f64::NAN),
            pings: self.server.metric_sync("tether_pings_sent_total", &[]).unwrap_or(f64::NAN),
        }
    }
}

fn main() {
    if !should_run() {
        return;
    }
    let conns: usize = env_or("HB_CONNS", 15000);
    let rounds: usize = env_or("HB_ROUNDS", 4).max(1);
    let window: f64 = env_or("HB_WINDOW", 12.0);
    let settle: f64 = env_or("HB_SETTLE", 3.0);
    let cores: usize = env_or("HB_CORES", 2);
    let fast_ms: u64 = env_or("HB_FAST_MS", 1000);
    let base_ms: u64 = env_or("HB_BASE_MS", 25000);

    pin_binary("heartbeat");
    let mut sides: Vec<Side> = [(fast_ms, "fast"), (base_ms, "base")]
        .into_iter()
        .map(|(ms, name)| {
            // A short drain window only keeps the end of the bench short.
            let cfg = format!("[heartbeat]\nping_interval_ms = {ms}\n\n[drain]\nwindow_ms = 1000\n");
            Side {
                label: format!("{ms} ms"),
                interval_ms: ms,
                server: serve(&format!("heartbeat_{name}"), cores, &cfg),
                load: None,
            }
        })
        .collect();

    let mut commands = Vec::new();
    for side in &mut sides {
        let args: Vec<String> = vec![
            "idle".into(),
            side.server.ws_url(),
            "--conns".into(),
            conns.to_string(),
            "--channels".into(),
            "100".into(),
            "--hold".into(),
            "900s".into(),
            "--sources".into(),
            "127.0.0.2-127.0.0.254".into(),
        ];
        eprintln!("$ tether load {}", args.join(" "));
        commands.push(format!("tether load {}", args.join(" ")));
        side.load = Some(spawn_load(&args));
        // One side at a time: both bursts of handshakes at once would only slow each other.
        let got = wait_connections(&side.server, conns as u64, Duration::from_secs(120));
        eprintln!("heartbeat: {} server holds {got} connections", side.label);
    }
    std::thread::sleep(Duration::from_secs_f64(settle));

    let mut windows: Vec<Value> = Vec::new();
    let mut rows = Vec::new();
    let mut totals = [[0.0f64; 3]; 2];
    let mut total_s = 0.0;
    let mut per_ping = Vec::new();
    let mut cpu_pct = [Vec::new(), Vec::new()];
    let mut pps = [Vec::new(), Vec::new()];
    let mut held = [0.0f64; 2];
    for round in 0..rounds {
        let t0 = Instant::now();
        let before: Vec<Sample> = sides.iter().map(Side::sample).collect();
        std::thread::sleep(Duration::from_secs_f64(window));
        let after: Vec<Sample> = sides.iter().map(Side::sample).collect();
        let secs = t0.elapsed().as_secs_f64();
        total_s += secs;
        let mut fig = Vec::new();
        for i in 0..2 {
            let cpu = (after[i].cpu_s - before[i].cpu_s) / secs;
            let load_cpu = (after[i].load_cpu_s - before[i].load_cpu_s) / secs;
            let rate = (after[i].pings - before[i].pings) / secs;
            totals[i][0] += after[i].cpu_s - before[i].cpu_s;
            totals[i][1] += after[i].pings - before[i].pings;
            totals[i][2] += after[i].load_cpu_s - before[i].load_cpu_s;
            cpu_pct[i].push(cpu * 100.0);
            pps[i].push(rate);
            held[i] = connections(&sides[i].server).unwrap_or(0) as f64;
            fig.push((cpu, rate, load_cpu));
        }
        let us = (fig[0].0 - fig[1].0) / (fig[0].1 - fig[1].1) * 1e6;
        per_ping.push(us);
        rows.push(vec![
            round.to_string(),
            format!("{:.2}", fig[0].0 * 100.0),
            format!("{:.0}", fig[0].1),
            format!("{:.2}", fig[1].0 * 100.0),
            format!("{:.0}", fig[1].1),
            format!("{:.2}x", fig[0].0 / fig[1].0),
            format!("{us:.2}"),
            format!("{:.2}", fig[0].2 * 100.0),
        ]);
        windows.push(json!({
            "round": round, "seconds": secs,
            "fast": {"cpu_pct": fig[0].0 * 100.0, "pings_per_s": fig[0].1, "load_cpu_pct": fig[0].2 * 100.0},
            "base": {"cpu_pct": fig[1].0 * 100.0, "pings_per_s": fig[1].1, "load_cpu_pct": fig[1].2 * 100.0},
            "cpu_us_per_ping": us,
        }));
    }

    let mut load_reports = Vec::new();
    for side in &mut sides {
        if let Some(child) = side.load.take() {
            load_reports.push(stop_load(child));
        }
        side.server.stop(STOP_GRACE);
    }
    let load_errors: f64 = load_reports.iter().map(|r| num(r, "errors")).sum();

    let pooled_cpu = [totals[0][0] / total_s, totals[1][0] / total_s];
    let pooled_pps = [totals[0][1] / total_s, totals[1][1] / total_s];
    let pooled_us = (pooled_cpu[0] - pooled_cpu[1]) / (pooled_pps[0] - pooled_pps[1]) * 1e6;
    let med = |v: &[f64]| median(v);
    table(
        &format!(
            "heartbeat: {conns} idle subscribed connections per server, {} vs {} ping interval, {cores} cores, {window} s windows, {} allocator",
            sides[0].label,
            sides[1].label,
            allocator()
        ),
        &["round", "CPU % fast", "pings/s fast", "CPU % base", "pings/s base", "CPU ratio", "CPU us/ping", "load-gen CPU % fast"],
        &rows,
    );
    table(
        &format!("heartbeat: medians over {rounds} windows, and pooled over all {total_s:.1} s"),
        &["figure", "fast", "base", "fast/base", "CPU us/ping"],
        &[
            vec![
                "median".into(),
                format!("{:.2} % CPU, {:.0} pings/s", med(&cpu_pct[0]), med(&pps[0])),
                format!("{:.2} % CPU, {:.0} pings/s", med(&cpu_pct[1]), med(&pps[1])),
                format!("{:.2}x", med(&cpu_pct[0]) / med(&cpu_pct[1])),
                format!("{:.2}", med(&per_ping)),
            ],
            vec![
                "pooled".into(),
                format!("{:.2} % CPU, {:.0} pings/s", pooled_cpu[0] * 100.0, pooled_pps[0]),
                format!("{:.2} % CPU, {:.0} pings/s", pooled_cpu[1] * 100.0, pooled_pps[1]),
                format!("{:.2}x", pooled_cpu[0] / pooled_cpu[1]),
                format!("{pooled_us:.2}"),
            ],
        ],
    );
    println!(
        "\n  ping CPU at {}: {:.2} % of one core above the {} baseline ({:.0} extra pings/s); connections at the end {:?}; load errors {load_errors}",
        sides[0].label,
        (pooled_cpu[0] - pooled_cpu[1]) * 100.0,
        sides[1].label,
        pooled_pps[0] - pooled_pps[1],
        held
    );
    write_json(
        "heartbeat",
        &json!({
            "allocator": allocator(),
            "cores": cores,
            "connections_per_server": conns,
            "fast_ping_interval_ms": sides[0].interval_ms,
            "base_ping_interval_ms": sides[1].interval_ms,
            "window_s": window,
            "rounds": rounds,
            "commands": commands,
            "median": {
                "fast_cpu_pct": med(&cpu_pct[0]), "fast_pings_per_s": med(&pps[0]),
                "base_cpu_pct": med(&cpu_pct[1]), "base_pings_per_s": med(&pps[1]),
                "cpu_ratio_fast_vs_base": med(&cpu_pct[0]) / med(&cpu_pct[1]),
                "cpu_us_per_ping": med(&per_ping),
            },
            "pooled": {
                "seconds": total_s,
                "fast_cpu_pct": pooled_cpu[0] * 100.0, "fast_pings_per_s": pooled_pps[0],
                "base_cpu_pct": pooled_cpu[1] * 100.0, "base_pings_per_s": pooled_pps[1],
                "fast_load_gen_cpu_pct": totals[0][2] / total_s * 100.0,
                "base_load_gen_cpu_pct": totals[1][2] / total_s * 100.0,
                "cpu_us_per_ping": pooled_us,
            },
            "connections_at_end": held,
            "load_errors": load_errors,
            "windows": windows,
            "load_reports": load_reports,
        }),
    );
}
