//! Memory per idle subscribed connection (docs/benchmarks.md, "Allocator"): server RSS (VmRSS) and
//! kernel slab (/proc/meminfo `Slab:`) sampled at several connection counts from DENSITY_MIN
//! to DENSITY_MAX; the per-connection cost is the least-squares slope.
//!
//! `cargo bench --bench density` (system allocator) and
//! `cargo bench --bench density --features mimalloc`. Env: DENSITY_MIN (1000), DENSITY_MAX
//! (19000; the server's open-file limit must exceed it), DENSITY_POINTS (7), DENSITY_CORES (2),
//! DENSITY_CHANNELS (100), DENSITY_RATE (new connections/s, 0 = unlimited), DENSITY_AUTH
//! ("none,hs256": one server per variant, in this order; with hs256 every connection carries a
//! JWT, all with the same claims, docs/security.md), so one run gives the memory per
//! authenticated idle connection next to the unauthenticated one; DENSITY_READINESS (the
//! servers' `io.readiness`, default `epoll`: the kernel side of a registration differs between
//! the ring's poll and an epoll entry).
//!
//! It also prints `size_of::<Conn>()`, the per-connection state a slab slot holds, and the
//! part of it that is the sans-IO session (`size_of::<Session>()`).
//!
//! Slab is system-wide and both ends of each loopback connection live in this kernel, so the
//! slab slope covers a client socket and a server socket; it is also disturbed by anything
//! else running on the box.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

/// One variant's samples and slopes.
struct Measured {
    samples: Vec<(f64, f64, f64)>,
    base_rss: u64,
    base_slab: u64,
    user: f64,
    user_median: f64,
    kernel: f64,
    kernel_median: f64,
    errors: f64,
    reports: Vec<serde_json::Value>,
}

fn main() {
    if !should_run() {
        return;
    }
    let min: usize = env_or("DENSITY_MIN", 1000);
    let max: usize = env_or("DENSITY_MAX", 19000).max(min);
    let points: usize = env_or("DENSITY_POINTS", 7).max(2);
    let cores: usize = env_or("DENSITY_CORES", 2);
    let channels: usize = env_or("DENSITY_CHANNELS", 100);
    let rate: f64 = env_or("DENSITY_RATE", 0.0);
    let variants = auth_variants("DENSITY_AUTH", "none,hs256", &["load.idle.*"]);

    // The per-connection state a slab slot holds (issue 12 asks for it next to the slopes).
    let conn_bytes = std::mem::size_of::<tether::server::conn::Conn>();
    let session_bytes = std::mem::size_of::<tether::session::Session>();
    println!(
        "per-connection state: size_of::<Conn>() = {conn_bytes} B (a slab slot's payload; its session: {session_bytes} B)"
    );
    let mut results = Vec::new();
    for v in &variants {
        let m = measure(v, min, max, points, cores, channels, rate);
        let rows: Vec<Vec<String>> = m
            .samples
            .iter()
            .map(|s| {
                vec![
                    format!("{}", s.0),
                    format!("{:.1}", s.1 / 1048576.0),
                    format!("{:.1}", (s.1 - m.base_rss as f64) / s.0.max(1.0)),
                    format!("{:.1}", (s.2 - m.base_slab as f64) / 1048576.0),
                ]
            })
            .collect();
        table(
            &format!("density, auth {} ({} allocator, {cores} cores, {channels} channels)", v.name, allocator()),
            &["connections", "server RSS MiB", "RSS-base B/conn", "slab delta MiB"],
            &rows,
        );
        println!(
            "\n  user RSS per idle subscribed connection: {:.0} B (least squares), {:.0} B (median slope)",
            m.user, m.user_median
        );
        println!(
            "  kernel slab per connection pair (client + server socket): {:.0} B (least squares), {:.0} B (median slope)",
            m.kernel, m.kernel_median
        );
        println!("  load-generator errors: {}", m.errors);
        results.push((v.name.clone(), m));
    }
    if let (Some((_, none)), Some((name, auth))) =
        (results.iter().find(|(n, _)| n == "none"), results.iter().find(|(n, _)| n != "none"))
    {
        println!(
            "\n  memory per authenticated ({name}) idle connection: {:.0} B vs unauthenticated: {:.0} B ({:+.0} B, least squares)",
            auth.user,
            none.user,
            auth.user - none.user
        );
    }
    let json_of = |m: &Measured| {
        json!({
            "base_rss_bytes": m.base_rss,
            "points": m.samples.iter().map(|s| json!({"connections": s.0, "rss_bytes": s.1, "slab_bytes": s.2})).collect::<Vec<_>>(),
            "user_bytes_per_conn": m.user.round(),
            "user_bytes_per_conn_median_slope": m.user_median.round(),
            "kernel_slab_bytes_per_conn_pair": m.kernel.round(),
            "kernel_slab_bytes_per_conn_pair_median_slope": m.kernel_median.round(),
            "load_errors": m.errors,
            "load_reports": m.reports,
        })
    };
    // The first variant's figures stay at the top level, as before the auth variants.
    let mut out = results.first().map(|(_, m)| json_of(m)).unwrap_or_else(|| json!({}));
    out["allocator"] = json!(allocator());
    out["cores"] = json!(cores);
    out["channels"] = json!(channels);
    out["conn_bytes"] = json!(conn_bytes);
    out["session_bytes"] = json!(session_bytes);
    out["auth"] = results.iter().map(|(n, m)| (n.clone(), json_of(m))).collect::<serde_json::Map<_, _>>().into();
    write_json("density", &out);
}

/// Holds idle subscribed connections at DENSITY_POINTS counts on a fresh server with `v`'s
/// `[auth]`, sampling server RSS and kernel slab at each.
fn measure(
    v: &AuthVariant,
    min: usize,
    max: usize,
    points: usize,
    cores: usize,
    channels: usize,
    rate: f64,
) -> Measured {
    let readiness: String = env_or("DENSITY_READINESS", "epoll".to_string());
    let config = format!("{}\n[io]\nreadiness = \"{readiness}\"\n", v.config);
    let mut server = serve(&format!("density-{}", v.name), cores, &config);
    std::thread::sleep(Duration::from_millis(500));
    let base_rss = rss_bytes(server.pid);
    let base_slab = slab_bytes();
    let url = v.url(&server.ws_url());
    let mut loads = Vec::new();
    let mut samples = Vec::new();
    let mut held = 0usize;
    for i in 0..points {
        let target = min + (max - min) * i / (points - 1);
        let step = target - held;
        if step > 0 {
            let args: Vec<String> = vec![
                "idle".into(),
                url.clone(),
                "--conns".into(),
                step.to_string(),
                "--channels".into(),
                channels.to_string(),
                "--hold".into(),
                "600s".into(),
                "--rate".into(),
                rate.to_string(),
                "--threads".into(),
                "1".into(),
                "--sources".into(),
                "127.0.0.2-127.0.0.254".into(),
            ];
            // The token stays out of the log.
            eprintln!("$ tether load idle {} --conns {step} … (auth {})", server.ws_url(), v.name);
            loads.push(spawn_load(&args));
            held = target;
        }
        let got = wait_connections(&server, held as u64, Duration::from_secs(60));
        // Let the allocator and the kernel settle (deferred frees, timers).
        std::thread::sleep(Duration::from_millis(1500));
        let rss = rss_bytes(server.pid);
        let slab = slab_bytes();
        eprintln!("density ({}): {got} connections, server RSS {} KiB, slab {} KiB", v.name, rss / 1024, slab / 1024);
        samples.push((got as f64, rss as f64, slab as f64));
    }
    let mut errors = 0.0;
    let mut reports = Vec::new();
    for child in loads {
        // The load processes end their hold on SIGTERM and report.
        // SAFETY: kill(2) on a child this bench started.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let report = finish_load(child);
        errors += num(&report, "errors");
        reports.push(report);
    }
    server.stop(STOP_GRACE);
    let rss_points: Vec<(f64, f64)> = samples.iter().map(|s| (s.0, s.1)).collect();
    let slab_points: Vec<(f64, f64)> = samples.iter().map(|s| (s.0, s.2)).collect();
    Measured {
        user: slope(&rss_points),
        kernel: slope(&slab_points),
        user_median: median_slope(&rss_points),
        kernel_median: median_slope(&slab_points),
        samples,
        base_rss,
        base_slab,
        errors,
        reports,
    }
}
