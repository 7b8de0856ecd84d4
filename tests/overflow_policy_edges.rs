//! The overflow policies at their edges (docs/operations.md, slow subscribers), with a raw
//! subscriber whose receive buffer is 4 KiB and that does not read until the end:
//! - a `drop-oldest` subscriber whose queue the channel keeps full is not closed by the
//!   server's own heartbeat pings (a reply takes the place of the oldest droppable message);
//! - the messages of a channel queued before its `unsub` all arrive, even when the next
//!   channel the connection subscribes to gets the same local index and overflows;
//! - a `conflate` subscriber of more channels than its queue has slots gets the newest value
//!   of every one of them when it reads again.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Sends one unsolicited pong (a liveness signal the server accepts from a peer that is not
/// reading its pings).
async fn pong(ws: &mut RawWs) {
    ws.send(OP_PONG, true, b"").await;
}

/// A subscriber of `channels` with a 4 KiB receive buffer, which then reads nothing until the
/// test says so.
async fn non_reader(srv: &Server, channels: &[&str]) -> RawWs {
    let mut ws = RawWs::upgrade(connect_small_rcvbuf(srv.addr, 4096).await, srv.addr, "/ws").await;
    for ch in channels {
        ws.subscribe(ch).await;
    }
    ws
}

/// The `data` of message `k`: a JSON string of `len` bytes starting with `k`.
fn body(k: u64, len: usize) -> String {
    format!("\"{k:06}{}\"", "p".repeat(len - 8))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_oldest_non_reader_is_not_closed_by_the_heartbeat() {
    let _serial = serial().await;
    // Pings every 200 ms; the non-reader sends a pong every 50 ms (it never reads the pings),
    // so the server keeps pinging it while its queue is full.
    let config = "[limits]\nqueue_max_messages = 64\n\n[heartbeat]\nping_interval_ms = 200\n\
                  pong_timeout_ms = 60000\n\n[[channels]]\npattern = \"*\"\noverflow = \"drop-oldest\"\n";
    let srv = Server::start(config, &["--cores", "2"]);
    let mut ws = non_reader(&srv, &["d.ch"]).await;

    const N: u64 = 3000;
    let mut http = HttpConn::new(srv.addr).await;
    for k in 1..=N {
        // 4 KiB each: 12 MiB in all, more than the kernel's buffers take (tcp_wmem's maximum
        // is 4 MiB), so the queue fills.
        assert_eq!(http.publish("d.ch", body(k, 4096).as_bytes()).await, k);
        if k % 200 == 0 {
            pong(&mut ws).await;
        }
    }
    srv.wait_metric("tether_overflow_total", &["policy=\"drop-oldest\""], STEP, |v| v >= 1.0).await;
    // Three more pings while the queue is full.
    let pings = srv.metric("tether_pings_sent_total", &[]).await;
    let end = Instant::now() + STEP;
    while srv.metric("tether_pings_sent_total", &[]).await < pings + 3.0 {
        assert!(Instant::now() < end, "the server stopped pinging the non-reader");
        pong(&mut ws).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        srv.metric("tether_overflow_total", &["policy=\"disconnect\""]).await,
        0.0,
        "a reply overflowed the full queue and closed the connection with 1013"
    );
    assert_eq!(srv.metric("tether_connections", &[]).await, 1.0);

    // Reading now: increasing seqs up to the last (with the gap drop-oldest makes), no close.
    let mut last = 0;
    let mut got = 0;
    while last < N {
        let f = ws.frame_skip_pings(STEP).await;
        assert_eq!(
            f.opcode,
            OP_TEXT,
            "expected a msg, got opcode {} {:?}",
            f.opcode,
            String::from_utf8_lossy(&f.payload)
        );
        let seq = msg_seq(&f.payload);
        assert!(seq > last, "seq went from {last} to {seq}");
        last = seq;
        got += 1;
    }
    assert!(got < N, "nothing was dropped: the queue never filled");
    eprintln!("drop-oldest non-reader: {got} of {N} messages, 0 closed by a ping");
    let seq = srv.publish("d.ch", "\"after\"").await;
    assert_eq!(msg_seq(&ws.frame_skip_pings(STEP).await.payload), seq, "still subscribed and live");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_queued_before_unsub_survive_the_overflow_of_the_next_channel() {
    let _serial = serial().await;
    // `x.*` is `disconnect` (the default), `y.*` is `conflate`. One core, so the non-reader's
    // `sub y.1` takes the local channel index `x.1` had.
    let config = "[limits]\nqueue_max_messages = 4096\nqueue_max_bytes = 67108864\n\n\
                  [[channels]]\npattern = \"y.*\"\noverflow = \"conflate\"\n";
    let srv = Server::start(config, &["--cores", "1"]);
    let mut ws = non_reader(&srv, &["x.1"]).await;

    // 3,000 messages of 4 KiB: 12 MiB, more than the kernel's buffers take (tcp_wmem's
    // maximum is 4 MiB), so most of them wait in the connection's queue.
    const N: u64 = 3000;
    let mut http = HttpConn::new(srv.addr).await;
    for k in 1..=N {
        assert_eq!(http.publish("x.1", body(k, 4096).as_bytes()).await, k);
    }
    ws.send_json(&serde_json::json!({"op": "unsub", "ch": "x.1"})).await;
    ws.send_json(&serde_json::json!({"op": "sub", "ch": "y.1"})).await;
    // Publish to y.1 until its conflate policy has had to make room (the queue is full).
    let end = Instant::now() + Duration::from_secs(30);
    let mut y = 0;
    while srv.metric("tether_overflow_total", &["policy=\"conflate\""]).await < 1.0 {
        assert!(Instant::now() < end, "y.1 never overflowed after {y} publishes");
        for _ in 0..500 {
            y = http.publish("y.1", b"1").await;
        }
    }

    // Every x.1 message, in order, then y.1's.
    let mut next_x = 1;
    let mut last_y = 0;
    loop {
        let f = ws.frame_skip_pings(STEP).await;
        assert_eq!(f.opcode, OP_TEXT, "unexpected opcode {}", f.opcode);
        let v = f.json();
        match (v["op"].as_str(), v["ch"].as_str()) {
            (Some("msg"), Some("x.1")) => {
                assert_eq!(v["seq"].as_u64(), Some(next_x), "x.1: a gap or a reorder");
                next_x += 1;
            }
            (Some("subscribed"), Some("y.1")) | (Some("unsubscribed"), Some("x.1")) => {}
            (Some("msg"), Some("y.1")) => {
                let seq = v["seq"].as_u64().expect("seq");
                assert!(seq > last_y, "y.1 went from {last_y} to {seq}");
                last_y = seq;
                if seq == y {
                    break;
                }
            }
            _ => panic!("unexpected frame {v}"),
        }
    }
    assert_eq!(next_x, N + 1, "x.1 messages queued before the unsub were lost: got {} of {N}", next_x - 1);
    eprintln!("x.1: all {N} messages; y.1 up to {y}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflate_non_reader_gets_the_newest_value_of_every_channel() {
    let _serial = serial().await;
    let config = "[limits]\nqueue_max_messages = 16\n\n[[channels]]\npattern = \"*\"\noverflow = \"conflate\"\n";
    let srv = Server::start(config, &["--cores", "2"]);
    const CHANNELS: usize = 20;
    const ROUNDS: u64 = 200;
    let names: Vec<String> = (0..CHANNELS).map(|c| format!("c.{c}")).collect();
    let mut ws = non_reader(&srv, &names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    // 4,000 messages of 2 KiB: 8 MiB, more than the kernel's buffers take, into a queue of 16.
    let mut http = HttpConn::new(srv.addr).await;
    for round in 1..=ROUNDS {
        for name in &names {
            assert_eq!(http.publish(name, body(round, 2048).as_bytes()).await, round);
        }
    }
    srv.wait_metric("tether_overflow_total", &["policy=\"conflate\""], STEP, |v| v >= 1.0).await;

    // Reading now: every channel's values increase and end at its newest.
    let mut last = [0u64; CHANNELS];
    let mut got = 0;
    while last.iter().any(|&l| l < ROUNDS) {
        let f = ws.frame_skip_pings(STEP).await;
        assert_eq!(f.opcode, OP_TEXT, "unexpected opcode {}", f.opcode);
        let v = f.json();
        assert_eq!(v["op"], "msg", "unexpected frame {v}");
        let c: usize = v["ch"].as_str().and_then(|c| c.strip_prefix("c.")).and_then(|c| c.parse().ok()).expect("ch");
        let seq = v["seq"].as_u64().expect("seq");
        assert!(seq > last[c], "c.{c} went from {} to {seq}", last[c]);
        last[c] = seq;
        got += 1;
    }
    assert!(got < CHANNELS * ROUNDS as usize, "nothing was conflated");
    eprintln!(
        "conflate non-reader: {got} of {} messages, the newest of all {CHANNELS} channels",
        CHANNELS * ROUNDS as usize
    );
}
