//! Idle CPU (issue 12, the tickless clock; docs/operations.md, heartbeats): server CPU, as %
//! of one core, with no connection and then with N idle subscribed connections (default
//! heartbeat, 25 s), median of R windows.
//!
//! `cargo bench --bench idle_cpu`. Env: IDLE_CONNS (15000), IDLE_ROUNDS (3), IDLE_WINDOW
//! (seconds per window, 10), IDLE_SETTLE (seconds from the last connection to the first
//! window, 40: first pings fall 12.5–37.5 s after a connection opens, so the windows see the
//! steady rate), IDLE_CORES (2), IDLE_BASELINE (path of another `tether` binary,
//! e.g. a build of `main`: it runs beside this one, each with its own `tether load idle`
//! process, and every window measures both over the same seconds, so the noise of the shared
//! box hits both alike), IDLE_READINESS (`io.readiness` of this build's server, default
//! `epoll`; two values, e.g. `io_uring,epoll`, run one server of this build per value side by
//! side in the same windows, instead of a baseline), IDLE_PING_MS
//! (`heartbeat.ping_interval_ms` of every server, default 25000; e.g. 3600000 keeps every
//! ping out of the windows, so they measure the engine with nothing due: the clock, the
//! readiness source, the processor).
//!
//! CPU comes from `/proc/PID/task/*/schedstat` (nanoseconds on a CPU, all threads); pings per
//! second from `tether_pings_sent_total`.

mod common;

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

struct Side {
    label: String,
    server: Server,
    load: Option<Child>,
}

/// Per side: CPU % of one core and pings/s in each of `rounds` windows of `window` seconds.
fn measure(sides: &[Side], rounds: usize, window: f64) -> Vec<(Vec<f64>, Vec<f64>)> {
    let mut out = vec![(Vec::new(), Vec::new()); sides.len()];
    for _ in 0..rounds {
        let t0 = Instant::now();
        let sample = |s: &Side| {
            let cpu = cpu_seconds_fine(s.server.pid).unwrap_or(f64::NAN);
            (cpu, s.server.metric_sync("tether_pings_sent_total", &[]).unwrap_or(f64::NAN))
        };
        let before: Vec<_> = sides.iter().map(sample).collect();
        std::thread::sleep(Duration::from_secs_f64(window));
        let after: Vec<_> = sides.iter().map(sample).collect();
        let secs = t0.elapsed().as_secs_f64();
        for i in 0..sides.len() {
            out[i].0.push((after[i].0 - before[i].0) / secs * 100.0);
            out[i].1.push((after[i].1 - before[i].1) / secs);
        }
    }
    out
}

fn main() {
    if !should_run() {
        return;
    }
    let conns: usize = env_or("IDLE_CONNS", 15000);
    let rounds: usize = env_or("IDLE_ROUNDS", 3).max(1);
    let window: f64 = env_or("IDLE_WINDOW", 10.0);
    let cores: usize = env_or("IDLE_CORES", 2);
    let settle: f64 = env_or("IDLE_SETTLE", 40.0);
    let baseline = std::env::var("IDLE_BASELINE").ok().map(PathBuf::from);

    pin_binary("idle_cpu");
    let ping_ms: u64 = env_or("IDLE_PING_MS", 0);
    // A short drain window only keeps the end of the bench short.
    let mut cfg = String::from("[drain]\nwindow_ms = 1000\n");
    if ping_ms > 0 {
        cfg.push_str(&format!("\n[heartbeat]\nping_interval_ms = {ping_ms}\n"));
    }
    let cfg = cfg.as_str();
    let readiness: String = env_or("IDLE_READINESS", "epoll".to_string());
    let readiness: Vec<&str> = readiness.split(',').map(str::trim).filter(|r| !r.is_empty()).collect();
    assert!(
        (1..=2).contains(&(readiness.len() + usize::from(baseline.is_some()))),
        "idle_cpu runs at most two servers side by side: IDLE_READINESS has {} values and IDLE_BASELINE {}",
        readiness.len(),
        if baseline.is_some() { "is set" } else { "is not" }
    );
    let mut sides: Vec<Side> = readiness
        .iter()
        .map(|r| {
            let cfg = format!("{cfg}[io]\nreadiness = \"{r}\"\n");
            let label = format!("this build, io.readiness = {r}");
            Side { label, server: serve(&format!("idle_cpu_{r}"), cores, &cfg), load: None }
        })
        .collect();
    if let Some(b) = &baseline {
        let server = serve_bin(b, "idle_cpu_baseline", cores, cfg);
        sides.push(Side { label: format!("baseline {}", b.display()), server, load: None });
    }
    std::thread::sleep(Duration::from_secs(2));
    let empty = measure(&sides, rounds, window);

    // Each load process takes its own half of the source addresses (ports per source).
    let sources = ["127.0.0.2-127.0.0.127", "127.0.0.128-127.0.0.254"];
    let mut commands = Vec::new();
    for (side, src) in sides.iter_mut().zip(sources) {
        let args: Vec<String> = ["idle", &side.server.ws_url(), "--conns", &conns.to_string(), "--channels", "100"]
            .into_iter()
            .map(String::from)
            .chain(["--hold", "900s", "--sources", src].map(String::from))
            .collect();
        eprintln!("$ tether load {}", args.join(" "));
        commands.push(format!("tether load {}", args.join(" ")));
        side.load = Some(spawn_load(&args));
        let got = wait_connections(&side.server, conns as u64, Duration::from_secs(180));
        eprintln!("idle_cpu: {} holds {got} connections", side.label);
    }
    std::thread::sleep(Duration::from_secs_f64(settle));
    let held: Vec<u64> = sides.iter().map(|s| connections(&s.server).unwrap_or(0)).collect();
    let busy = measure(&sides, rounds, window);

    let mut load_reports = Vec::new();
    for side in &mut sides {
        if let Some(child) = side.load.take() {
            load_reports.push(stop_load(child));
        }
        side.server.stop(STOP_GRACE);
    }

    let fmt = |v: &[f64]| v.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(" ");
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for (i, side) in sides.iter().enumerate() {
        rows.push(vec![
            side.label.clone(),
            format!("{:.3}", median(&empty[i].0)),
            fmt(&empty[i].0),
            format!("{:.3}", median(&busy[i].0)),
            fmt(&busy[i].0),
            format!("{:.0}", median(&busy[i].1)),
            held[i].to_string(),
        ]);
        results.push(json!({
            "label": side.label,
            "zero_connections": {"median_cpu_pct": median(&empty[i].0), "windows_cpu_pct": empty[i].0},
            "idle_connections": {
                "held": held[i], "median_cpu_pct": median(&busy[i].0), "windows_cpu_pct": busy[i].0,
                "median_pings_per_s": median(&busy[i].1),
            },
        }));
    }
    table(
        &format!("idle_cpu: % of one core, {cores} cores, {conns} idle subscribed connections, {rounds} windows of {window} s, {} allocator", allocator()),
        &["server", "0 conns median", "0 conns windows", "idle median", "idle windows", "pings/s", "held"],
        &rows,
    );
    let reports: Vec<Value> = load_reports;
    write_json(
        "idle_cpu",
        &json!({
            "allocator": allocator(), "cores": cores, "connections": conns, "rounds": rounds,
            "ping_interval_ms": if ping_ms > 0 { ping_ms } else { 25_000 },
            "window_s": window, "commands": commands, "results": results, "load_reports": reports,
        }),
    );
}
