//! A message the server accepts is delivered to subscribers that read (issue 8, coherent
//! limits): with the default configuration, a publish of exactly `limits.max_publish_bytes`
//! (1 MiB) reaches two reading subscribers — tokio-tungstenite and a raw RFC 6455 client —
//! and neither is closed. Before the limits were made coherent, the `msg` frame (body plus
//! envelope) was larger than the 1 MiB queue and every subscriber got 1013.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const CH: &str = "large";
/// The default `limits.max_publish_bytes`.
const MAX_PUBLISH: usize = 1_048_576;

/// A JSON string of exactly `len` bytes (quotes included).
fn json_string(len: usize) -> Vec<u8> {
    let mut s = Vec::with_capacity(len);
    s.push(b'"');
    s.resize(len - 1, b'x');
    s.push(b'"');
    s
}

/// Reads the tokio-tungstenite stream until a `msg`, answering nothing else; panics on a
/// close or after `STEP`.
async fn next_msg<S>(ws: &mut S) -> Value
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        let m = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("no message within STEP")
            .expect("stream ended")
            .expect("ws error");
        match m {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(&t).expect("JSON");
                if v["op"] == "msg" {
                    return v;
                }
            }
            Message::Close(c) => panic!("closed: {c:?}"),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_size_publish_reaches_two_reading_subscribers_without_a_close() {
    // The default config; only the core count is pinned (two cores, so delivery crosses cores).
    let srv = Server::start("", &["--cores", "2"]);

    let mut tt = tung::connect(&srv.ws_url()).await;
    tung::send(&mut tt, json!({"op": "sub", "ch": CH})).await;
    let sub = loop {
        let m = tokio::time::timeout(STEP, tt.next()).await.expect("subscribed in time").unwrap().unwrap();
        if let Message::Text(t) = m {
            break serde_json::from_str::<Value>(&t).unwrap();
        }
    };
    assert_eq!(sub["op"], "subscribed", "{sub}");
    let mut raw = RawWs::connect(srv.addr, "/ws").await;
    raw.subscribe(CH).await;

    // The largest body the server accepts, and the example of the issue.
    for (k, len) in [(1u64, MAX_PUBLISH), (2, 1_048_522)] {
        let body = json_string(len);
        let (status, _, resp) = http_request(srv.addr, "POST", &format!("/publish/{CH}"), &[], &body).await;
        assert_eq!(status, 200, "publish of {len} bytes: {}", String::from_utf8_lossy(&resp));
        assert_eq!(seq_of_reply(&resp), k);

        let v = next_msg(&mut tt).await;
        assert_eq!(
            (v["seq"].as_u64(), v["data"].as_str().map(str::len)),
            (Some(k), Some(len - 2)),
            "tokio-tungstenite"
        );
        let f = raw.frame_skip_pings(STEP).await;
        assert_eq!(f.opcode, OP_TEXT, "raw client got opcode {} instead of the msg", f.opcode);
        assert_eq!(msg_seq(&f.payload), k, "raw client");
        let data_end = f.payload.len() - 1; // the msg object's closing brace
        assert!(
            f.payload[..data_end].ends_with(&body[body.len() - 10..]) && f.payload.len() > len,
            "raw client: whole body"
        );
    }

    // Both are still open and subscribed: a small message follows.
    srv.publish(CH, "{\"after\":true}").await;
    assert_eq!(next_msg(&mut tt).await["seq"], 3);
    assert_eq!(msg_seq(&raw.frame_skip_pings(STEP).await.payload), 3);
    let m = srv.metrics().await;
    assert_eq!(m.sum("tether_overflow_total", &[]), 0.0, "an overflow happened");
    assert_eq!(m.sum("tether_closes_total", &["code=\"1013\""]), 0.0, "a subscriber was closed with 1013");
    srv.wait_gauge(2.0, Duration::from_secs(2)).await;
}
