//! Publishes stored in batches by the Redis broker (docs/redis.md: one script call stores the
//! publishes that reach a node together). Two real `tether serve` nodes on one real
//! `redis-server`; one WebSocket publisher on A keeps 64 `pub`s in flight over three channels,
//! and one in eight repeats the id of a recent publish of its channel (often still in flight,
//! so in the same batch as its original):
//! - every publish is acked; per channel the new ids get seqs 1, 2, 3, … in the order they were
//!   sent, and a repeated id gets the seq of its first publish;
//! - a subscriber of each channel on B receives every stored message exactly once, in seq
//!   order, with the data of its id's first publish;
//! - halfway, Redis's script cache is emptied (`SCRIPT FLUSH`, as after a restart): the broker
//!   sends the script itself and nothing is refused;
//! - at `maxmemory`, Redis refuses the call up front: `unavailable`, nothing half-written (no
//!   seq taken, no dedup key kept), and the same id is stored once memory is back;
//! - a call that fails half-way (a stream key of the wrong type) answers `unavailable`, keeps
//!   no dedup key for the failed publish, and takes its seq for good: the next publish gets the
//!   one after it; the publishes of the call before the failing one are acked and stored, and
//!   none that is refused is stored.

mod common;
mod nodes;

use std::collections::HashMap;
use std::time::Duration;

use common::redis::{redis_config, RedisProc};
use common::*;
use nodes::*;
use serde_json::{json, Value};
use tokio::sync::watch;

const CHANNELS: [&str; 3] = ["batch.a", "batch.b", "batch.c"];
const PUBLISHES: u64 = 3_000;
const IN_FLIGHT: usize = 64;

/// `redis-cli` output without its trailing newline.
fn cli(redis: &RedisProc, args: &[&str]) -> String {
    redis.cli(args).trim_end().to_owned()
}

/// `pub` with `id` and `{"n": n}`; the reply (`ack` or `error`).
async fn publish(ws: &mut Conn, ch: &str, id: &str, n: u64) -> Value {
    ws.publish(ch, id, json!({ "n": n })).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_publishes_are_acked_in_order_and_delivered_once() {
    let _serial = serial().await;
    let redis = RedisProc::start();
    let config = redis_config(&redis.url(), "");
    let a = Server::start(&config, &["--cores", "2"]);
    let b = Server::start(&config, &["--cores", "2"]);
    wait_ready_status(a.addr, 200, STEP).await;
    wait_ready_status(b.addr, 200, STEP).await;

    let mut stops = Vec::new();
    let mut readers = Vec::new();
    for (i, ch) in CHANNELS.iter().enumerate() {
        let (tx, rx) = watch::channel(u64::MAX);
        let mut c = if i % 2 == 0 { Conn::tung(b.addr).await } else { Conn::raw(b.addr).await };
        let (head, _) = c.sub_live(ch).await;
        assert_eq!(head, 0, "fresh channel {ch}");
        readers.push(spawn_reader(c, ch, rx, Duration::from_secs(60)));
        stops.push(tx);
    }

    // Send with up to IN_FLIGHT unacknowledged; acks are matched by (channel, id).
    let mut ws = Conn::tung(a.addr).await;
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Per channel: the `n` of each new id in the order sent, and the ids sent.
    let mut firsts: Vec<Vec<u64>> = vec![Vec::new(); CHANNELS.len()];
    let mut ids: Vec<Vec<String>> = vec![Vec::new(); CHANNELS.len()];
    // (channel, id) → (place among its channel's new ids, publishes sent, acks seen).
    let mut sent: HashMap<(usize, String), (u64, u64, u64)> = HashMap::new();
    let (mut outstanding, mut repeats, mut acks) = (0usize, 0u64, 0u64);
    let check_ack = |v: Value, sent: &mut HashMap<(usize, String), (u64, u64, u64)>| {
        assert_eq!(v["op"], "ack", "reply to pub: {v}");
        let c = CHANNELS.iter().position(|ch| v["ch"] == *ch).unwrap_or_else(|| panic!("ack on another channel: {v}"));
        let id = v["id"].as_str().expect("ack.id").to_owned();
        let entry = sent.get_mut(&(c, id)).unwrap_or_else(|| panic!("ack of an id never sent: {v}"));
        assert_eq!(v["seq"].as_u64(), Some(entry.0 + 1), "seq of {v}: its id was new #{} of its channel", entry.0 + 1);
        entry.2 += 1;
        assert!(entry.2 <= entry.1, "more acks than publishes for {v}");
    };
    for n in 1..=PUBLISHES {
        if n == PUBLISHES / 2 {
            assert_eq!(cli(&redis, &["SCRIPT", "FLUSH"]), "OK");
        }
        while outstanding >= IN_FLIGHT {
            check_ack(ws.recv_within(STEP).await, &mut sent);
            outstanding -= 1;
            acks += 1;
        }
        let c = (next() % CHANNELS.len() as u64) as usize;
        let recent = ids[c].len().saturating_sub(16);
        let id = if next() % 8 == 0 && recent < ids[c].len() {
            repeats += 1;
            ids[c][recent + (next() as usize % (ids[c].len() - recent))].clone()
        } else {
            let id = format!("p-{n}");
            sent.insert((c, id.clone()), (firsts[c].len() as u64, 0, 0));
            firsts[c].push(n);
            ids[c].push(id.clone());
            id
        };
        sent.get_mut(&(c, id.clone())).expect("sent").1 += 1;
        ws.send(&json!({"op": "pub", "ch": CHANNELS[c], "id": id, "data": {"n": n}})).await;
        outstanding += 1;
    }
    while outstanding > 0 {
        check_ack(ws.recv_within(STEP).await, &mut sent);
        outstanding -= 1;
        acks += 1;
    }
    assert_eq!(acks, PUBLISHES);
    let unanswered: Vec<_> = sent.iter().filter(|(_, (_, s, a))| s != a).take(5).collect();
    assert!(unanswered.is_empty(), "ids with fewer acks than publishes: {unanswered:?}");
    assert!(repeats > PUBLISHES / 16, "only {repeats} repeated ids");

    for (c, stop) in stops.iter().enumerate() {
        stop.send(*firsts[c].last().expect("every channel got publishes")).expect("reader alive");
    }
    let logs = join_readers(readers).await;
    for (c, log) in logs.iter().enumerate() {
        let want: Vec<(u64, u64)> = firsts[c].iter().enumerate().map(|(i, n)| (i as u64 + 1, *n)).collect();
        let got = log.msgs();
        if let Some(i) = (0..want.len().max(got.len())).find(|&i| want.get(i) != got.get(i)) {
            panic!(
                "{}: delivery {i} is {:?}, want {:?} ({} delivered, {} stored)",
                CHANNELS[c],
                got.get(i),
                want.get(i),
                got.len(),
                want.len()
            );
        }
        assert!(log.evs.iter().all(|e| matches!(e, Ev::Msg { .. })), "{}: a reset", CHANNELS[c]);
    }
    let stored: u64 = firsts.iter().map(|f| f.len() as u64).sum();
    let dups = a.metric("tether_publish_duplicates_total", &[]).await;
    assert_eq!(dups, (PUBLISHES - stored) as f64, "tether_publish_duplicates_total");
    let calls = a.metric("tether_broker_request_seconds_count", &[]).await;
    eprintln!(
        "{PUBLISHES} publishes ({repeats} repeated ids, {stored} stored) in at most {calls} broker requests on A"
    );

    // At maxmemory the script is refused before it runs.
    let head = |ch: &str| cli(&redis, &["HGET", &format!("tether:{{{ch}}}:m"), "seq"]);
    let exists = |key: String| cli(&redis, &["EXISTS", &key]);
    let (ch, before) = (CHANNELS[0], firsts[0].len());
    assert_eq!(cli(&redis, &["CONFIG", "SET", "maxmemory", "1"]), "OK");
    let v = publish(&mut ws, ch, "oom", 0).await;
    assert_eq!((v["op"].as_str(), v["code"].as_str()), (Some("error"), Some("unavailable")), "pub at maxmemory: {v}");
    assert_eq!(head(ch), before.to_string(), "no seq taken at maxmemory");
    assert_eq!(exists(format!("tether:{{{ch}}}:d:oom")), "0", "no dedup key kept at maxmemory");
    assert_eq!(cli(&redis, &["CONFIG", "SET", "maxmemory", "0"]), "OK");
    let v = publish(&mut ws, ch, "oom", 0).await;
    assert_eq!((v["op"].as_str(), v["seq"].as_u64()), (Some("ack"), Some(before as u64 + 1)), "{v}");

    // A write that fails half-way: the stream of channel c is a string.
    let (ch, before) = (CHANNELS[2], firsts[2].len() as u64);
    let stream = format!("tether:{{{ch}}}:s");
    cli(&redis, &["DEL", &stream]);
    cli(&redis, &["SET", &stream, "not a stream"]);
    let v = publish(&mut ws, ch, "wrongtype", 0).await;
    assert_eq!((v["op"].as_str(), v["code"].as_str()), (Some("error"), Some("unavailable")), "pub with WRONGTYPE: {v}");
    assert_eq!(head(ch), (before + 1).to_string(), "the failed publish's seq is taken");
    assert_eq!(exists(format!("tether:{{{ch}}}:d:wrongtype")), "0", "the failed publish keeps no dedup key");
    let script_errors = a.metric("tether_broker_errors_total", &["kind=\"script\""]).await;
    assert!(script_errors >= 2.0, "tether_broker_errors_total{{kind=\"script\"}} = {script_errors}");
    cli(&redis, &["DEL", &stream]);
    let v = publish(&mut ws, ch, "wrongtype", 0).await;
    assert_eq!((v["op"].as_str(), v["seq"].as_u64()), (Some("ack"), Some(before + 2)), "retry after WRONGTYPE: {v}");

    // A call that stops at a failing publish answers each publish for what happened to it:
    // sent together (most likely one call), a publish before the failing one is acked and
    // stored, the failing one and any after it are refused and not stored, so a retry (even
    // one without an id) stores each once.
    cli(&redis, &["DEL", &stream]);
    cli(&redis, &["SET", &stream, "not a stream"]);
    let burst = [(CHANNELS[0], "burst-pre", 900_001), (ch, "burst-bad", 900_002), (CHANNELS[0], "burst-post", 900_003)];
    for (c, id, n) in burst {
        ws.send(&json!({"op": "pub", "ch": c, "id": id, "data": {"n": n}})).await;
    }
    let mut replies = HashMap::new();
    for _ in 0..burst.len() {
        let v = ws.recv_within(STEP).await;
        replies.insert(v["id"].as_str().expect("reply id").to_owned(), v);
    }
    let history = cli(&redis, &["XRANGE", &format!("tether:{{{}}}:s", CHANNELS[0]), "-", "+"]);
    for (c, id, n) in burst {
        let v = &replies[id];
        let stored = history.contains(&format!("\"n\":{n}"));
        match v["op"].as_str() {
            Some("ack") => assert!(c == CHANNELS[0] && stored, "{id} acked but not stored: {v}"),
            Some("error") => {
                assert_eq!(v["code"], "unavailable", "{v}");
                assert!(!stored, "{id} refused but stored: a retry would store it twice");
            }
            _ => panic!("reply to {id}: {v}"),
        }
    }
    assert_eq!(replies["burst-bad"]["op"], "error", "the failing publish is refused");
    assert_eq!(replies["burst-pre"]["op"], "ack", "a publish before the failing one is stored and acked");
    eprintln!("burst around a failing publish: post {}", replies["burst-post"]["op"]);
    cli(&redis, &["DEL", &stream]);
}
