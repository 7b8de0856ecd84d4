//! The `examples/` programs (a publisher and a subscriber with `tether-client`) against a real
//! server: what `publish` acks, `subscribe` replays from history in order, byte for byte the
//! data an independent (tokio-tungstenite) subscriber received live; bad arguments are refused
//! with a message that says what is wrong.

mod common;

// Each example's `main` goes unused here: the tests call its `run`.
#[allow(dead_code)]
#[path = "../examples/publish.rs"]
mod publish;
#[allow(dead_code)]
#[path = "../examples/subscribe.rs"]
mod subscribe;

use common::tung::next_json;
use common::*;
use serde_json::json;
use tokio::time::timeout;

const CH: &str = "examples.news";

#[tokio::test]
async fn publish_then_subscribe_from_history() {
    let srv = Server::start("", &[]);
    let url = srv.ws_url();

    let mut live = tung::connect(&url).await;
    tung::send(&mut live, json!({"op": "sub", "ch": CH})).await;
    let v = next_json(&mut live).await;
    assert_eq!(v["op"], "subscribed", "{v}");

    let mut acks = Vec::new();
    for n in 1..=3 {
        let data = format!(r#"{{"n":{n},"text":"héllo"}}"#);
        timeout(STEP, publish::run(&url, CH, &data, 1, &mut acks)).await.expect("publish in time").expect("publish");
    }
    let acks = String::from_utf8(acks).expect("utf-8");
    let seqs: Vec<&str> = acks.lines().map(|l| l.split(' ').nth(1).expect("a seq field")).collect();
    assert_eq!(seqs, ["#1", "#2", "#3"], "acks: {acks}");
    assert!(acks.lines().all(|l| l.starts_with(&format!("{CH} #"))), "acks: {acks}");

    let mut live_data = Vec::new();
    for seq in 1..=3u64 {
        let v = next_json(&mut live).await;
        assert_eq!((v["op"].as_str(), v["seq"].as_u64()), (Some("msg"), Some(seq)), "{v}");
        live_data.push(v["data"].to_string());
    }

    let mut lines = Vec::new();
    timeout(STEP, subscribe::run(&url, CH, Some(0), 3, &mut lines))
        .await
        .expect("subscribe in time")
        .expect("subscribe");
    let lines = String::from_utf8(lines).expect("utf-8");
    let expected: Vec<String> = live_data.iter().enumerate().map(|(i, d)| format!("{CH} #{} {d}", i + 1)).collect();
    assert_eq!(lines.lines().collect::<Vec<_>>(), expected, "subscriber output: {lines}");
}

#[tokio::test]
async fn bad_arguments_are_refused_by_name() {
    let srv = Server::start("", &[]);
    let url = srv.ws_url();
    let mut out = Vec::new();
    let e = timeout(STEP, publish::run(&url, CH, "not json", 1, &mut out)).await.expect("in time").unwrap_err();
    assert!(e.to_string().contains("DATA is not JSON"), "{e}");
    let e = timeout(STEP, subscribe::run(&url, "bad channel!", None, 1, &mut out)).await.expect("in time").unwrap_err();
    assert!(e.to_string().contains("channel"), "the refusal names the channel: {e}");
    let e = timeout(STEP, subscribe::run("http://127.0.0.1:1/ws", CH, None, 1, &mut out))
        .await
        .expect("in time")
        .unwrap_err();
    assert!(e.to_string().contains("ws://"), "a URL that is not ws:// is refused: {e}");
    assert!(out.is_empty(), "nothing written on a refusal: {out:?}");
}
