//! Slow subscribers (docs/operations.md, slow subscribers): a subscriber with a small
//! `SO_RCVBUF` that stops reading never slows the publisher or a reading subscriber, server
//! memory stays bounded, and the channel's overflow policy decides what the non-reader sees.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const CH: &str = "slow.ch";
/// 1024 messages of 64 KiB: 64 MiB in all.
const MESSAGES: u64 = 1024;
const DATA_BYTES: usize = 64 * 1024;
/// The publisher stays at most this many messages ahead of the reading subscriber, so the
/// reader's own queue (2 MiB default) never overflows: the test is about the non-reader.
const AHEAD: u64 = 8;
const RSS_BUDGET_KIB: u64 = 48 * 1024;

/// The `data` of message `k`: a JSON string starting with `k`, `DATA_BYTES` long in all.
fn body(k: u64) -> Vec<u8> {
    let mut s = format!("\"{k:010}:");
    s.push_str(&"x".repeat(DATA_BYTES - s.len() - 1));
    s.push('"');
    s.into_bytes()
}

/// The seq prefix of a `data` string.
fn data_k(data: &str) -> u64 {
    data[..10].parse().unwrap_or_else(|_| panic!("bad data prefix {:?}", &data[..20.min(data.len())]))
}

/// Samples the server's VmRSS until stopped; returns the maximum seen (KiB).
fn rss_sampler(pid: i32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let path = format!("/proc/{pid}/status");
        let mut max = 0;
        while !stop.load(Ordering::SeqCst) {
            let status = std::fs::read_to_string(&path).unwrap_or_default();
            if let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            {
                max = u64::max(max, kib);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        max
    })
}

struct Run {
    srv: Server,
    non_reader: RawWs,
}

/// Starts a server whose channels use `policy`, subscribes a non-reader and a reader, publishes
/// 64 MiB over HTTP keep-alive and checks the reader got all of it in order and the RSS bound.
async fn publish_64mib_past_a_non_reader(policy: &str) -> Run {
    // history = 16: the history ring would otherwise keep 1000 × 64 KiB = 64 MiB by design, which
    // is not what this test measures. close_timeout_ms = 30000: the non-reader starts reading only
    // after the whole run, and must still find its 1013 then (docs/protocol.md, close codes).
    let config = format!(
        "[limits]\nclose_timeout_ms = 30000\n\n[[channels]]\npattern = \"*\"\noverflow = \"{policy}\"\nhistory = 16\n"
    );
    let srv = Server::start(&config, &["--cores", "2"]);

    let mut non_reader = RawWs::upgrade(connect_small_rcvbuf(srv.addr, 4096).await, srv.addr, "/ws").await;
    non_reader.subscribe(CH).await;

    let mut reader = tung::connect(&srv.ws_url()).await;
    tung::send(&mut reader, json!({"op": "sub", "ch": CH})).await;
    // The first publish goes out only once the reader is subscribed (its connection being
    // counted is not enough: the `sub` may still be on its way to the channel's home core).
    loop {
        let m = tokio::time::timeout(STEP, reader.next()).await.expect("no reply to sub").expect("reader ended");
        if let Message::Text(t) = m.expect("reader ws error") {
            let v: Value = serde_json::from_str(&t).unwrap();
            assert_eq!(v["op"], "subscribed", "reply to sub: {t}");
            break;
        }
    }
    let progress = Arc::new(AtomicU64::new(0));
    let seen = progress.clone();
    let reader_task = tokio::spawn(async move {
        let mut next = 1u64;
        while next <= MESSAGES {
            let m = tokio::time::timeout(STEP, reader.next())
                .await
                .expect("reader starved")
                .expect("reader ended")
                .expect("reader ws error");
            let Message::Text(t) = m else { continue };
            let v: Value = serde_json::from_str(&t).unwrap();
            assert_eq!(v["op"], "msg", "reader got {:?}", &t[..t.len().min(200)]);
            assert_eq!(v["seq"].as_u64(), Some(next), "reader: out of order or gap");
            assert_eq!(data_k(v["data"].as_str().unwrap()), next, "reader: wrong data for seq {next}");
            seen.store(next, Ordering::SeqCst);
            next += 1;
        }
        reader
    });
    srv.wait_gauge(2.0, STEP).await;

    let baseline = srv.rss_kib();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = rss_sampler(srv.pid, stop.clone());
    let t0 = Instant::now();
    let mut http = HttpConn::new(srv.addr).await;
    for k in 1..=MESSAGES {
        let wait_until = Instant::now() + STEP;
        while progress.load(Ordering::SeqCst) + AHEAD < k {
            assert!(Instant::now() < wait_until, "the reader stalled at seq {}", progress.load(Ordering::SeqCst));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(http.publish(CH, &body(k)).await, k);
    }
    let reader = tokio::time::timeout(Duration::from_secs(30), reader_task)
        .await
        .expect("reader timed out")
        .expect("reader panicked");
    let took = t0.elapsed();
    stop.store(true, Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    eprintln!(
        "{policy}: 64 MiB published in {took:?}; RSS baseline {baseline} KiB, peak {peak} KiB (+{} KiB)",
        peak.saturating_sub(baseline)
    );
    assert!(
        peak.saturating_sub(baseline) < RSS_BUDGET_KIB,
        "{policy}: server RSS grew by {} KiB (budget {RSS_BUDGET_KIB})",
        peak - baseline
    );
    drop(reader);
    Run { srv, non_reader }
}

/// Reads `msg` frames (skipping pings) until seq `last`; returns the seqs seen, in order.
async fn read_msgs_until(ws: &mut RawWs, last: u64) -> Vec<u64> {
    let mut seqs = Vec::new();
    loop {
        let f = ws.frame_skip_pings(STEP).await;
        assert_eq!(
            f.opcode,
            OP_TEXT,
            "expected a msg, got opcode {} ({:?})",
            f.opcode,
            &f.payload[..f.payload.len().min(120)]
        );
        let seq = msg_seq(&f.payload);
        if let Some(&prev) = seqs.last() {
            assert!(seq > prev, "seq went from {prev} to {seq}");
        }
        seqs.push(seq);
        if seq >= last {
            return seqs;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_policy_closes_the_non_reader_with_1013() {
    let _serial = serial().await;
    let Run { srv, mut non_reader } = publish_64mib_past_a_non_reader("disconnect").await;
    srv.wait_metric("tether_overflow_total", &["policy=\"disconnect\""], STEP, |v| v >= 1.0).await;

    // Reading again: whatever the kernel still held, then the 1013 close frame, then nothing.
    let mut seqs = Vec::new();
    let close = loop {
        let f = non_reader.frame_skip_pings(Duration::from_secs(10)).await;
        match f.opcode {
            OP_TEXT => seqs.push(msg_seq(&f.payload)),
            OP_CLOSE => break f,
            other => panic!("unexpected opcode {other}"),
        }
    };
    assert_eq!(close.close_code(), 1013, "close reason {:?}", String::from_utf8_lossy(&close.payload[2..]));
    let reason: Value = serde_json::from_slice(&close.payload[2..])
        .unwrap_or_else(|e| panic!("1013 reason {:?} is not JSON: {e}", String::from_utf8_lossy(&close.payload[2..])));
    assert!(reason["retry_after_ms"].is_u64(), "1013 reason carries a retry hint: {reason}");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "before the close, messages are in order without gaps: {seqs:?}"
    );
    assert!((seqs.len() as u64) < MESSAGES, "the non-reader was not cut: {} messages", seqs.len());
    eprintln!("disconnect: non-reader read {} messages then 1013 {reason}", seqs.len());
    non_reader.send(OP_CLOSE, true, &1013u16.to_be_bytes()).await;
    let (_ended, frames) = non_reader.until_end(STEP).await;
    assert!(frames.is_empty(), "frames after the close: {}", frames.len());
    srv.wait_gauge(0.0, STEP).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_oldest_policy_keeps_the_non_reader_with_a_seq_gap() {
    let _serial = serial().await;
    let Run { srv, mut non_reader } = publish_64mib_past_a_non_reader("drop-oldest").await;
    srv.wait_metric("tether_overflow_total", &["policy=\"drop-oldest\""], STEP, |v| v >= 1.0).await;
    srv.wait_gauge(1.0, STEP).await; // the reader has left; the non-reader stays connected

    let seqs = read_msgs_until(&mut non_reader, MESSAGES).await;
    assert_eq!(seqs.last(), Some(&MESSAGES), "the newest message is kept");
    assert!((seqs.len() as u64) < MESSAGES, "no seq gap: all {} messages arrived", seqs.len());
    eprintln!("drop-oldest: non-reader got {} of {MESSAGES}", seqs.len());

    // Still subscribed and live.
    let seq = srv.publish(CH, "\"after\"").await;
    assert_eq!(read_msgs_until(&mut non_reader, seq).await, vec![seq]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflate_policy_delivers_the_latest_message() {
    let _serial = serial().await;
    let Run { srv, mut non_reader } = publish_64mib_past_a_non_reader("conflate").await;
    srv.wait_metric("tether_overflow_total", &["policy=\"conflate\""], STEP, |v| v >= 1.0).await;
    srv.wait_gauge(1.0, STEP).await; // the reader has left; the non-reader stays connected

    let seqs = read_msgs_until(&mut non_reader, MESSAGES).await;
    assert_eq!(seqs.last(), Some(&MESSAGES), "the latest message arrives");
    assert!((seqs.len() as u64) < MESSAGES, "nothing was conflated: all {} messages arrived", seqs.len());
    eprintln!("conflate: non-reader got {} of {MESSAGES}", seqs.len());

    let seq = srv.publish(CH, "\"after\"").await;
    assert_eq!(read_msgs_until(&mut non_reader, seq).await, vec![seq]);
}
