//! `tether load idle --latency-from-data` (the c1m bench's latency probe): 200 idle
//! subscribers in two `--procs` children, 3 stamped broadcasts published over HTTP; the merged
//! report counts 3 × 200 receptions with a latency distribution per seq, and ignores a message
//! without a stamp. Again with `--deflate` (issue 29) and broadcasts over `min_bytes`: every
//! connection agrees permessage-deflate, the server compresses them, and the load tool times
//! them after inflating.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{check, eventually_sync, http_request, seq_of_reply, within, KillOnDrop, Server};
use serde_json::Value;

const CONNS: u64 = 200;
const BROADCASTS: u64 = 3;

/// `tether_messages_delivered_total` (frames queued to subscribers) summed over cores.
async fn delivered(server: &Server) -> f64 {
    server.metrics().await.sum("tether_messages_delivered_total", &[])
}

/// Publishes `body` to `load.idle.0` and waits (up to `limit`) until the server has queued it
/// to every one of the subscribers; returns its seq and whether all got it.
async fn publish_to_all(server: &Server, body: &str, limit: Duration) -> (u64, bool) {
    let before = delivered(server).await;
    let (status, _, reply) = http_request(server.addr, "POST", "/publish/load.idle.0", &[], body.as_bytes()).await;
    assert_eq!(status, 200, "publish answered {status}: {}", String::from_utf8_lossy(&reply));
    let all = within(limit, || async { check(delivered(server).await - before >= CONNS as f64, || ()) }).await;
    (seq_of_reply(&reply), all.is_ok())
}

#[tokio::test]
async fn idle_latency_from_data_times_every_broadcast_on_every_subscriber() {
    times_every_broadcast(false).await;
}

#[tokio::test]
async fn idle_deflate_inflates_and_times_every_compressed_broadcast() {
    times_every_broadcast(true).await;
}

async fn times_every_broadcast(deflate: bool) {
    let server = Server::start("", &["--cores", "1"]);
    let mut load = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["load", "idle", &server.ws_url(), "--conns", &CONNS.to_string(), "--procs", "2"])
            .args(["--threads", "1", "--channels", "1", "--hold", "120s", "--latency-from-data"])
            .args(deflate.then_some("--deflate"))
            .env("TETHER_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("tether load starts"),
    );

    // Every subscriber is in when one unstamped message reaches all of them (connected is not
    // yet subscribed, so the connection gauge alone would not do).
    let ready_by = Instant::now() + Duration::from_secs(30);
    let mut warmups = 0;
    loop {
        warmups += 1;
        if publish_to_all(&server, r#"{"warmup":true}"#, Duration::from_secs(1)).await.1 {
            break;
        }
        assert!(Instant::now() < ready_by, "{CONNS} subscribers not all in after 30 s ({warmups} warm-ups)");
    }

    let mut seqs = Vec::new();
    for _ in 0..BROADCASTS {
        // Padded past the default `min_bytes` (256), so a deflate subscriber gets it compressed.
        let pad = if deflate { "x".repeat(400) } else { String::new() };
        let body = format!(r#"{{"t":{},"p":"{pad}"}}"#, tether_load::now_ns());
        let (seq, all) = publish_to_all(&server, &body, Duration::from_secs(10)).await;
        assert!(all, "broadcast seq {seq} not queued to all {CONNS} subscribers within 10 s");
        seqs.push(seq);
    }

    // SIGTERM ends the hold; the parent forwards it, merges its children's histograms, reports.
    // SAFETY: kill(2) on the load process this test started.
    unsafe {
        libc::kill(load.0.id() as i32, libc::SIGTERM);
    }
    let out = load.0.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || BufReader::new(out).lines().map_while(Result::ok).last());
    let status = eventually_sync(Duration::from_secs(30), "tether load exiting after SIGTERM", || {
        load.0.try_wait().expect("wait").ok_or("still running")
    });
    let last = reader.join().expect("reader").unwrap_or_default();
    let report: Value = serde_json::from_str(&last).unwrap_or_else(|e| panic!("report {last:?}: {e}"));
    assert!(status.success(), "exit {status:?}: {report}");
    assert_eq!(report["connections"], CONNS, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["procs"], 2, "{report}");
    assert_eq!(report["deflate_agreed"], if deflate { CONNS } else { 0 }, "{report}");
    let compressed = server.metrics().await.sum("tether_deflate_messages_total", &["result=\"compressed\""]);
    assert_eq!(compressed, if deflate { BROADCASTS as f64 } else { 0.0 }, "broadcasts compressed by the server");
    assert_eq!(report["broadcast_received"], CONNS * BROADCASTS, "{report}");
    let per_seq = report["broadcasts"].as_object().unwrap_or_else(|| panic!("no broadcasts in {report}"));
    let timed: Vec<u64> = per_seq.keys().map(|k| k.parse().expect("seq key")).collect();
    assert_eq!(timed, seqs, "only the stamped messages are timed: {report}");
    for (seq, b) in per_seq {
        assert_eq!(b["received"], CONNS, "seq {seq}: {b}");
        let (p50, p99, max) = (b["p50_ms"].as_f64(), b["p99_ms"].as_f64(), b["max_ms"].as_f64());
        let (Some(p50), Some(p99), Some(max)) = (p50, p99, max) else { panic!("seq {seq}: {b}") };
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "seq {seq}: {b}");
        assert!(max < 10_000.0, "seq {seq}: a loopback broadcast took {max} ms: {b}");
        let hist = &report["broadcast_hist"][seq];
        let counted: u64 = hist.as_array().expect("pairs").iter().map(|p| p[1].as_u64().expect("count")).sum();
        assert_eq!(counted, CONNS, "seq {seq}: histogram {hist}");
    }
}
