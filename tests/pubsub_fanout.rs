//! Pub/sub end to end with `--cores 2`: 240 independent (tokio-tungstenite) subscribers spread
//! over both cores, plus 8 of tether's own clients, each get seq 1..N in order exactly once;
//! HTTP publish, `Idempotency-Key` dedup, WS `pub`/`ack` dedup, and publishes through
//! `tether::client` (docs/protocol.md).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::tung::{next_json, Ws};
use common::*;
use serde_json::{json, Value};
use tether::client::{Client, ClientConfig, Event};

const SUBSCRIBERS: usize = 240;
const OWN_CLIENTS: usize = 8;
const CH: &str = "fanout.news";

async fn subscriber(url: String) -> Ws {
    let mut ws = tung::connect(&url).await;
    tung::send(&mut ws, json!({"op": "sub", "ch": CH})).await;
    let v = next_json(&mut ws).await;
    assert_eq!(v["op"], "subscribed", "{v}");
    assert_eq!(v["ch"], CH, "{v}");
    assert_eq!(v["seq"], 0, "a new channel's head is 0: {v}");
    ws
}

/// WS `pub` and its `ack`.
async fn ws_pub(ws: &mut Ws, id: &str, data: Value) -> u64 {
    tung::send(ws, json!({"op": "pub", "ch": CH, "id": id, "data": data})).await;
    let v = next_json(ws).await;
    assert_eq!(v["op"], "ack", "{v}");
    assert_eq!(v["id"], id, "ack repeats the id: {v}");
    assert_eq!(v["ch"], CH, "ack repeats the channel: {v}");
    v["seq"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subscriber_gets_every_seq_once_in_order() {
    let srv = Server::start("", &["--cores", "2"]);
    let url = srv.ws_url();

    let subs = futures::future::join_all((0..SUBSCRIBERS).map(|_| subscriber(url.clone()))).await;
    srv.wait_gauge(SUBSCRIBERS as f64, STEP).await;
    let m = srv.metrics().await;
    let per_core: Vec<f64> = ["core=\"0\"", "core=\"1\""].iter().map(|c| m.sum("tether_connections", &[c])).collect();
    assert!(per_core.iter().all(|&n| n > 0.0), "subscribers must be on both cores: {per_core:?}");

    // tether's own clients, subscribed live at the head (0).
    let mut own = Vec::new();
    for _ in 0..OWN_CLIENTS {
        let mut cfg = ClientConfig::new(url.clone());
        cfg.seed = Some(7);
        let mut c = Client::connect(cfg).expect("tether client");
        c.subscribe(CH, None).expect("subscribe");
        loop {
            match tokio::time::timeout(STEP, c.next_event()).await.expect("no Subscribed event").expect("client error")
            {
                Event::Subscribed { ch, seq, .. } => {
                    assert_eq!((ch.as_str(), seq), (CH, 0));
                    break;
                }
                Event::Connected { .. } => {}
                other => panic!("tether client: unexpected {other:?}"),
            }
        }
        own.push(c);
    }
    srv.wait_gauge((SUBSCRIBERS + OWN_CLIENTS) as f64, STEP).await;
    let own_readers: Vec<_> = own
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut got: Vec<(u64, Value)> = Vec::new();
                loop {
                    let ev = tokio::time::timeout(STEP, c.next_event())
                        .await
                        .expect("tether client starved")
                        .expect("client error");
                    let Event::Message { ch, seq, data, .. } = ev else { panic!("tether client: unexpected {ev:?}") };
                    assert_eq!(ch, CH);
                    let data: Value = serde_json::from_str(data.get()).unwrap();
                    c.commit(&ch, seq).await.unwrap();
                    let sentinel = data["sentinel"] == true;
                    got.push((seq, data));
                    if sentinel {
                        c.close().await;
                        return got;
                    }
                }
            })
        })
        .collect();

    // Readers run while publishing, so nothing piles up in any queue.
    let readers: Vec<_> = subs
        .into_iter()
        .map(|mut ws| {
            tokio::spawn(async move {
                let mut got: Vec<(u64, Value)> = Vec::new();
                loop {
                    let v = next_json(&mut ws).await;
                    assert_eq!(v["op"], "msg", "{v}");
                    assert_eq!(v["ch"], CH, "{v}");
                    let seq = v["seq"].as_u64().unwrap();
                    let sentinel = v["data"]["sentinel"] == true;
                    got.push((seq, v["data"].clone()));
                    if sentinel {
                        return got;
                    }
                }
            })
        })
        .collect();

    let mut expected: BTreeMap<u64, Value> = BTreeMap::new();
    let mut http = HttpConn::new(srv.addr).await;

    // HTTP publish over one keep-alive connection: consecutive seqs from 1.
    for k in 1..=20u64 {
        let data = json!({"via": "http", "k": k});
        let seq = http.publish(CH, data.to_string().as_bytes()).await;
        assert_eq!(seq, k, "sequential publishes get consecutive seqs");
        expected.insert(seq, data);
    }
    // A non-JSON body is refused with 400 and publishes nothing.
    let (status, _) = http.post(&format!("/publish/{CH}"), &[], b"not json").await;
    assert_eq!(status, 400);

    // Idempotency-Key: the retry gets the original seq and is not published again.
    let data = json!({"via": "http", "idem": true});
    let path = format!("/publish/{CH}");
    let (status, body) = http.post(&path, &[("Idempotency-Key", "idem-1")], data.to_string().as_bytes()).await;
    assert_eq!(status, 200);
    let idem_seq = seq_of_reply(&body);
    assert_eq!(idem_seq, 21);
    expected.insert(idem_seq, data.clone());
    let (status, body) = http.post(&path, &[("Idempotency-Key", "idem-1")], data.to_string().as_bytes()).await;
    assert_eq!(status, 200);
    assert_eq!(seq_of_reply(&body), idem_seq, "duplicate Idempotency-Key gets the original seq");

    // WS pub/ack, then a duplicate id: the original ack, no second delivery.
    let mut publisher = tung::connect(&url).await;
    let mut acks = BTreeMap::new();
    for k in 1..=20u64 {
        let data = json!({"via": "ws", "k": k});
        let id = format!("p-{k}");
        let seq = ws_pub(&mut publisher, &id, data.clone()).await;
        assert_eq!(seq, idem_seq + k, "ws publishes continue the sequence");
        expected.insert(seq, data);
        acks.insert(id, seq);
    }
    for id in ["p-5", "p-20", "p-5"] {
        let seq = ws_pub(&mut publisher, id, json!({"via": "ws", "dup": id})).await;
        assert_eq!(seq, acks[id], "duplicate id {id} gets the original ack");
    }
    // Publishes through tether's own client, with a retried id.
    let own_pub = Client::connect(ClientConfig::new(url.clone())).expect("tether publisher");
    let mut own_acks = BTreeMap::new();
    for k in 1..=5u64 {
        let data = json!({"via": "tether-client", "k": k});
        let id = format!("t-{k}");
        let ack = tokio::time::timeout(STEP, own_pub.publisher().publish_with_id(CH, &id, &data))
            .await
            .expect("ack timed out")
            .expect("publish");
        assert_eq!((ack.id.as_str(), ack.ch.as_str()), (id.as_str(), CH));
        assert_eq!(ack.seq, idem_seq + 20 + k);
        expected.insert(ack.seq, data);
        own_acks.insert(id, ack.seq);
    }
    let ack = tokio::time::timeout(STEP, own_pub.publisher().publish_with_id(CH, "t-3", &json!({"dup": true})))
        .await
        .expect("ack timed out")
        .expect("publish");
    assert_eq!(ack.seq, own_acks["t-3"], "a retried id gets the original seq");
    own_pub.close().await;

    // The sentinel closes the sequence: a duplicate delivered late would show up before it.
    let sentinel = json!({"sentinel": true});
    let last = http.publish(CH, sentinel.to_string().as_bytes()).await;
    assert_eq!(last, idem_seq + 26, "no duplicate consumed a seq");
    expected.insert(last, sentinel);

    let want: Vec<(u64, Value)> = expected.into_iter().collect();
    for (i, r) in readers.into_iter().enumerate() {
        let got = tokio::time::timeout(Duration::from_secs(30), r)
            .await
            .expect("subscriber timed out")
            .expect("reader panicked");
        assert_eq!(got.len(), want.len(), "subscriber {i}: seqs {:?}", got.iter().map(|g| g.0).collect::<Vec<_>>());
        assert_eq!(got, want, "subscriber {i} got a different sequence");
    }
    for (i, r) in own_readers.into_iter().enumerate() {
        let got = tokio::time::timeout(Duration::from_secs(30), r)
            .await
            .expect("tether client timed out")
            .expect("client reader panicked");
        assert_eq!(got, want, "tether client {i} got a different sequence");
    }
    let m = srv.metrics().await;
    let subscribers = (SUBSCRIBERS + OWN_CLIENTS) as u64;
    assert_eq!(m.sum("tether_messages_delivered_total", &[]), (subscribers * last) as f64, "deliveries");
    assert_eq!(m.sum("tether_messages_published_total", &[]), last as f64, "published (dedup hits excluded)");
    assert!(m.sum("tether_publish_duplicates_total", &[]) >= 5.0, "dedup hits counted");
}
