//! Every request answered, and matchable (docs/protocol.md, "Answers"): requests sent in one
//! TCP write each get exactly one answer, every answer names its `ch` (and a `pub`'s its
//! `id`), answers about one channel come in request order, and a successful `unsub` is
//! answered `unsubscribed`. Raw frames in one write, tokio-tungstenite with its frames fed
//! and flushed at once, against the memory broker and against Redis.

mod common;

use std::collections::BTreeMap;

use common::redis::{redis_config, RedisProc};
use common::tung::{next_json, Ws};
use common::*;
use futures::SinkExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tether::ws::codec::encode_client_frame;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;

/// Sends every text in one TCP write.
async fn send_at_once(ws: &mut RawWs, texts: &[String]) {
    let mut out = Vec::new();
    for t in texts {
        out.extend(encode_client_frame(OP_TEXT, true, t.as_bytes(), [1, 2, 3, 4]));
    }
    ws.s.write_all(&out).await.expect("write");
}

/// The next `n` JSON answers (pings skipped).
async fn answers(ws: &mut RawWs, n: usize) -> Vec<Value> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        out.push(ws.frame_skip_pings(STEP).await.json());
    }
    out
}

/// Short form of an answer: `op[:code] ch[ id]`.
fn short(v: &Value) -> String {
    let mut s = v["op"].as_str().unwrap_or("?").to_owned();
    if let Some(code) = v["code"].as_str() {
        s = format!("{s}:{code}");
    }
    s.push_str(&format!(" {}", v["ch"].as_str().unwrap_or("-")));
    if let Some(id) = v["id"].as_str().filter(|id| !id.is_empty()) {
        s.push_str(&format!(" {id}"));
    }
    s
}

/// Sends the pipelined `texts` and checks that exactly the `expected` answers come, in order,
/// and nothing after them (a `sub` of a fresh channel is answered last, as a marker).
async fn check(srv: &Server, texts: &[&str], expected: &[&str]) {
    let mut ws = RawWs::connect(srv.addr, "/ws").await;
    let texts: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
    send_at_once(&mut ws, &texts).await;
    let got: Vec<String> = answers(&mut ws, expected.len()).await.iter().map(short).collect();
    assert_eq!(got, expected, "answers to {texts:?}");
    // Nothing more: the next answer is the marker's.
    ws.send_json(&json!({"op": "sub", "ch": "zz.marker"})).await;
    let next = ws.frame_skip_pings(STEP).await.json();
    assert_eq!(short(&next), "subscribed zz.marker", "after {texts:?}: an extra answer {next}");
}

const CASES: &[(&[&str], &[&str])] = &[
    (&[r#"{"op":"sub","ch":"x"}"#, r#"{"op":"sub","ch":"x"}"#], &["subscribed x", "error:already_subscribed x"]),
    (&[r#"{"op":"sub","ch":"x"}"#, r#"{"op":"unsub","ch":"x"}"#], &["subscribed x", "unsubscribed x"]),
    (
        &[r#"{"op":"sub","ch":"x"}"#, r#"{"op":"unsub","ch":"x"}"#, r#"{"op":"sub","ch":"x"}"#],
        &["subscribed x", "unsubscribed x", "subscribed x"],
    ),
    (
        &[r#"{"op":"sub","ch":"x"}"#, r#"{"op":"unsub","ch":"x"}"#, r#"{"op":"unsub","ch":"x"}"#],
        &["subscribed x", "unsubscribed x", "error:not_subscribed x"],
    ),
    (&[r#"{"op":"unsub","ch":"x"}"#], &["error:not_subscribed x"]),
    (&[r#"{"op":"sub","ch":"x"}"#, r#"{"op":"sub","ch":"x","from":"nine"}"#], &["subscribed x", "error:bad_request x"]),
    (&[r#"{"op":"sub","ch":"x"}"#, r#"{"op":"pub","ch":"x","data":1}"#], &["subscribed x", "error:bad_request x"]),
    (
        &[r#"{"op":"sub","ch":"x"}"#, r#"{"op":"pub","ch":"x","id":"","data":1}"#],
        &["subscribed x", "error:bad_request x"],
    ),
    (&[r#"{"op":"sub","ch":"bad name"}"#], &["error:bad_channel bad name"]),
    (&[r#"{"op":"frobnicate","ch":"x"}"#], &["error:bad_op x"]),
    (&[r#"{"op":"sub","ch":7}"#], &["error:bad_request -"]),
    (
        &[r#"{"op":"sub","ch":"x"}"#, r#"{"op":"sub","ch":"y"}"#, r#"{"op":"unsub","ch":"x"}"#],
        // Per channel in order; `y` may come anywhere, here it is served after x's answers
        // only if the broker answers in request order, so the check below is per channel.
        &[],
    ),
];

#[tokio::test]
async fn pipelined_pairs_answer_once_each_in_order() {
    let srv = Server::start("", &["--cores", "1"]);
    for (texts, expected) in CASES.iter().filter(|(_, e)| !e.is_empty()) {
        check(&srv, texts, expected).await;
    }
    // A pub behind a pending sub of the same channel: the subscribed first, then the ack
    // and the message (both after it), each once.
    let mut ws = RawWs::connect(srv.addr, "/ws").await;
    let texts = [r#"{"op":"sub","ch":"x"}"#.to_owned(), r#"{"op":"pub","ch":"x","id":"p1","data":1}"#.to_owned()];
    send_at_once(&mut ws, &texts).await;
    let got: Vec<String> = answers(&mut ws, 3).await.iter().map(short).collect();
    assert_eq!(got[0], "subscribed x", "{got:?}");
    let mut rest = got[1..].to_vec();
    rest.sort();
    assert_eq!(rest, ["ack x p1", "msg x"], "{got:?}");
}

/// Random pipelined `sub`/`unsub` on a few channels, checked against a model: one answer per
/// request, per channel in request order.
async fn random_sequences(srv: &Server, seed: u64, rounds: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..rounds {
        let mut ws = RawWs::connect(srv.addr, "/ws").await;
        let chans = ["r.a", "r.b", "r.c"];
        let mut subscribed = BTreeMap::new();
        let mut expected: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        let mut texts = Vec::new();
        for _ in 0..rng.random_range(2..40) {
            let ch = chans[rng.random_range(0..chans.len())];
            let on = subscribed.entry(ch).or_insert(false);
            let answer = if rng.random_bool(0.5) {
                texts.push(json!({"op": "sub", "ch": ch}).to_string());
                if *on {
                    "error:already_subscribed"
                } else {
                    "subscribed"
                }
            } else {
                texts.push(json!({"op": "unsub", "ch": ch}).to_string());
                if *on {
                    "unsubscribed"
                } else {
                    "error:not_subscribed"
                }
            };
            *on = matches!(answer, "subscribed") || (*on && answer == "error:already_subscribed");
            expected.entry(ch).or_default().push(format!("{answer} {ch}"));
        }
        send_at_once(&mut ws, &texts).await;
        let mut got: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for v in answers(&mut ws, texts.len()).await {
            let ch = chans.iter().find(|c| v["ch"] == **c).unwrap_or_else(|| panic!("answer without a known ch: {v}"));
            got.entry(ch).or_default().push(short(&v));
        }
        assert_eq!(got, expected, "seed {seed} round {round}: {texts:?}");
        ws.send_json(&json!({"op": "sub", "ch": "zz.marker"})).await;
        let next = ws.frame_skip_pings(STEP).await.json();
        assert_eq!(short(&next), "subscribed zz.marker", "seed {seed} round {round}: an extra answer {next}");
    }
}

#[tokio::test]
async fn random_pipelines_match_the_model_on_the_memory_broker() {
    let srv = Server::start("", &["--cores", "2"]);
    random_sequences(&srv, 26, 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_pipelines_match_the_model_on_redis() {
    let redis = RedisProc::start();
    let srv = Server::start(&redis_config(&redis.url(), ""), &["--cores", "2"]);
    // Until its command link is up, the broker answers `unavailable` (not this test's model).
    srv.wait_metric("tether_broker_up", &[], STEP, |v| v == 1.0).await;
    random_sequences(&srv, 3, 25).await;
}

#[tokio::test]
async fn tungstenite_pipeline_gets_one_answer_per_request() {
    let srv = Server::start("", &["--cores", "1"]);
    let mut ws = tung::connect(&srv.ws_url()).await;
    let ws: &mut Ws = &mut ws;
    let reqs = [
        json!({"op": "sub", "ch": "t"}),
        json!({"op": "sub", "ch": "t"}),
        json!({"op": "pub", "ch": "t", "id": "k1", "data": {"a": 1}}),
        json!({"op": "unsub", "ch": "t"}),
        json!({"op": "unsub", "ch": "t"}),
    ];
    for r in &reqs {
        ws.feed(Message::text(r.to_string())).await.expect("feed");
    }
    ws.flush().await.expect("flush");
    let mut got = Vec::new();
    // Five answers and the one message of `t` the subscriber itself published.
    for _ in 0..reqs.len() + 1 {
        got.push(short(&next_json(ws).await));
    }
    let answers: Vec<&String> = got.iter().filter(|s| !s.starts_with("msg ")).collect();
    assert_eq!(
        answers,
        ["subscribed t", "error:already_subscribed t", "ack t k1", "unsubscribed t", "error:not_subscribed t"],
        "{got:?}"
    );
    // The message came while subscribed: after `subscribed`, before `unsubscribed`.
    let at = |p: &str| got.iter().position(|s| s.starts_with(p)).unwrap();
    assert!(at("subscribed") < at("msg t") && at("msg t") < at("unsubscribed"), "{got:?}");
}
