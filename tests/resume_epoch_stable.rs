//! A channel's epoch does not change while its stream continues (issue 9, item 8;
//! docs/protocol.md, epochs): a client that subscribed to a channel nobody had published to
//! (seq 0, epoch E), left, and resumes with `from: 0, epoch: E` after five publishes gets
//! messages 1–5 — not `reset` — even though the server forgot the channel when its last
//! subscriber left. And a published channel forgotten by the idle sweep continues its
//! numbering under the same epoch when it comes back.
//!
//! Raw JSON over tokio-tungstenite, every client independent of the others, every wait bounded.
//! The checks take the servers each party connects to ([`Nodes`]), so a Redis-broker variant
//! can run the same check with its parties spread over several nodes.

mod common;

use std::time::{Duration, Instant};

use common::tung::{connect, next_json, quiet, send, Ws};
use common::*;
use serde_json::{json, Value};

/// `dedup.window_ms` is also how long a channel must be idle before the sweep (every 5 s)
/// forgets it: the smallest value allowed, so the sweep test waits seconds, not minutes.
const CONFIG: &str =
    "[drain]\nwindow_ms = 200\n\n[dedup]\nwindow_ms = 1000\n\n[[channels]]\npattern = \"*\"\nhistory = 100\n";

/// Long enough for a disconnect's unsubscribe, sent from the subscriber's core to the channel's
/// home core, to be applied before a publish sent from another core gets there.
const SETTLE: Duration = Duration::from_millis(300);

/// Where each party of a check connects. With the memory broker all three are one server.
struct Nodes<'a> {
    /// The first subscriber, which leaves.
    first: &'a Server,
    /// The publisher.
    publisher: &'a Server,
    /// The subscriber that resumes.
    resumer: &'a Server,
}

impl<'a> Nodes<'a> {
    fn one(srv: &'a Server) -> Nodes<'a> {
        Nodes { first: srv, publisher: srv, resumer: srv }
    }
}

/// Closes `w` and waits until the server has reaped it (its connection gauge drops to `left`),
/// then lets the unsubscribe reach the channel's home.
async fn leave(srv: &Server, w: Ws, left: f64) {
    drop(w);
    srv.wait_gauge(left, STEP).await;
    tokio::time::sleep(SETTLE).await;
}

/// Publishes seqs `from..=to` with `pub` (ids `n-<seq>`), asserting each ack's seq: one
/// publisher's sequential publishes get consecutive seqs.
async fn publish(w: &mut Ws, ch: &str, from: u64, to: u64) {
    for n in from..=to {
        send(w, json!({"op": "pub", "ch": ch, "id": format!("n-{n}"), "data": {"n": n}})).await;
        let ack = next_json(w).await;
        assert_eq!(
            (ack["op"].as_str(), ack["ch"].as_str(), ack["seq"].as_u64()),
            (Some("ack"), Some(ch), Some(n)),
            "{ack}"
        );
    }
}

/// Subscribes on a fresh connection with `from`/`epoch` and returns it with the first reply.
async fn resume(srv: &Server, ch: &str, from: u64, epoch: &str) -> (Ws, Value) {
    let mut w = connect(&srv.ws_url()).await;
    send(&mut w, json!({"op": "sub", "ch": ch, "from": from, "epoch": epoch})).await;
    let first = next_json(&mut w).await;
    (w, first)
}

async fn expect_msgs(w: &mut Ws, ch: &str, seqs: std::ops::RangeInclusive<u64>) {
    for seq in seqs {
        let v = next_json(w).await;
        assert_eq!((v["op"].as_str(), v["ch"].as_str(), v["seq"].as_u64()), (Some("msg"), Some(ch), Some(seq)), "{v}");
        assert_eq!(v["data"]["n"], seq, "{v}");
    }
}

fn assert_subscribed(v: &Value, ch: &str, head: u64, epoch: &str) {
    assert_eq!(
        (v["op"].as_str(), v["ch"].as_str(), v["seq"].as_u64(), v["epoch"].as_str(), v["recovered"].as_bool()),
        (Some("subscribed"), Some(ch), Some(head), Some(epoch), Some(true)),
        "a resume in the channel's own epoch must be recovered: {v}"
    );
}

/// The check of issue 9 item 8: subscribe (seq 0, epoch E), leave, five publishes, resume
/// with `from: 0, epoch: E` → `subscribed` (recovered) and seqs 1..5, each once.
async fn resume_after_the_last_subscriber_left(nodes: Nodes<'_>, ch: &str) {
    let mut first = connect(&nodes.first.ws_url()).await;
    send(&mut first, json!({"op": "sub", "ch": ch})).await;
    let subscribed = next_json(&mut first).await;
    assert_eq!((subscribed["op"].as_str(), subscribed["seq"].as_u64()), (Some("subscribed"), Some(0)), "{subscribed}");
    let epoch = subscribed["epoch"].as_str().expect("epoch").to_string();
    leave(nodes.first, first, 0.0).await;

    let mut publisher = connect(&nodes.publisher.ws_url()).await;
    publish(&mut publisher, ch, 1, 5).await;

    let (mut second, first_reply) = resume(nodes.resumer, ch, 0, &epoch).await;
    assert_subscribed(&first_reply, ch, 5, &epoch);
    expect_msgs(&mut second, ch, 1..=5).await;
    quiet(&mut second, Duration::from_millis(300)).await;

    // Live continues after the replay.
    publish(&mut publisher, ch, 6, 6).await;
    expect_msgs(&mut second, ch, 6..=6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_broker_keeps_the_epoch_of_a_channel_forgotten_before_any_publish() {
    let _serial = serial().await;
    let srv = Server::start(CONFIG, &["--cores", "2"]);
    // Two names, so that (with two cores) the home is likely to differ from the cores the
    // clients land on for at least one of them.
    for ch in ["epoch.stable.a", "epoch.stable.b"] {
        resume_after_the_last_subscriber_left(Nodes::one(&srv), ch).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_broker_continues_numbering_of_a_swept_channel_under_its_epoch() {
    let _serial = serial().await;
    let srv = Server::start(CONFIG, &["--cores", "2"]);
    let ch = "epoch.swept";

    let mut first = connect(&srv.ws_url()).await;
    send(&mut first, json!({"op": "sub", "ch": ch})).await;
    let epoch = next_json(&mut first).await["epoch"].as_str().expect("epoch").to_string();
    let mut publisher = connect(&srv.ws_url()).await;
    publish(&mut publisher, ch, 1, 3).await;
    expect_msgs(&mut first, ch, 1..=3).await;
    leave(&srv, first, 1.0).await;

    // Idle past dedup.window_ms with no subscriber: the sweep (every 5 s) forgets the channel
    // and its history. Until it has, a resume from 0 still recovers from history; after, the
    // channel comes back at its old head under its old epoch, history empty: `evicted`.
    let limit = Duration::from_secs(25);
    let end = Instant::now() + limit;
    let mut after_sweep = loop {
        let (w, reply) = resume(&srv, ch, 0, &epoch).await;
        if reply["op"] == "reset" {
            assert_eq!(
                (reply["reason"].as_str(), reply["seq"].as_u64(), reply["epoch"].as_str(), reply["oldest"].as_u64()),
                (Some("evicted"), Some(3), Some(epoch.as_str()), Some(4)),
                "a swept channel keeps its epoch and head: {reply}"
            );
            break w;
        }
        assert_subscribed(&reply, ch, 3, &epoch);
        drop(w);
        assert!(Instant::now() < end, "the channel was not swept within {limit:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // Numbering continues after the old head, under the same epoch.
    publish(&mut publisher, ch, 4, 5).await;
    expect_msgs(&mut after_sweep, ch, 4..=5).await;
    let (mut caught_up, reply) = resume(&srv, ch, 3, &epoch).await;
    assert_subscribed(&reply, ch, 5, &epoch);
    expect_msgs(&mut caught_up, ch, 4..=5).await;
    quiet(&mut caught_up, Duration::from_millis(300)).await;
}
