//! `tether::client` with a token callback against a server with `[auth]` (docs/security.md):
//! on `token_expired` it sends `refresh` with a fresh token and keeps its connection; when no
//! newer token comes, the server closes with 4001 and the client reconnects with a fresh token
//! and resumes with no gap. A publisher streams steadily throughout.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::auth::*;
use common::*;
use serde_json::json;
use tether::client::{Client, ClientConfig, Event, TokenSource};

const CH: &str = "feed.client";
/// Messages published, one every 20 ms (about 5 s).
const N: u64 = 250;

/// Publishes `{"n":i}` for i in 1..=N on CH every 20 ms; returns the last seq.
fn stream(addr: std::net::SocketAddr) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut http = HttpConn::new(addr).await;
        let mut last = 0;
        for n in 1..=N {
            last = http.publish(CH, json!({ "n": n }).to_string().as_bytes()).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        last
    })
}

/// Waits for the `subscribed` of CH, so the stream starts after the subscription is live.
async fn subscribed(client: &mut Client) {
    loop {
        let ev = tokio::time::timeout(STEP, client.next_event()).await.expect("subscribed in time").expect("event");
        match ev {
            Event::Subscribed { seq: 0, .. } => return,
            Event::Connected { .. } => {}
            other => panic!("expected subscribed, got {other:?}"),
        }
    }
}

/// Reads events until N messages arrived (committing each); returns the seqs and the close
/// codes of the disconnects seen.
async fn receive(client: &mut Client) -> (Vec<u64>, Vec<Option<u16>>) {
    let (mut seqs, mut disconnects) = (Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(30);
    while (seqs.len() as u64) < N {
        let left = end.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, client.next_event())
            .await
            .unwrap_or_else(|_| panic!("stalled after {:?}; disconnects {disconnects:?}", seqs.last()))
            .expect("client event");
        match ev {
            Event::Message { ch, seq, .. } => {
                seqs.push(seq);
                client.commit(&ch, seq).await.expect("commit");
            }
            Event::Disconnected { code, .. } => disconnects.push(code),
            Event::Connected { .. } | Event::Subscribed { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    (seqs, disconnects)
}

/// Subscribes a client with `cfg` to CH, streams N messages and receives them all; returns
/// the client, the seqs received, the disconnect codes and the last seq published.
async fn run(srv: &Server, cfg: ClientConfig) -> (Client, Vec<u64>, Vec<Option<u16>>, u64) {
    let mut client = Client::connect(cfg).expect("client");
    client.subscribe(CH, None).expect("subscribe");
    subscribed(&mut client).await;
    let publisher = stream(srv.addr);
    let (seqs, disconnects) = receive(&mut client).await;
    let last = tokio::time::timeout(STEP, publisher).await.expect("publisher done").expect("publisher");
    (client, seqs, disconnects, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_refreshes_on_token_expired_without_reconnecting() {
    let _serial = serial().await;
    let srv = Server::start(&hs256_config(1000), &["--cores", "2"]);
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    // Each token lives 2 s: the 5 s stream outlives two or three of them.
    let source = TokenSource::from_fn(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        Ok(hs256(&claims("alice", now_s() + 2, &["feed.*"], &[])))
    });
    let (client, seqs, disconnects, last) = run(&srv, ClientConfig::new(srv.ws_url()).with_token(source)).await;
    assert_eq!(seqs, (1..=last).collect::<Vec<_>>(), "every seq once, in order");
    assert!(disconnects.is_empty(), "refreshes keep the connection: {disconnects:?}");
    assert_eq!(client.stats().connects, 1);
    let n = calls.load(Ordering::Relaxed);
    assert!(n >= 3, "the source was asked at connect and on each token_expired ({n} calls)");
    assert_eq!(srv.metric("tether_reaped_total", &["reason=\"token_expired\""]).await, 0.0);
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_4001_the_client_reconnects_with_a_fresh_token_and_resumes() {
    let _serial = serial().await;
    let srv = Server::start(&hs256_config(1000), &["--cores", "2"]);
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    // The first token is also all the source has on token_expired, so no refresh is sent and
    // the server closes with 4001; from the reconnect on, tokens are fresh.
    let first = hs256(&claims("alice", now_s() + 2, &["feed.*"], &[]));
    let source = TokenSource::from_fn(move || match counted.fetch_add(1, Ordering::Relaxed) {
        0 | 1 => Ok(first.clone()),
        _ => Ok(hs256(&claims("alice", now_s() + 600, &["feed.*"], &[]))),
    });
    let mut cfg = ClientConfig::new(srv.ws_url()).with_token(source);
    cfg.seed = Some(3);
    let (client, seqs, disconnects, last) = run(&srv, cfg).await;
    assert_eq!(disconnects, [Some(4001)], "one close 4001, then a reconnect");
    assert_eq!(seqs, (1..=last).collect::<Vec<_>>(), "resumed with no gap and no duplicate");
    assert_eq!(client.stats().connects, 2);
    assert_eq!(calls.load(Ordering::Relaxed), 3, "connect, token_expired (no newer token), reconnect");
    assert_eq!(srv.metric("tether_reaped_total", &["reason=\"token_expired\""]).await, 1.0);
    client.close().await;
}
