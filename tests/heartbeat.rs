//! Heartbeats (docs/operations.md, heartbeats): server pings keep a connection alive through a
//! proxy that cuts idle connections, and a peer that never answers is reaped with its TCP
//! connection, its subscriptions and its gauge contribution.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

const IDLE_CUT: Duration = Duration::from_millis(2500);

/// A TCP relay that closes any connection with no bytes in either direction for `IDLE_CUT`,
/// like an ALB or nginx idle timeout. Returns its address and the number of cuts so far.
async fn idle_cutting_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cuts = Arc::new(AtomicUsize::new(0));
    let counter = cuts.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else { return };
                if relay(client, server).await {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (addr, cuts)
}

/// Copies both ways until either side ends (false) or the connection is idle too long (true).
async fn relay(mut a: TcpStream, mut b: TcpStream) -> bool {
    let (mut ar, mut aw) = a.split();
    let (mut br, mut bw) = b.split();
    let mut abuf = vec![0u8; 16384];
    let mut bbuf = vec![0u8; 16384];
    let mut deadline = tokio::time::Instant::now() + IDLE_CUT;
    loop {
        tokio::select! {
            r = ar.read(&mut abuf) => match r {
                Ok(0) | Err(_) => return false,
                Ok(n) => if bw.write_all(&abuf[..n]).await.is_err() { return false },
            },
            r = br.read(&mut bbuf) => match r {
                Ok(0) | Err(_) => return false,
                Ok(n) => if aw.write_all(&bbuf[..n]).await.is_err() { return false },
            },
            _ = tokio::time::sleep_until(deadline) => return true,
        }
        deadline = tokio::time::Instant::now() + IDLE_CUT;
    }
}

/// Subscribes through `url` and keeps reading (tungstenite answers pings) until `until`;
/// returns the stream and when each ping arrived (from `t0`), or panics if the connection ended.
async fn subscribe_and_idle(
    url: String,
    ch: &str,
    t0: Instant,
    until: Instant,
) -> (tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>, Vec<Duration>) {
    let mut ws = tung::connect(&url).await;
    tung::send(&mut ws, json!({"op": "sub", "ch": ch})).await;
    let mut pings = Vec::new();
    let deadline = tokio::time::Instant::from_std(until);
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => return (ws, pings),
            Ok(Some(Ok(Message::Ping(_)))) => pings.push(t0.elapsed()),
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                assert_eq!(v["op"], "subscribed", "{v}");
            }
            Ok(other) => panic!(
                "connection ended at {:?}, before the 6 s mark; pings arrived at {pings:?}: {other:?}",
                t0.elapsed()
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_keep_a_connection_through_an_idle_cutting_proxy() {
    let srv = Server::start("[heartbeat]\nping_interval_ms = 1000\n", &["--cores", "2"]);
    let (proxy, cuts) = idle_cutting_proxy(srv.addr).await;
    let t0 = Instant::now();
    let (mut ws, pings) =
        subscribe_and_idle(format!("ws://{proxy}/ws"), "proxy.ch", t0, t0 + Duration::from_secs(6)).await;
    assert_eq!(cuts.load(Ordering::SeqCst), 0, "the proxy cut the connection");
    assert!(pings.len() >= 4, "pings at {pings:?} in 6 s at ping_interval_ms = 1000");

    // The message published at 6 s arrives.
    let seq = srv.publish("proxy.ch", r#"{"at":"6s"}"#).await;
    loop {
        let m = tokio::time::timeout(STEP, ws.next()).await.expect("no msg").expect("ended").expect("ws error");
        if let Message::Text(t) = m {
            let v: Value = serde_json::from_str(&t).unwrap();
            assert_eq!((v["op"].as_str(), v["seq"].as_u64()), (Some("msg"), Some(seq)), "{v}");
            assert_eq!(v["data"], json!({"at": "6s"}));
            break;
        }
    }
    assert_eq!(cuts.load(Ordering::SeqCst), 0);
}

/// Control: without frequent pings the same proxy does cut, so the test above means something.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_cuts_a_quiet_connection() {
    let srv = Server::start("[heartbeat]\nping_interval_ms = 60000\n", &["--cores", "1"]);
    let (proxy, cuts) = idle_cutting_proxy(srv.addr).await;
    let mut ws = tung::connect(&format!("ws://{proxy}/ws")).await;
    let t0 = Instant::now();
    while let Some(Ok(_)) = tokio::time::timeout(Duration::from_secs(6), ws.next()).await.expect("the proxy never cut")
    {
    }
    assert!(t0.elapsed() >= Duration::from_secs(2), "cut after {:?}", t0.elapsed());
    assert_eq!(cuts.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peer_is_reaped_and_leaves_no_trace() {
    let srv = Server::start("[heartbeat]\nping_interval_ms = 1000\npong_timeout_ms = 2000\n", &["--cores", "2"]);

    // A healthy subscriber (tungstenite answers pings) kept reading in the background.
    let mut healthy = tung::connect(&srv.ws_url()).await;
    tung::send(&mut healthy, json!({"op": "sub", "ch": "healthy.ch"})).await;
    let (msg_tx, mut msg_rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let healthy_task = tokio::spawn(async move {
        while let Some(Ok(m)) = healthy.next().await {
            if let Message::Text(t) = m {
                let _ = msg_tx.send(serde_json::from_str(&t).unwrap());
            }
        }
    });
    // A peer that never answers pings but sends its own frames: any inbound frame is liveness.
    let mut chatty = RawWs::connect(srv.addr, "/ws").await;
    chatty.subscribe("chatty.ch").await;
    let chatty_task = tokio::spawn(async move {
        let end = Instant::now() + Duration::from_secs(7);
        while Instant::now() < end {
            chatty.send(OP_PING, true, b"alive").await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            // Drain what arrived (server pings, our pongs) without answering anything.
            while let Ok(Ok(f)) =
                tokio::time::timeout(Duration::from_millis(1), chatty.next(Duration::from_secs(1))).await
            {
                assert_ne!(f.opcode, OP_CLOSE, "a peer sending frames was closed: {f:?}");
            }
        }
        chatty
    });

    let mut silent = RawWs::connect(srv.addr, "/ws").await;
    silent.subscribe("silent.ch").await;
    let t0 = Instant::now();
    srv.wait_gauge(3.0, STEP).await;

    // Read (never write) until the server ends the TCP connection.
    let (ended, frames) = silent.until_end(Duration::from_secs(6)).await;
    let reaped_after = t0.elapsed();
    let pings = frames.iter().filter(|f| f.opcode == OP_PING).count();
    assert!(pings >= 1, "the silent peer saw no ping: {frames:?}");
    assert!(
        reaped_after >= Duration::from_millis(1800),
        "reaped after {reaped_after:?}, before any pong deadline could pass"
    );
    eprintln!("silent peer reaped after {reaped_after:?} ({ended:?}, {pings} pings)");

    // The gauge is exact at once: the healthy and the chatty peers remain.
    srv.wait_gauge(2.0, Duration::from_millis(500)).await;
    srv.wait_metric("tether_reaped_total", &["reason=\"pong_timeout\""], STEP, |v| v == 1.0).await;

    // A publish to the silent peer's channel reaches no one.
    let delivered = srv.metric("tether_messages_delivered_total", &[]).await;
    srv.publish("silent.ch", r#"{"to":"nobody"}"#).await;
    // Fence: a publish to the healthy channel arrives, so the first one has been fanned out.
    let seq = srv.publish("healthy.ch", r#"{"to":"healthy"}"#).await;
    loop {
        let v = tokio::time::timeout(STEP, msg_rx.recv()).await.expect("healthy got nothing").expect("healthy ended");
        if v["op"] == "msg" {
            assert_eq!(v["seq"].as_u64(), Some(seq), "{v}");
            break;
        }
    }
    let after = srv.metric("tether_messages_delivered_total", &[]).await;
    assert_eq!(after - delivered, 1.0, "only the healthy subscriber's message is delivered");

    let chatty = tokio::time::timeout(Duration::from_secs(10), chatty_task)
        .await
        .expect("chatty timed out")
        .expect("chatty panicked");
    drop(chatty);
    healthy_task.abort();
    srv.wait_gauge(0.0, STEP).await;
}
