//! The feeds admin API (docs/feeds.md, DESIGN §7 "Admin API") on a real node with the memory
//! store and broker, a test upstream in this process, test timings (renew 250 ms):
//! - no or a wrong admin token: 401; bad input: 400 naming the field; unknown feed: 404;
//! - `PUT /feeds/{id}` creates (201) and replaces (200); the node connects upstream at once;
//! - `POST /feeds/{id}/stop` closes the upstream within one renew interval, and
//!   `POST /feeds/{id}/start` reopens it resuming after the `last_seq` stored at the stop;
//! - `GET /feeds/{id}` shows the record with the owner's live fields; `DELETE` removes it.

mod common;

use std::time::{Duration, Instant};

use common::feeds::{channel, node_config, Recorder};
use common::upstream::Upstream;
use common::{check, eventually, http_request, Server};
use serde_json::{json, Value};

const TOKEN: &str = "admin-token-0123456789";

async fn call(node: &Server, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let auth = format!("Bearer {TOKEN}");
    let (status, _, body) = http_request(node.addr, method, path, &[("Authorization", &auth)], body).await;
    let v = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) };
    (status, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_start_through_the_api() {
    let up = Upstream::start(Duration::from_millis(20), None).await;
    let cfg = format!("{}[admin]\ntoken = \"{TOKEN}\"\n", node_config("", "memory", &up, &[]));
    let node = Server::start(&cfg, &[]);
    let body = json!({"url": up.url("api"), "channel": channel("api"), "resume_query": "from", "seq_pointer": "/seq"});
    let body = body.to_string();

    // Credentials.
    let (status, _, _) = http_request(node.addr, "GET", "/feeds", &[], b"").await;
    assert_eq!(status, 401);
    let (status, _, _) =
        http_request(node.addr, "GET", "/feeds", &[("Authorization", "Bearer wrong-token-xxxxxxxx")], b"").await;
    assert_eq!(status, 401);

    // Bad input names the field.
    let bad = json!({"url": "http://x/", "channel": "c", "seq_pointer": "/seq"}).to_string();
    let (status, v) = call(&node, "PUT", "/feeds/api", bad.as_bytes()).await;
    assert_eq!((status, v["field"].as_str()), (400, Some("url")), "{v}");
    let bad = json!({"url": up.url("api"), "channel": "c", "seq_pointer": "/seq", "colour": 1}).to_string();
    let (status, v) = call(&node, "PUT", "/feeds/api", bad.as_bytes()).await;
    assert_eq!((status, v["field"].as_str()), (400, Some("colour")), "{v}");
    let (status, v) = call(&node, "PUT", "/feeds/a:b", body.as_bytes()).await;
    assert_eq!((status, v["field"].as_str()), (400, Some("id")), "{v}");
    let (status, _) = call(&node, "PUT", "/feeds/api", b"{not json").await;
    assert_eq!(status, 400);
    assert_eq!(call(&node, "GET", "/feeds/nope", b"").await.0, 404);
    assert_eq!(call(&node, "POST", "/feeds/nope/stop", b"").await.0, 404);
    assert_eq!(call(&node, "POST", "/feeds/api", b"").await.0, 405);

    // Create, connect, replace.
    let (status, v) = call(&node, "PUT", "/feeds/api", body.as_bytes()).await;
    assert_eq!(status, 201, "{v}");
    up.wait_open("api", 1, Duration::from_secs(3)).await;
    let rec = Recorder::start(node.addr, &[channel("api")]).await;
    let (status, _) = call(&node, "PUT", "/feeds/api", body.as_bytes()).await;
    assert_eq!(status, 200);
    eventually(Duration::from_secs(5), "20 messages from the feed", || async {
        let n = rec.count(&channel("api"));
        check(n >= 20, || format!("{n} messages"))
    })
    .await;
    let (status, v) = call(&node, "GET", "/feeds/api", b"").await;
    assert_eq!(status, 200);
    assert_eq!(v["connected"], true, "{v}");
    assert_eq!(v["desired_state"], "STARTED", "{v}");
    assert!(v["lag_ms"].as_u64().is_some() && v["reconnects"].as_u64().is_some(), "{v}");
    assert!(v["fencing_token"].as_u64().unwrap() >= 1, "{v}");

    // STOP closes the upstream within one renew interval.
    let asked = Instant::now();
    let (status, v) = call(&node, "POST", "/feeds/api/stop", b"").await;
    assert_eq!((status, v["desired_state"].as_str()), (200, Some("STOPPED")), "{v}");
    up.wait_open("api", 0, Duration::from_millis(250)).await;
    eprintln!("upstream closed {} ms after POST /feeds/api/stop", asked.elapsed().as_millis());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, v) = call(&node, "GET", "/feeds/api", b"").await;
    let last: u64 = v["last_seq"].as_str().expect("last_seq stored at the stop").parse().unwrap();
    assert_eq!(v["lease_expires_at_ms"], 0, "released: {v}");
    assert_eq!(v["connected"], Value::Null, "not owned: no live fields: {v}");
    let got = rec.got.lock().unwrap().get(&channel("api")).cloned().unwrap_or_default();
    assert_eq!(got.last().map(|m| m.1), Some(last), "last_seq = the last upstream seq published");

    // START reopens it, resuming after last_seq.
    let (status, _) = call(&node, "POST", "/feeds/api/start", b"").await;
    assert_eq!(status, 200);
    up.wait_open("api", 1, Duration::from_secs(2)).await;
    assert_eq!(up.resumes("api").last(), Some(&last), "resumed from last_seq");
    let before = rec.count(&channel("api"));
    eventually(Duration::from_secs(5), "10 more messages after START", || async {
        let n = rec.count(&channel("api"));
        check(n >= before + 10, || format!("{n} messages, {before} before START"))
    })
    .await;
    rec.assert_continuous();

    let (status, v) = call(&node, "GET", "/feeds", b"").await;
    assert_eq!((status, v.as_array().map(Vec::len)), (200, Some(1)), "{v}");
    assert_eq!(call(&node, "DELETE", "/feeds/api", b"").await.0, 200);
    up.wait_open("api", 0, Duration::from_millis(500)).await;
    assert_eq!(call(&node, "GET", "/feeds/api", b"").await.0, 404);
}
