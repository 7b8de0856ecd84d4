//! Batched sends (`io.send_batch = "io_uring"`, docs/architecture.md, "The send path"): a
//! fan-out to many subscribers whose sends go out a chunk per `io_uring_enter` keeps every
//! rule of the per-connection `sendmsg` path. Readers get every seq in order exactly once;
//! subscribers that never read fill their sockets (the `EAGAIN` path) and are closed with 1013
//! when their queue overflows; a subscriber that resets mid-fan-out is reaped without
//! disturbing the others. The same run with `"sendmsg"` checks the two paths agree.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const CH: &str = "batch.ch";
/// Subscribers that read everything.
const READERS: usize = 64;
/// Subscribers with a 4 KiB receive buffer that never read.
const NON_READERS: usize = 8;
/// Bytes of each message's `data`.
const DATA_BYTES: usize = 4096;
/// The publisher stays at most this many messages ahead of the slowest reader, so no reader's
/// queue (256 KiB here) overflows: only the non-readers' do.
const AHEAD: u64 = 16;
/// The resetting subscriber resets its connection after reading this many messages.
const RESET_AFTER: u64 = 50;
/// Publishing stops once every non-reader was closed and at least this many were published.
const MIN_MESSAGES: u64 = 200;
/// Far beyond a non-reader's queue plus its socket buffers (at most 4 MiB on this kernel's
/// `tcp_wmem`): every non-reader must have overflowed well before.
const MAX_MESSAGES: u64 = 3000;

/// The `data` of message `k`: a JSON string starting with `k`, `DATA_BYTES` long.
fn body(k: u64) -> Vec<u8> {
    let mut s = format!("\"{k:010}:");
    s.push_str(&"x".repeat(DATA_BYTES - s.len() - 1));
    s.push('"');
    s.into_bytes()
}

/// Reads `msg` frames from `ws` and checks each is the next seq, from 1, with its own data,
/// until `last` (set by the publisher once it stopped) was read; `progress` is the last seq
/// read. Returns how many were read, and the connection (kept open).
async fn read_all(mut ws: RawWs, progress: Arc<AtomicU64>, last: Arc<AtomicU64>) -> (u64, RawWs) {
    let mut next = 1u64;
    let mut since = Instant::now();
    loop {
        let done = last.load(Ordering::SeqCst);
        if done != 0 && next > done {
            return (next - 1, ws);
        }
        // Short waits, so that a reader that has everything notices the publisher stopped
        // (a read cancelled while it waits consumes nothing).
        let Ok(f) = tokio::time::timeout(Duration::from_millis(50), ws.frame_skip_pings(STEP)).await else {
            assert!(since.elapsed() < STEP, "reader: no frame within {STEP:?} at seq {next}");
            continue;
        };
        since = Instant::now();
        assert_eq!(f.opcode, OP_TEXT, "reader got opcode {} at seq {next}", f.opcode);
        let seq = msg_seq(&f.payload);
        assert_eq!(seq, next, "reader: seq {seq} where {next} was due (a gap, a duplicate or a reorder)");
        let data_at = find(&f.payload, b"\"data\":\"").expect("data") + 8;
        let k: u64 = std::str::from_utf8(&f.payload[data_at..data_at + 10]).unwrap().parse().unwrap();
        assert_eq!(k, seq, "reader: the data of seq {seq} is message {k}'s");
        progress.store(seq, Ordering::SeqCst);
        next += 1;
    }
}

async fn fan_out_past_non_readers_and_a_reset(send_batch: &str) {
    // history = 16: the history ring is not what this test is about. close_timeout_ms =
    // 30000: the non-readers start reading only after the run and must still find their 1013.
    let config = format!(
        "[io]\nsend_batch = \"{send_batch}\"\n\n[limits]\nclose_timeout_ms = 30000\nqueue_max_bytes = 262144\n\
         max_publish_bytes = 65536\n\n[[channels]]\npattern = \"*\"\noverflow = \"disconnect\"\nhistory = 16\n"
    );
    let srv = Server::start(&config, &["--cores", "2"]);
    let rings = String::from_utf8_lossy(&srv.log_bytes()).matches("send ring ready").count();
    let want_rings = if send_batch == "io_uring" { 2 } else { 0 };
    assert_eq!(rings, want_rings, "cores with a send ring; log:\n{}", srv.log_tail(20));

    let mut non_readers = Vec::new();
    for _ in 0..NON_READERS {
        let mut ws = RawWs::upgrade(connect_small_rcvbuf(srv.addr, 4096).await, srv.addr, "/ws").await;
        ws.subscribe(CH).await;
        non_readers.push(ws);
    }
    let last = Arc::new(AtomicU64::new(0));
    let mut progress = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let mut ws = RawWs::connect(srv.addr, "/ws").await;
        ws.subscribe(CH).await;
        let p = Arc::new(AtomicU64::new(0));
        progress.push(p.clone());
        readers.push(tokio::spawn(read_all(ws, p, last.clone())));
    }
    let mut resetter = RawWs::connect(srv.addr, "/ws").await;
    resetter.subscribe(CH).await;
    let resetter = tokio::spawn(async move {
        for k in 1..=RESET_AFTER {
            let f = resetter.frame_skip_pings(STEP).await;
            assert_eq!(msg_seq(&f.payload), k, "resetter: out of order");
        }
        // SO_LINGER 0: the close sends a TCP RST while frames are still coming.
        set_rst_on_close(&resetter.s);
    });
    let all = (READERS + NON_READERS + 1) as f64;
    srv.wait_gauge(all, STEP).await;

    let t0 = Instant::now();
    let mut http = HttpConn::new(srv.addr).await;
    let mut k = 0;
    loop {
        k += 1;
        let wait_until = Instant::now() + STEP;
        loop {
            let slowest = progress.iter().map(|p| p.load(Ordering::SeqCst)).min().unwrap_or(0);
            if slowest + AHEAD >= k {
                break;
            }
            assert!(Instant::now() < wait_until, "the readers stalled at seq {slowest} (publishing {k})");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(http.publish(CH, &body(k)).await, k);
        if k >= MIN_MESSAGES && k % 50 == 0 {
            let closed = srv.metric("tether_overflow_total", &["policy=\"disconnect\""]).await;
            if closed >= NON_READERS as f64 {
                break;
            }
            assert!(k < MAX_MESSAGES, "only {closed} of {NON_READERS} non-readers overflowed after {k} messages");
        }
    }
    last.store(k, Ordering::SeqCst);
    let mut kept = Vec::new();
    for r in readers {
        let (got, ws) =
            tokio::time::timeout(Duration::from_secs(30), r).await.expect("reader timed out").expect("reader");
        assert_eq!(got, k);
        kept.push(ws);
    }
    tokio::time::timeout(STEP, resetter).await.expect("resetter timed out").expect("resetter");
    eprintln!("{send_batch}: {k} messages to {READERS} readers in {:?}", t0.elapsed());
    // The reset connection is reaped (whether the reset met a send or a read first); the
    // closed non-readers stay counted until their close handshake ends.
    srv.wait_gauge(all - 1.0, STEP).await;

    for (i, ws) in non_readers.iter_mut().enumerate() {
        // Reading again: whatever the kernel still held, in order from seq 1, then the 1013
        // close frame (the queue was dropped when it overflowed).
        let mut seqs = Vec::new();
        let close = loop {
            let f = ws.frame_skip_pings(STEP).await;
            match f.opcode {
                OP_TEXT => seqs.push(msg_seq(&f.payload)),
                OP_CLOSE => break f,
                other => panic!("non-reader {i}: unexpected opcode {other}"),
            }
        };
        assert_eq!(close.close_code(), 1013, "non-reader {i}: {:?}", String::from_utf8_lossy(&close.payload[2..]));
        assert!(
            seqs.iter().enumerate().all(|(j, &s)| s == j as u64 + 1),
            "non-reader {i}: before the close, seqs from 1 without gaps: {:?}…",
            &seqs[..seqs.len().min(20)]
        );
        assert!((seqs.len() as u64) < k, "non-reader {i} was not cut: {} messages", seqs.len());
        ws.send(OP_CLOSE, true, &1013u16.to_be_bytes()).await;
    }
    srv.wait_gauge(READERS as f64, STEP).await;
    drop(kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_sends_keep_order_overflow_and_reset_rules() {
    let _serial = serial().await;
    fan_out_past_non_readers_and_a_reset("io_uring").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sendmsg_path_agrees() {
    let _serial = serial().await;
    fan_out_past_non_readers_and_a_reset("sendmsg").await;
}
