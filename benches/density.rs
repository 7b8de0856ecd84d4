//! Memory per idle subscribed connection (README, "Allocator"): server RSS (VmRSS) and
//! kernel slab (/proc/meminfo `Slab:`) sampled at several connection counts from DENSITY_MIN
//! to DENSITY_MAX; the per-connection cost is the least-squares slope.
//!
//! `cargo bench --bench density` (system allocator) and
//! `cargo bench --bench density --features mimalloc`. Env: DENSITY_MIN (1000), DENSITY_MAX
//! (19000; the server's open-file limit must exceed it), DENSITY_POINTS (7), DENSITY_CORES (2),
//! DENSITY_CHANNELS (100), DENSITY_RATE (new connections/s, 0 = unlimited).
//!
//! Slab is system-wide and both ends of each loopback connection live in this kernel, so the
//! slab slope covers a client socket and a server socket; it is also disturbed by anything
//! else running on the box.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

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

    let mut server = Serve::start("density", cores, 0, "");
    std::thread::sleep(Duration::from_millis(500));
    let base_rss = rss_bytes(server.pid);
    let base_slab = slab_bytes();
    let url = server.url();
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
            eprintln!("$ tether load {}", args.join(" "));
            loads.push(spawn_load(&args));
            held = target;
        }
        let got = server.wait_connections(held as u64, Duration::from_secs(60));
        // Let the allocator and the kernel settle (deferred frees, timers).
        std::thread::sleep(Duration::from_millis(1500));
        let rss = rss_bytes(server.pid);
        let slab = slab_bytes();
        eprintln!("density: {got} connections, server RSS {} KiB, slab {} KiB", rss / 1024, slab / 1024);
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
    server.stop();

    let rss_points: Vec<(f64, f64)> = samples.iter().map(|s| (s.0, s.1)).collect();
    let slab_points: Vec<(f64, f64)> = samples.iter().map(|s| (s.0, s.2)).collect();
    let user = slope(&rss_points);
    let kernel = slope(&slab_points);
    let user_median = median_slope(&rss_points);
    let kernel_median = median_slope(&slab_points);
    let rows: Vec<Vec<String>> = samples
        .iter()
        .map(|s| {
            vec![
                format!("{}", s.0),
                format!("{:.1}", s.1 / 1048576.0),
                format!("{:.1}", (s.1 - base_rss as f64) / s.0.max(1.0)),
                format!("{:.1}", (s.2 - base_slab as f64) / 1048576.0),
            ]
        })
        .collect();
    table(
        &format!("density ({} allocator, {cores} cores, {channels} channels)", allocator()),
        &["connections", "server RSS MiB", "RSS-base B/conn", "slab delta MiB"],
        &rows,
    );
    println!(
        "\n  user RSS per idle subscribed connection: {user:.0} B (least squares), {user_median:.0} B (median slope)"
    );
    println!("  kernel slab per connection pair (client + server socket): {kernel:.0} B (least squares), {kernel_median:.0} B (median slope)");
    println!("  load-generator errors: {errors}");
    write_json(
        "density",
        &json!({
            "allocator": allocator(),
            "cores": cores,
            "channels": channels,
            "base_rss_bytes": base_rss,
            "points": samples.iter().map(|s| json!({"connections": s.0, "rss_bytes": s.1, "slab_bytes": s.2})).collect::<Vec<_>>(),
            "user_bytes_per_conn": user.round(),
            "user_bytes_per_conn_median_slope": user_median.round(),
            "kernel_slab_bytes_per_conn_pair": kernel.round(),
            "kernel_slab_bytes_per_conn_pair_median_slope": kernel_median.round(),
            "load_errors": errors,
            "load_reports": reports,
        }),
    );
}
