//! A pong that reached the server in time is not a pong timeout, even when the server reads it
//! late (docs/operations.md, heartbeats). The server is frozen (SIGSTOP) right after it pinged
//! peer A. While it is frozen, 2,000 other peers send a frame each and then A's pong goes out:
//! all of it waits in the server's socket buffers, A's pong behind more readiness reports than
//! the reactor takes in one pass. The server is thawed (SIGCONT) past A's pong deadline, so its
//! clock and its reactor both have work: whichever runs first, A must stay (it answers a request
//! afterwards), nobody is reaped for a pong timeout but a peer that never answers anything, and
//! that one still is.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

const PING_MS: u64 = 1000;
const PONG_MS: u64 = 300;
/// Peers whose frames are reported ahead of A's pong: more than one pass of the reactor
/// (`EVENTS_PER_WAIT` = 1,024 reports).
const NOISE: usize = 2000;

/// `tether_reaped_total{reason}` of `server`.
async fn reaped(server: &Server, reason: &str) -> f64 {
    server.metrics().await.sum("tether_reaped_total", &[&format!("reason=\"{reason}\"")])
}

/// Reads a noise peer until it ends, answering pings (tokio-tungstenite flushes the pong on its
/// next read); counts the peers that ended in `ended`.
async fn read_on(mut stream: futures::stream::SplitStream<Ws>, ended: Arc<AtomicUsize>) {
    while let Some(Ok(_)) = stream.next().await {}
    ended.fetch_add(1, Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pong_that_arrived_while_the_server_was_behind_is_read_before_its_deadline_judges() {
    let config = format!("[heartbeat]\nping_interval_ms = {PING_MS}\npong_timeout_ms = {PONG_MS}\n");
    let server = Server::start(&config, &["--cores", "1"]);

    // A peer that completes the handshake and then never reads or answers anything.
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    let head = format!(
        "GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        server.addr
    );
    silent.write_all(head.as_bytes()).await.expect("handshake");

    let ended = Arc::new(AtomicUsize::new(0));
    let mut sinks: Vec<SplitSink<Ws, Message>> = Vec::with_capacity(NOISE);
    for _ in 0..NOISE {
        let ws = tung::connect(&server.ws_url()).await;
        let (sink, stream) = ws.split();
        tokio::spawn(read_on(stream, ended.clone()));
        sinks.push(sink);
    }
    let mut a = tung::connect(&server.ws_url()).await;

    // A's first ping comes within 1.5 × the interval of its upgrade; the pong tungstenite
    // queues for it goes out only when A is flushed or read again.
    let end = Instant::now() + Duration::from_millis(3 * PING_MS);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, a.next()).await {
            Ok(Some(Ok(Message::Ping(_)))) => break,
            Ok(Some(Ok(_))) => {}
            other => panic!("A: no ping within {} ms: {other:?}", 3 * PING_MS),
        }
    }
    // SAFETY: kill(2) on the server this test started.
    unsafe { libc::kill(server.pid, libc::SIGSTOP) };
    let frozen = Instant::now();
    for sink in &mut sinks {
        sink.send(Message::Ping(b"noise".to_vec().into())).await.expect("noise frame");
    }
    a.flush().await.expect("A's pong out");
    let sent_by = frozen.elapsed();
    while frozen.elapsed() < Duration::from_millis(3 * PONG_MS) + sent_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SAFETY: as above.
    unsafe { libc::kill(server.pid, libc::SIGCONT) };

    // A is served after the thaw: it subscribes and gets its answer.
    tung::send(&mut a, json!({"op": "sub", "ch": "after.thaw"})).await;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, a.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(&t).expect("json");
                if v["op"] == "subscribed" {
                    break;
                }
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("A was not served after the thaw (sent its pong {sent_by:?} into the freeze): {other:?}"),
        }
    }
    assert_eq!(ended.load(Ordering::SeqCst), 0, "noise peers were cut");

    // Only the silent peer is reaped for a pong timeout (once its deadline passes).
    let limit = Duration::from_millis(3 * (PING_MS + PONG_MS));
    server.wait_metric("tether_reaped_total", &["reason=\"pong_timeout\""], limit, |n| n >= 1.0).await;
    assert_eq!(reaped(&server, "pong_timeout").await, 1.0, "a peer whose pong waited in its socket was reaped");
    assert_eq!(ended.load(Ordering::SeqCst), 0, "noise peers were cut");
    drop(silent);
}
