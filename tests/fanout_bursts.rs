//! Bursts of interleaved channels while the cores write long subscriber lists (docs/architecture.md,
//! "The send path"). With `--cores 2` and 1,200 subscribers (600 or so per core, more than one
//! chunk of the dirty list), one WS publisher pipelines 400 publishes over three channels
//! without waiting for acks while an HTTP publisher publishes to one of them at the same time.
//! So deliveries reach a core in runs of one channel (queued to each subscriber together), runs
//! break at another channel or at a subscription, and publishes arrive while a core is between
//! chunks of its list. 60 subscribers join one channel in the middle of the burst.
//!
//! Every subscriber (tokio-tungstenite, an independent client) must get, for each of its
//! channels, every seq after its `subscribed` head exactly once, in order, each with the data
//! that seq was acknowledged for.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::tung::{next_json, Ws};
use common::*;
use futures::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const SUBSCRIBERS: usize = 1200;
const LATE: usize = 60;
const WS_PUBLISHES: u64 = 400;
const HTTP_PUBLISHES: u64 = 60;
const CHANNELS: [&str; 3] = ["burst.a", "burst.b", "burst.c"];

/// The channels subscriber `i` subscribes to: all of them `burst.a`, every second `burst.b`,
/// every third `burst.c`.
fn channels_of(i: usize) -> Vec<&'static str> {
    let mut v = vec![CHANNELS[0]];
    if i.is_multiple_of(2) {
        v.push(CHANNELS[1]);
    }
    if i.is_multiple_of(3) {
        v.push(CHANNELS[2]);
    }
    v
}

/// The channel of WS publish `k`: runs of several `burst.a`, broken by the others.
fn channel_of(k: u64) -> &'static str {
    match k % 7 {
        0 => CHANNELS[1],
        3 => CHANNELS[2],
        _ => CHANNELS[0],
    }
}

/// A subscriber: its connection, the head each `subscribed` named, and the messages that came
/// before the last `subscribed`.
type Sub = (Ws, BTreeMap<String, u64>, Vec<Value>);

/// A connection subscribed to `chans`.
async fn subscriber(url: String, chans: Vec<&'static str>) -> Sub {
    let mut ws = tung::connect(&url).await;
    for ch in &chans {
        tung::send(&mut ws, json!({"op": "sub", "ch": ch})).await;
    }
    let mut heads = BTreeMap::new();
    // Messages of a channel subscribed first may arrive before a later `subscribed`.
    let mut early = Vec::new();
    while heads.len() < chans.len() {
        let v = next_json(&mut ws).await;
        match v["op"].as_str() {
            Some("subscribed") => {
                heads.insert(v["ch"].as_str().unwrap().to_string(), v["seq"].as_u64().unwrap());
            }
            Some("msg") => early.push(v),
            _ => panic!("unexpected {v}"),
        }
    }
    (ws, heads, early)
}

/// Reads until the `end` message of every channel in `heads`; returns, per channel, the
/// (seq, k) of every message read.
async fn read_all((mut ws, heads, early): Sub) -> (BTreeMap<String, u64>, BTreeMap<String, Vec<(u64, i64)>>) {
    let mut got: BTreeMap<String, Vec<(u64, i64)>> = heads.keys().map(|c| (c.clone(), Vec::new())).collect();
    let mut ended = 0;
    let mut early = early.into_iter();
    while ended < heads.len() {
        let v = match early.next() {
            Some(v) => v,
            None => next_json(&mut ws).await,
        };
        assert_eq!(v["op"], "msg", "{v}");
        let ch = v["ch"].as_str().unwrap().to_string();
        let k = v["data"]["k"].as_i64().expect("data.k");
        got.get_mut(&ch)
            .unwrap_or_else(|| panic!("a message of {ch}, not subscribed"))
            .push((v["seq"].as_u64().unwrap(), k));
        if k < 0 {
            ended += 1;
        }
    }
    (heads, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_bursts_reach_every_subscriber_once_in_order() {
    let srv = Server::start("[limits]\nqueue_max_messages = 4096\nqueue_max_bytes = 4194304\n", &["--cores", "2"]);
    let url = srv.ws_url();

    let mut subs = Vec::new();
    for batch in (0..SUBSCRIBERS).collect::<Vec<_>>().chunks(100) {
        subs.extend(futures::future::join_all(batch.iter().map(|&i| subscriber(url.clone(), channels_of(i)))).await);
    }
    srv.wait_gauge(SUBSCRIBERS as f64, STEP).await;
    let m = srv.metrics().await;
    let per_core: Vec<f64> = ["core=\"0\"", "core=\"1\""].iter().map(|c| m.sum("tether_connections", &[c])).collect();
    assert!(per_core.iter().all(|&n| n > 512.0), "more than a chunk of subscribers on each core: {per_core:?}");
    for (_, heads, _) in &subs {
        assert!(heads.values().all(|&h| h == 0), "nothing was published yet: {heads:?}");
    }
    let readers: Vec<_> = subs.into_iter().map(|sub| tokio::spawn(read_all(sub))).collect();

    // The HTTP publisher, at the same time as the WS one, on its own connection.
    let http_addr = srv.addr;
    let http = tokio::spawn(async move {
        let mut http = HttpConn::new(http_addr).await;
        let mut seqs = BTreeMap::new();
        for k in 0..HTTP_PUBLISHES {
            let k = 100_000 + k as i64;
            let seq = http.publish(CHANNELS[1], json!({"k": k}).to_string().as_bytes()).await;
            seqs.insert(seq, k);
        }
        seqs
    });

    // The WS publisher pipelines every publish, then reads the acks.
    let mut publisher = tung::connect(&url).await;
    let mut late = Vec::new();
    for k in 0..WS_PUBLISHES {
        let frame = json!({"op": "pub", "ch": channel_of(k), "id": format!("w{k}"), "data": {"k": k}});
        publisher.feed(Message::text(frame.to_string())).await.unwrap();
        if k % 50 == 49 {
            publisher.flush().await.unwrap();
        }
        if k == WS_PUBLISHES / 2 {
            publisher.flush().await.unwrap();
            // Late joiners subscribe while the burst is being written.
            late = futures::future::join_all((0..LATE).map(|_| subscriber(url.clone(), vec![CHANNELS[0]]))).await;
        }
    }
    publisher.flush().await.unwrap();
    let late_readers: Vec<_> = late.into_iter().map(|sub| tokio::spawn(read_all(sub))).collect();
    // seqs per channel, from the acks: (channel, seq) -> k.
    let mut acked: BTreeMap<(String, u64), i64> = BTreeMap::new();
    for _ in 0..WS_PUBLISHES {
        let v = next_json(&mut publisher).await;
        assert_eq!(v["op"], "ack", "{v}");
        let k: u64 = v["id"].as_str().unwrap()[1..].parse().unwrap();
        assert_eq!(v["ch"], channel_of(k), "{v}");
        acked.insert((channel_of(k).to_string(), v["seq"].as_u64().unwrap()), k as i64);
    }
    let http_seqs = tokio::time::timeout(Duration::from_secs(60), http).await.expect("http publisher").unwrap();
    for (seq, k) in http_seqs {
        assert!(acked.insert((CHANNELS[1].to_string(), seq), k).is_none(), "seq {seq} of burst.b given twice");
    }
    // The end of each channel: a negative k, published after every other was acknowledged.
    for (j, ch) in CHANNELS.iter().enumerate() {
        let seq = srv.publish(ch, &json!({"k": -1 - j as i64}).to_string()).await;
        acked.insert((ch.to_string(), seq), -1 - j as i64);
    }
    for ch in CHANNELS {
        let seqs: Vec<u64> = acked.keys().filter(|(c, _)| c == ch).map(|(_, s)| *s).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{ch}: acked seqs are 1..N");
    }

    let check = |who: &str, heads: &BTreeMap<String, u64>, got: &BTreeMap<String, Vec<(u64, i64)>>| {
        for (ch, list) in got {
            let head = heads[ch];
            let last = acked.keys().filter(|(c, _)| c == ch).map(|(_, s)| *s).max().unwrap();
            let seqs: Vec<u64> = list.iter().map(|(s, _)| *s).collect();
            assert_eq!(
                seqs,
                (head + 1..=last).collect::<Vec<_>>(),
                "{who}, {ch} (head {head}): a gap, a duplicate or a reorder"
            );
            for (seq, k) in list {
                assert_eq!(acked[&(ch.clone(), *seq)], *k, "{who}, {ch} seq {seq} carries another message's data");
            }
        }
    };
    for (i, r) in readers.into_iter().enumerate() {
        let (heads, got) =
            tokio::time::timeout(Duration::from_secs(60), r).await.expect("subscriber timed out").unwrap();
        check(&format!("subscriber {i}"), &heads, &got);
    }
    let mut joined_mid = 0;
    for (i, r) in late_readers.into_iter().enumerate() {
        let (heads, got) =
            tokio::time::timeout(Duration::from_secs(60), r).await.expect("late subscriber timed out").unwrap();
        check(&format!("late subscriber {i}"), &heads, &got);
        if heads[CHANNELS[0]] > 0 {
            joined_mid += 1;
        }
    }
    assert!(joined_mid > 0, "the late subscribers joined after the burst began");
    let m = srv.metrics().await;
    assert_eq!(m.sum("tether_reaped_total", &["reason=\"overflow\""]), 0.0, "no subscriber overflowed");
}
