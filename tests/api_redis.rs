//! The server API (docs/api.md) across two nodes sharing one real Redis: what is asked of
//! node A reaches node B's connections (disconnect, unsubscribe, revoke, through the control
//! topic), a revocation is kept in Redis for a node that starts later, batch publish and
//! history read the shared streams (history through the API equals a resume on the other
//! node), and channels are each node's own.

mod common;

use common::api::*;
use common::auth::{hs256_config, ws_url_with};
use common::redis::{redis_config, RedisProc};
use common::tung;
use common::*;
use serde_json::{json, Value};

/// A node on `redis` with JWT auth, 2 cores, ready.
async fn node(redis: &RedisProc) -> Server {
    let s = Server::start(&format!("{}{}", redis_config(&redis.url(), ""), hs256_config(30_000)), &["--cores", "2"]);
    wait_ready(s.addr, STEP).await;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_across_two_nodes() {
    let redis = RedisProc::start();
    let (a, b) = (node(&redis).await, node(&redis).await);

    // Batch publish on A: each channel its own seq in Redis; a retried id is deduplicated.
    let body = json!({"channels": ["r.1", "r.2"], "data": {"k": "v"}, "id": "once"});
    let first = post_ok(a.addr, "/api/publish", body.clone()).await;
    assert_eq!(first, json!({"results": [{"ch":"r.1","seq":1},{"ch":"r.2","seq":1}]}));
    assert_eq!(post_ok(b.addr, "/api/publish", body).await, first, "deduplicated on any node");
    for n in 2..=12 {
        a.publish("r.1", &json!({"n": n}).to_string()).await;
    }

    // History on B equals a resume on B (both read the Redis stream).
    let mut ws = tung::connect(&ws_url_with(b.addr, &token("reader", None, None))).await;
    tung::send(&mut ws, json!({"op":"sub","ch":"r.1","from":4})).await;
    let subscribed = tung::next_json(&mut ws).await;
    let mut replayed = Vec::new();
    for _ in 5..=12 {
        let m = tung::next_json(&mut ws).await;
        replayed.push(json!({"seq": m["seq"], "data": m["data"]}));
    }
    let page = get_ok(b.addr, "/api/history/r.1?from=4").await;
    assert_eq!(page["messages"], Value::Array(replayed));
    assert_eq!((page["epoch"].clone(), page["head"].as_u64()), (subscribed["epoch"].clone(), Some(12)));

    // Connections: alice on B (two of them), bob on B, carol on B.
    let mut alice = subscriber(b.addr, &token("alice", None, None), "room").await;
    let mut alice2 = subscriber(b.addr, &token("alice", None, None), "room").await;
    let bob_token = token("bob", Some("bob-1"), None);
    let mut bob = subscriber(b.addr, &bob_token, "room").await;
    let channels = get_ok(b.addr, "/api/channels?prefix=room").await;
    assert_eq!(channels["channels"], json!([{"ch":"room","subscribers":3}]));
    assert_eq!(get_ok(a.addr, "/api/channels?prefix=room").await["channels"], json!([]), "B's subscribers are B's");

    // Asked of A, done on B.
    let v = post_ok(a.addr, "/api/unsubscribe", json!({"user": "alice", "ch": "room"})).await;
    assert_eq!(v, json!({"unsubscribed": 0, "other_nodes": 1}));
    for ws in [&mut alice, &mut alice2] {
        assert_eq!(tung::next_json(ws).await, json!({"op":"unsubscribed","ch":"room","reason":"server"}));
    }
    let v = post_ok(a.addr, "/api/disconnect", json!({"user": "alice", "code": 1012})).await;
    assert_eq!(v, json!({"closed": 0, "other_nodes": 1}));
    for ws in [&mut alice, &mut alice2] {
        assert_eq!(closed(ws).await.0, 1012);
    }
    let v = post_ok(a.addr, "/api/revoke", json!({"jti": "bob-1"})).await;
    assert_eq!((v["closed"].as_u64(), v["other_nodes"].as_u64()), (Some(0), Some(1)), "{v}");
    assert_eq!(closed(&mut bob).await.0, 4003);
    assert_eq!(upgrade_status(b.addr, &bob_token).await, 401, "refused on the other node");

    // A node that starts after the revocation reads it from Redis.
    let c = node(&redis).await;
    eventually(STEP, "node C refusing the revoked token", || async {
        let status = upgrade_status(c.addr, &bob_token).await;
        check(status == 401, || status)
    })
    .await;
    assert_eq!(upgrade_status(c.addr, &token("bob", Some("bob-2"), None)).await, 101);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_history_and_control_answer_503() {
    let mut redis = RedisProc::start();
    let a = node(&redis).await;
    redis.kill9();
    wait_ready_status(a.addr, 503).await;
    let h = call(a.addr, "GET", "/api/history/x", &[], "").await;
    assert_eq!((h.status, h.body["code"].as_str()), (503, Some("unavailable")), "{h:?}");
    assert!(header(&h.head, "retry-after").is_some());
    let d = call(a.addr, "POST", "/api/disconnect", &[], r#"{"user":"u"}"#).await;
    assert_eq!(
        (d.status, d.body["closed"].as_u64()),
        (503, Some(0)),
        "this node acted; the others were not told: {d:?}"
    );
    let p = post_ok(a.addr, "/api/publish", json!({"channels": ["x"], "data": 1})).await;
    assert_eq!(p["results"][0]["code"], "unavailable", "{p}");
}

/// Waits until `/readyz` answers `status`.
async fn wait_ready_status(addr: std::net::SocketAddr, status: u16) {
    eventually(STEP, "readyz status", || async {
        let (s, _, _) = http_request(addr, "GET", "/readyz", &[], b"").await;
        check(s == status, || s)
    })
    .await;
}
