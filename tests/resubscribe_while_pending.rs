//! A `sub`, its `unsub` and a second `sub` of the same channel sent back to back (before the
//! first is confirmed): each is answered, in request order (`subscribed`, `unsubscribed`,
//! `subscribed`: docs/protocol.md, "Answers"), and the second subscription resumes from its own
//! `from`, with no silent gap and no duplicate.

mod common;

use common::{serial, RawWs, Server, STEP};
use serde_json::json;

const CONFIG: &str = "[[channels]]\npattern = \"*\"\nhistory = 10000\n";

async fn resubscribe(first_from: u64, second_from: u64) -> Vec<u64> {
    let srv = Server::start(CONFIG, &["--cores", "2"]);
    let mut http = common::HttpConn::new(srv.addr).await;
    for i in 1..=3000u64 {
        assert_eq!(http.publish("R", format!("{{\"i\":{i}}}").as_bytes()).await, i);
    }
    let mut ws = RawWs::connect(srv.addr, "/ws").await;
    // One write: all three requests reach the server before any reply comes back.
    let batch: Vec<u8> = [
        json!({"op": "sub", "ch": "R", "from": first_from}),
        json!({"op": "unsub", "ch": "R"}),
        json!({"op": "sub", "ch": "R", "from": second_from}),
    ]
    .iter()
    .flat_map(|j| tether::ws::codec::encode_client_frame(0x1, true, j.to_string().as_bytes(), [7, 1, 3, 9]))
    .collect();
    tokio::io::AsyncWriteExt::write_all(&mut ws.s, &batch).await.expect("send batch");
    // Answers in request order; the first subscription's messages (a prefix of its replay)
    // come between its `subscribed` and the `unsubscribed`, the second's after its own.
    let mut answers = Vec::new();
    let (mut first, mut seqs) = (Vec::new(), Vec::new());
    while seqs.last().copied() != Some(3000) {
        let f = ws.frame_skip_pings(STEP).await.json();
        match f["op"].as_str() {
            Some(op @ ("subscribed" | "unsubscribed")) => answers.push(op.to_owned()),
            Some("msg") if answers.len() == 1 => first.push(f["seq"].as_u64().expect("seq")),
            Some("msg") if answers.len() == 3 => seqs.push(f["seq"].as_u64().expect("seq")),
            _ => panic!("unexpected {f} after {answers:?}"),
        }
    }
    assert_eq!(answers, ["subscribed", "unsubscribed", "subscribed"]);
    let want_first: Vec<u64> = (first_from + 1..=3000).take(first.len()).collect();
    assert_eq!(first, want_first, "the first subscription's messages: a prefix of its replay");
    seqs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_sub_resumes_from_its_own_from() {
    let _g = serial().await;
    assert_eq!(resubscribe(2990, 0).await, (1..=3000).collect::<Vec<_>>());
    assert_eq!(resubscribe(0, 2990).await, (2991..=3000).collect::<Vec<_>>());
}
