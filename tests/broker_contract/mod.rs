//! The broker contract (the `Broker` trait's doc comment, `src/server/broker/mod.rs`): behaviour
//! bodies that every broker must pass, checked through the wire protocol (docs/protocol.md)
//! against a real `tether serve` with two cores, and [`broker_contract_tests!`], which runs each
//! of them as one `#[tokio::test]` against a broker. Included with `mod broker_contract;` by
//! `tests/broker_contract_memory.rs` (the memory broker) and `tests/broker_contract_redis.rs`
//! (the Redis broker on a real `redis-server`).
//! - **seq with no gap**: a fresh channel's consecutive publishes are acked 1, 2, 3, …;
//! - **order**: a subscriber receives a channel's messages in seq order, each with the data
//!   published as that seq, pipelined publishes included;
//! - **dedup**: the same publish id twice is stored once and acked with the same seq; the
//!   subscriber gets one message for it, and the next publish takes the next seq;
//! - **fan-out once**: subscribers on both cores (at least two on each) each receive every
//!   message exactly once;
//! - **history resume**: a `sub` with `from` and the epoch gets `recovered`, exactly the
//!   messages after `from` (from history), then the live ones with no gap and no duplicate;
//!   and a history page (`Request::History`, `GET /api/history/{ch}`) holds exactly those;
//! - **epoch stable**: the epoch stays the same across publishes, unsubscribes,
//!   re-subscribes and resumes while the server lives.
//!
//! Every wait is bounded ([`STEP`] per frame); nothing waits for time to pass.

#![allow(dead_code)]

use serde_json::json;

use crate::common::{check, eventually, Server, STEP};
use crate::nodes::{wait_ready_status, Conn};

/// Bound on opening subscribers until both cores have [`PER_CORE`] of them.
const MAX_CONNS: usize = 64;
/// Subscribers wanted on each of the two cores by [`fan_out_once_to_every_subscriber`].
const PER_CORE: usize = 2;

/// Waits until `/readyz` of `srv` answers 200 (the Redis broker connects in the background).
pub async fn ready(srv: &Server) {
    wait_ready_status(srv.addr, 200, STEP).await;
}

/// `pub` of `{"n": n}` on `ch` with `id`, asserting the `ack`; returns its seq.
async fn publish(c: &mut Conn, ch: &str, id: &str, n: u64) -> u64 {
    let v = c.publish(ch, id, json!({ "n": n })).await;
    assert_eq!(v["op"], "ack", "reply to pub {id}: {v}");
    assert_eq!(v["id"], id, "ack of pub {id}: {v}");
    assert_eq!(v["ch"], ch, "ack of pub {id}: {v}");
    v["seq"].as_u64().unwrap_or_else(|| panic!("ack.seq: {v}"))
}

/// The next frame of `c`, which must be a `msg` of `ch`; returns `(seq, data.n)`.
async fn next_msg(c: &mut Conn, ch: &str) -> (u64, u64) {
    let v = c.recv_within(STEP).await;
    assert_eq!(v["op"], "msg", "expected a msg of {ch}: {v}");
    assert_eq!(v["ch"], ch, "msg of another channel: {v}");
    let seq = v["seq"].as_u64().unwrap_or_else(|| panic!("msg.seq: {v}"));
    let n = v["data"]["n"].as_u64().unwrap_or_else(|| panic!("msg.data.n: {v}"));
    (seq, n)
}

/// The next `want` messages of `ch` on `c`, as `(seq, data.n)`.
async fn msgs(c: &mut Conn, ch: &str, want: usize) -> Vec<(u64, u64)> {
    let mut got = Vec::with_capacity(want);
    for _ in 0..want {
        got.push(next_msg(c, ch).await);
    }
    got
}

/// Asserts that nothing more came to `c`: a ping is answered with no text frame before it.
async fn nothing_more(c: &mut Conn, who: &str) {
    let extra = c.alive().await;
    assert!(extra.is_empty(), "{who} received more than expected: {extra:?}");
}

/// `sub` of `ch` resuming after `from` of `epoch`; asserts `subscribed` with `recovered` and
/// returns its head.
async fn resume(c: &mut Conn, ch: &str, from: u64, epoch: &str) -> u64 {
    let v = c.sub(ch, Some((from, epoch))).await;
    assert_eq!(v["op"], "subscribed", "reply to sub from {from}: {v}");
    assert_eq!(v["recovered"], true, "sub from {from} of epoch {epoch}: {v}");
    assert_eq!(v["epoch"], epoch, "resume keeps the epoch: {v}");
    v["seq"].as_u64().unwrap_or_else(|| panic!("subscribed.seq: {v}"))
}

/// `unsub` of `ch`; asserts `unsubscribed`.
async fn unsub(c: &mut Conn, ch: &str) {
    c.send(&json!({"op": "unsub", "ch": ch})).await;
    let v = c.recv_within(STEP).await;
    assert_eq!(v["op"], "unsubscribed", "reply to unsub {ch}: {v}");
}

/// `tether_connections` of each of the two cores.
async fn per_core(srv: &Server) -> [f64; 2] {
    let m = srv.metrics().await;
    [m.sum("tether_connections", &["core=\"0\""]), m.sum("tether_connections", &["core=\"1\""])]
}

/// Opens one more tokio-tungstenite connection and finds out which core took it: the one whose
/// `tether_connections` grew, polled until the total is `before` + 1 (bounded by [`STEP`]).
async fn connect_and_locate(srv: &Server, before: [f64; 2]) -> (Conn, usize, [f64; 2]) {
    let c = Conn::tung(srv.addr).await;
    let now = eventually(STEP, "tether_connections counting the new connection", || async {
        let now = per_core(srv).await;
        check(now[0] + now[1] == before[0] + before[1] + 1.0, || format!("{now:?}")).map(|()| now)
    })
    .await;
    let core = if now[0] > before[0] { 0 } else { 1 };
    assert_eq!(now[core], before[core] + 1.0, "one core took the connection: {before:?} -> {now:?}");
    (c, core, now)
}

/// A fresh channel's consecutive publishes (over one connection and over several) are acked
/// with seqs 1, 2, 3, … without a gap; a second channel numbers on its own from 1.
pub async fn seq_has_no_gap(srv: &Server) {
    ready(srv).await;
    let ch = "contract.seq";
    let mut a = Conn::tung(srv.addr).await;
    let mut b = Conn::raw(srv.addr).await;
    let mut seqs = Vec::new();
    for n in 1..=20u64 {
        // Alternate publishers (likely on different cores): numbering is the channel's.
        let c = if n % 2 == 0 { &mut a } else { &mut b };
        seqs.push(publish(c, ch, &format!("seq-{n}"), n).await);
    }
    assert_eq!(seqs, (1..=20).collect::<Vec<u64>>(), "acked seqs of 20 consecutive publishes");
    assert_eq!(publish(&mut a, "contract.seq.other", "other-1", 1).await, 1, "another channel starts at 1");
    assert_eq!(publish(&mut b, ch, "seq-21", 21).await, 21, "and the first channel goes on");
}

/// A subscriber receives every message in seq order, each carrying the data published as that
/// seq, also when the publisher pipelines its publishes (all sent before any ack is read).
pub async fn subscriber_receives_in_seq_order(srv: &Server) {
    ready(srv).await;
    const N: u64 = 200;
    let ch = "contract.order";
    let mut sub = Conn::tung(srv.addr).await;
    let (head, _) = sub.sub_live(ch).await;
    assert_eq!(head, 0, "fresh channel");
    let mut publisher = Conn::raw(srv.addr).await;
    for n in 1..=N {
        publisher.send(&json!({"op": "pub", "ch": ch, "id": format!("order-{n}"), "data": {"n": n}})).await;
    }
    for n in 1..=N {
        let v = publisher.recv_within(STEP).await;
        assert_eq!(v["op"], "ack", "reply to pipelined pub {n}: {v}");
        assert_eq!((v["id"].as_str(), v["seq"].as_u64()), (Some(format!("order-{n}").as_str()), Some(n)), "ack {v}");
    }
    let got = msgs(&mut sub, ch, N as usize).await;
    let want: Vec<(u64, u64)> = (1..=N).map(|n| (n, n)).collect();
    assert_eq!(got, want, "the subscriber's (seq, data.n) in arrival order");
    nothing_more(&mut sub, "the subscriber").await;
}

/// The same publish id twice is stored once: both acks carry the same seq, the subscriber gets
/// one message (the first data), and the next id takes the next seq.
pub async fn duplicate_id_is_stored_once(srv: &Server) {
    ready(srv).await;
    let ch = "contract.dedup";
    let mut sub = Conn::tung(srv.addr).await;
    assert_eq!(sub.sub_live(ch).await.0, 0, "fresh channel");
    let mut a = Conn::raw(srv.addr).await;
    let mut b = Conn::tung(srv.addr).await;
    assert_eq!(publish(&mut a, ch, "dup-1", 1).await, 1);
    assert_eq!(publish(&mut a, ch, "dup-1", 2).await, 1, "the same id again, same connection: the original seq");
    assert_eq!(publish(&mut b, ch, "dup-1", 3).await, 1, "the same id from another connection: the original seq");
    assert_eq!(publish(&mut b, ch, "dup-2", 4).await, 2, "the next id takes the next seq");
    // Messages arrive in seq order: seq 2 right after seq 1 means no duplicate came between.
    assert_eq!(msgs(&mut sub, ch, 2).await, vec![(1, 1), (2, 4)], "one message per id, the first data");
    nothing_more(&mut sub, "the subscriber").await;
}

/// Subscribers on both cores, at least [`PER_CORE`] on each (so two share a core and others
/// are on different ones), each receive every message exactly once and in order.
pub async fn fan_out_once_to_every_subscriber(srv: &Server) {
    ready(srv).await;
    const N: u64 = 30;
    let ch = "contract.fanout";
    let mut counts = per_core(srv).await;
    assert_eq!(counts, [0.0, 0.0], "no connection yet");
    let mut subs: Vec<(Conn, usize)> = Vec::new();
    while counts.iter().any(|&n| n < PER_CORE as f64) {
        assert!(subs.len() < MAX_CONNS, "{MAX_CONNS} connections did not put {PER_CORE} on each core: {counts:?}");
        let (c, core, now) = connect_and_locate(srv, counts).await;
        counts = now;
        subs.push((c, core));
    }
    for (c, _) in &mut subs {
        assert_eq!(c.sub_live(ch).await.0, 0, "fresh channel");
    }
    let mut publisher = Conn::raw(srv.addr).await;
    for n in 1..=N {
        assert_eq!(publish(&mut publisher, ch, &format!("fan-{n}"), n).await, n);
    }
    let want: Vec<(u64, u64)> = (1..=N).map(|n| (n, n)).collect();
    for (i, (c, core)) in subs.iter_mut().enumerate() {
        let who = format!("subscriber {i} on core {core}");
        assert_eq!(msgs(c, ch, N as usize).await, want, "{who}");
        nothing_more(c, &who).await;
    }
}

/// A `sub` with `from` and the channel's epoch gets `subscribed` with `recovered` and the head,
/// exactly the messages after `from` from history, then live ones with no gap and no
/// duplicate at the seam; `from: 0` replays from seq 1.
pub async fn resume_gets_exactly_the_missed(srv: &Server) {
    ready(srv).await;
    const N: u64 = 10;
    let ch = "contract.resume";
    let mut first = Conn::tung(srv.addr).await;
    let (head, epoch) = first.sub_live(ch).await;
    assert_eq!(head, 0, "fresh channel");
    let mut publisher = Conn::raw(srv.addr).await;
    for n in 1..=N {
        assert_eq!(publish(&mut publisher, ch, &format!("res-{n}"), n).await, n);
    }
    let all: Vec<(u64, u64)> = (1..=N).map(|n| (n, n)).collect();
    assert_eq!(msgs(&mut first, ch, N as usize).await, all, "the live subscriber");

    let mut mid = Conn::tung(srv.addr).await;
    assert_eq!(resume(&mut mid, ch, 4, &epoch).await, N, "head when resuming");
    assert_eq!(msgs(&mut mid, ch, 6).await, all[4..].to_vec(), "resume after 4: seqs 5..=10");
    let mut whole = Conn::raw(srv.addr).await;
    assert_eq!(resume(&mut whole, ch, 0, &epoch).await, N, "head when resuming");
    assert_eq!(msgs(&mut whole, ch, N as usize).await, all, "resume after 0: seqs 1..=10");
    let mut caught_up = Conn::tung(srv.addr).await;
    assert_eq!(resume(&mut caught_up, ch, N, &epoch).await, N, "resume at the head");
    // A history page is what a resume replays.
    for from in [0, 4, N] {
        let page = crate::common::api::get_ok(srv.addr, &format!("/api/history/{ch}?from={from}")).await;
        let got: Vec<(u64, u64)> = page["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("messages: {page}"))
            .iter()
            .map(|m| (m["seq"].as_u64().unwrap_or(0), m["data"]["n"].as_u64().unwrap_or(0)))
            .collect();
        assert_eq!(got, all[from as usize..].to_vec(), "history after {from}: {page}");
        assert_eq!((page["epoch"].as_str(), page["head"].as_u64()), (Some(epoch.as_str()), Some(N)), "{page}");
    }

    assert_eq!(publish(&mut publisher, ch, "res-11", 11).await, 11);
    for (who, c) in [("live", &mut first), ("from 4", &mut mid), ("from 0", &mut whole), ("from head", &mut caught_up)]
    {
        assert_eq!(next_msg(c, ch).await, (11, 11), "{who}: the live message after the replay");
        nothing_more(c, who).await;
    }
}

/// The epoch a channel is subscribed under stays the same across publishes, unsubscribes,
/// re-subscribes (same and other connections) and resumes while the server lives.
pub async fn epoch_is_stable(srv: &Server) {
    ready(srv).await;
    let ch = "contract.epoch";
    let mut a = Conn::tung(srv.addr).await;
    let (head, epoch) = a.sub_live(ch).await;
    assert_eq!(head, 0, "fresh channel");
    assert!(!epoch.is_empty(), "an epoch is named");
    let mut publisher = Conn::raw(srv.addr).await;
    for n in 1..=3 {
        assert_eq!(publish(&mut publisher, ch, &format!("ep-{n}"), n).await, n);
    }
    assert_eq!(msgs(&mut a, ch, 3).await, vec![(1, 1), (2, 2), (3, 3)]);
    unsub(&mut a, ch).await;
    // No subscriber left: the channel lives on in the broker with its numbering.
    assert_eq!(publish(&mut publisher, ch, "ep-4", 4).await, 4);
    assert_eq!(a.sub_live(ch).await, (4, epoch.clone()), "re-subscribe on the same connection");
    let mut b = Conn::raw(srv.addr).await;
    assert_eq!(b.sub_live(ch).await, (4, epoch.clone()), "subscribe on another connection");
    assert_eq!(publish(&mut publisher, ch, "ep-5", 5).await, 5);
    assert_eq!(next_msg(&mut a, ch).await, (5, 5));
    assert_eq!(next_msg(&mut b, ch).await, (5, 5));
    drop(a);
    drop(b);
    let mut c = Conn::tung(srv.addr).await;
    assert_eq!(resume(&mut c, ch, 3, &epoch).await, 5, "resume after everyone left");
    assert_eq!(msgs(&mut c, ch, 2).await, vec![(4, 4), (5, 5)]);
    nothing_more(&mut c, "the resumed subscriber").await;
}

/// Runs every body of the contract as one `#[tokio::test]` in a module named `$broker`;
/// `$start` is an `async fn() -> (Guard, Server)` in the including file (the guard keeps what
/// the server needs alive, a `redis-server` say). The tests of one binary take turns
/// ([`crate::common::serial`]): each starts a two-core server on a two-core box.
macro_rules! broker_contract_tests {
    ($broker:ident, $start:ident) => {
        mod $broker {
            use crate::broker_contract as contract;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn seq_has_no_gap() {
                let _serial = crate::common::serial().await;
                let (_guard, srv) = super::$start().await;
                contract::seq_has_no_gap(&srv).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn subscriber_receives_in_seq_order() {
                let _serial = crate::common::serial().await;
                let (_guard, srv) = super::$start().await;
                contract::subscriber_receives_in_seq_order(&srv).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn duplicate_id_is_stored_once() {
                let _serial = crate::common::serial().await;
                let (_guard, srv) = super::$start().await;
                contract::duplicate_id_is_stored_once(&srv).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fan_out_once_to_every_subscriber() {
                let _serial = crate::common::serial().await;
                let (_guard, srv) = super::$start().await;
                contract::fan_out_once_to_every_subscriber(&srv).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn resume_gets_exactly_the_missed() {
                let _serial = crate::common::serial().await;
                let (_guard, srv) = super::$start().await;
                contract::resume_gets_exactly_the_missed(&srv).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn epoch_is_stable() {
                let _serial = crate::common::serial().await;
                let (_guard, srv) = super::$start().await;
                contract::epoch_is_stable(&srv).await;
            }
        }
    };
}
