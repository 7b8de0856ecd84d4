//! At-least-once publish (issue 4, "Cut publisher"; docs/protocol.md): a WebSocket publisher
//! (`tether::client`) sends 5,000 publishes with ids through a relay whose connections are
//! reset twice mid-stream. The outbox is resent after each reconnect and the server dedups by
//! id, so every publish is acked once with one seq and a subscriber sees each message once.

mod common;
mod delivery;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use delivery::*;
use serde_json::json;
use tether::client::{Client, ClientConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_cut_twice_gets_every_ack_and_subscribers_see_each_once() {
    let _serial = serial().await;
    const N: u64 = 5_000;
    let ch = "publish.cuts";
    let srv = Server::start("[[channels]]\npattern = \"*\"\nhistory = 10000\n", &["--cores", "2"]);
    let mut sub = RawWs::connect(srv.addr, "/ws").await;
    assert_eq!(sub.subscribe(ch).await["seq"], 0);

    let relay = Relay::start(srv.addr).await;
    let mut cfg = ClientConfig::new(relay.ws_url());
    cfg.seed = Some(11);
    let client = Client::connect(cfg).expect("client");
    let publisher = client.publisher();

    // Read the subscriber's stream concurrently so its queue never overflows.
    let reader = tokio::spawn(async move {
        let mut got: Vec<(u64, String)> = Vec::new();
        let end = Instant::now() + Duration::from_secs(60);
        while (got.len() as u64) < N {
            let f = sub.frame_skip_pings(end.saturating_duration_since(Instant::now())).await;
            got.push(msg_of(&f));
        }
        // Anything beyond N would be a duplicate delivery.
        while let Ok(next) = tokio::time::timeout(Duration::from_millis(300), sub.next(STEP)).await {
            match next {
                Ok(f) if f.opcode == OP_PING => {}
                Ok(f) => got.push(msg_of(&f)),
                Err(e) => panic!("subscriber stream ended: {e:?}"),
            }
        }
        got
    });

    let t0 = Instant::now();
    let mut handles = Vec::with_capacity(N as usize);
    let mut cuts = 0;
    for i in 1..=N {
        // About 2,500 publishes/s, so each cut finds publishes in flight.
        let due = t0 + Duration::from_secs_f64((i - 1) as f64 / 2500.0);
        tokio::time::sleep_until(due.into()).await;
        if i == 1_500 || i == 3_500 {
            relay.wait_accepts(cuts + 1, STEP).await;
            relay.cut();
            cuts += 1;
        }
        let id = format!("p-{i}");
        let h = publisher.send(ch, Some(id.clone()), &json!({"id": id, "i": i})).await.expect("send");
        handles.push((id, h));
    }
    let mut acks = Vec::with_capacity(N as usize);
    for (id, h) in handles {
        let ack = tokio::time::timeout(Duration::from_secs(30), h)
            .await
            .unwrap_or_else(|_| panic!("no ack for {id}"))
            .unwrap_or_else(|e| panic!("publish {id} failed: {e}"));
        assert_eq!(ack.id, id);
        assert_eq!(ack.ch, ch);
        acks.push((id, ack.seq));
    }
    let published = srv.metric("tether_messages_published_total", &[]).await;
    let dups = srv.metric("tether_publish_duplicates_total", &[]).await;
    eprintln!(
        "{N} publishes acked in {:?} over {} connections; server stored {published}, deduped {dups} resends",
        t0.elapsed(),
        relay.accepts()
    );
    assert_eq!(published, N as f64, "the server stored {published} messages for {N} ids");
    assert!(relay.accepts() >= 3, "the publisher reconnected only {} times", relay.accepts() - 1);
    // Resent in the original order: acked seqs follow the publish order.
    assert!(acks.windows(2).all(|w| w[0].1 < w[1].1), "acked seqs are not increasing in publish order");
    assert_eq!(acks.first().map(|a| a.1), Some(1));
    assert_eq!(acks.last().map(|a| a.1), Some(N), "a publish was stored twice");

    let got =
        tokio::time::timeout(Duration::from_secs(60), reader).await.expect("subscriber timed out").expect("subscriber");
    let seqs: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert_eq!(got.len() as u64, N, "subscriber saw {} messages, want {N}", got.len());
    assert!(seqs.iter().copied().eq(1..=N), "subscriber seqs are not 1..={N}");
    let ids: HashSet<&str> = got.iter().map(|g| g.1.as_str()).collect();
    assert_eq!(ids.len() as u64, N, "a data id was delivered twice");
    for (id, seq) in &acks {
        assert_eq!(got[*seq as usize - 1].1, *id, "seq {seq} carries another message than acked");
    }
    client.close().await;
}

/// `(seq, data.id)` of a `msg` frame.
fn msg_of(f: &Frame) -> (u64, String) {
    let v = f.json();
    assert_eq!(v["op"], "msg", "{v}");
    (v["seq"].as_u64().expect("seq"), v["data"]["id"].as_str().expect("data.id").to_string())
}
