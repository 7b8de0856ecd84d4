//! The peer's close is answered ahead of a backlog (RFC 6455 §5.5.1: "as soon as practical";
//! docs/protocol.md, closing): a subscriber holding tens of MiB of queued deliveries sends its
//! close frame and reads on at a steady pace; it receives the server's close frame well within
//! `limits.close_timeout_ms`, after only what the kernel already held, and never a bare EOF.
//! Before, the answer waited behind the whole queue and the close deadline cut the connection
//! first (a FIN with no close frame), as seen by the C1M bench's close phase.

mod common;

use std::time::{Duration, Instant};

use common::*;

const CH: &str = "backlog";
/// 1024 messages of 64 KiB: 64 MiB queued for the subscriber, far past what the kernel holds
/// (net.ipv4.tcp_wmem's maximum, 4 MiB by default, plus the client's 4 KiB receive buffer).
const MESSAGES: u64 = 1024;
const DATA_BYTES: usize = 64 * 1024;
/// The subscriber reads at 16 MiB/s: the whole backlog would take 4 s, beyond the deadline.
const READ_BYTES_PER_SEC: f64 = 16.0 * 1024.0 * 1024.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peers_close_is_answered_ahead_of_queued_deliveries() {
    let config = "[limits]\nclose_timeout_ms = 2000\nqueue_max_bytes = 134217728\n\n\
                  [[channels]]\npattern = \"*\"\nhistory = 16\n";
    let srv = Server::start(config, &["--cores", "1"]);
    let mut sub = RawWs::upgrade(connect_small_rcvbuf(srv.addr, 4096).await, srv.addr, "/ws").await;
    sub.subscribe(CH).await;
    let mut http = HttpConn::new(srv.addr).await;
    let body = format!("\"{}\"", "x".repeat(DATA_BYTES - 2));
    for k in 1..=MESSAGES {
        assert_eq!(http.publish(CH, body.as_bytes()).await, k);
    }
    srv.wait_metric("tether_messages_delivered_total", &[], STEP, |v| v >= MESSAGES as f64).await;

    sub.send(OP_CLOSE, true, &1000u16.to_be_bytes()).await;
    let t0 = Instant::now();
    let (mut seqs, mut bytes) = (Vec::new(), 0usize);
    let close = loop {
        let f = match sub.next(Duration::from_secs(10)).await {
            Ok(f) => f,
            Err(e) => panic!(
                "the stream ended ({e:?}) without the server's close frame after {} messages in {:?}",
                seqs.len(),
                t0.elapsed()
            ),
        };
        match f.opcode {
            OP_TEXT => seqs.push(msg_seq(&f.payload)),
            OP_CLOSE => break f,
            _ => continue,
        }
        bytes += f.payload.len();
        let due = Duration::from_secs_f64(bytes as f64 / READ_BYTES_PER_SEC);
        if let Some(ahead) = due.checked_sub(t0.elapsed()) {
            tokio::time::sleep(ahead).await;
        }
    };
    let took = t0.elapsed();
    assert_eq!(close.close_code(), 1000, "our code echoed");
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "in order, no gap before the close: {seqs:?}");
    assert!(
        (seqs.len() as u64) < MESSAGES,
        "the close came only after the whole backlog ({} messages in {took:?})",
        seqs.len()
    );
    eprintln!("close frame after {} of {MESSAGES} queued messages, {took:?}", seqs.len());
    let (ended, frames) = sub.until_end(STEP).await;
    assert!(frames.is_empty(), "frames after the close: {}", frames.len());
    assert!(matches!(ended, Ended::Eof), "ended with {ended:?}");
    srv.wait_gauge(0.0, STEP).await;
}
