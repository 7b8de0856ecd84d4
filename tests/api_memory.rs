//! The server API (docs/api.md) on one node with the memory broker, against a real
//! `tether serve` (2 cores) and tokio-tungstenite clients holding JWTs:
//! - a batch publish gives each channel its own seq, dedups a retried `id` per channel (with
//!   `POST /publish`'s Idempotency-Key too), and answers per channel in request order;
//! - a history page equals what a `sub` with `from` replays;
//! - channels are listed with their subscribers summed over the cores;
//! - unsubscribe, disconnect and revoke reach the user's connections on every core; a revoked
//!   token is refused at the upgrade (401) and at `refresh` (4003), a fresh one is not;
//! - the guard: loopback without publish keys, the key with them (401), browsers from
//!   elsewhere 403; bad input is 400 naming the field, 404 and 405 with `Allow`.

mod common;

use std::time::Duration;

use common::api::*;
use common::auth::{hs256_config, now_s, ws_url_with};
use common::tung::{self, Read};
use common::*;
use serde_json::{json, Value};

const KEY: &str = "pk-0123456789abcdef";

fn node(extra: &str) -> Server {
    let cfg = format!("{}{extra}\n[[channels]]\npattern = \"*\"\nhistory = 50\n", hs256_config(30_000));
    Server::start(&cfg, &["--cores", "2"])
}

#[tokio::test]
async fn batch_publish_gives_each_channel_its_own_seq_and_dedups_a_retried_id() {
    let s = node("");
    let mut sub = subscriber(s.addr, &token("u", None, None), "b.2").await;
    s.publish("b.1", "0").await; // b.1 is at seq 1 before the batch.
    let body = json!({"channels": ["b.1", "b.2", "b.3"], "data": {"x": 1}, "id": "batch-1"});
    let first = post_ok(s.addr, "/api/publish", body.clone()).await;
    assert_eq!(
        first,
        json!({"results": [{"ch":"b.1","seq":2},{"ch":"b.2","seq":1},{"ch":"b.3","seq":1}]}),
        "one seq per channel, in request order"
    );
    let m = tung::next_json(&mut sub).await;
    assert_eq!(m, json!({"op":"msg","ch":"b.2","seq":1,"data":{"x":1}}));
    assert_eq!(post_ok(s.addr, "/api/publish", body).await, first, "a retry with the same id is deduplicated");
    tung::quiet(&mut sub, Duration::from_millis(200)).await;
    // The id is each channel's Idempotency-Key: the same dedup as POST /publish/{ch}.
    let (status, _, seq) =
        http_request(s.addr, "POST", "/publish/b.3", &[("Idempotency-Key", "batch-1")], b"{\"x\":1}").await;
    assert_eq!((status, seq_of_reply(&seq)), (200, 1));
    let again = post_ok(s.addr, "/api/publish", json!({"channels": ["b.3", "b.1"], "data": [1]})).await;
    assert_eq!(again, json!({"results": [{"ch":"b.3","seq":2},{"ch":"b.1","seq":3}]}), "without id: new seqs");
}

#[tokio::test]
async fn history_through_the_api_equals_what_a_resume_replays() {
    let s = node("");
    for n in 1..=30 {
        s.publish("h", &json!({"n": n, "s": "é\"x"}).to_string()).await;
    }
    let mut ws = tung::connect(&ws_url_with(s.addr, &token("u", None, None))).await;
    tung::send(&mut ws, json!({"op":"sub","ch":"h","from":10})).await;
    let subscribed = tung::next_json(&mut ws).await;
    assert_eq!(subscribed["recovered"], true, "{subscribed}");
    let mut replayed = Vec::new();
    for _ in 11..=30 {
        let m = tung::next_json(&mut ws).await;
        replayed.push(json!({"seq": m["seq"], "data": m["data"]}));
    }
    let page = get_ok(s.addr, "/api/history/h?from=10&limit=1000").await;
    assert_eq!(page["messages"], Value::Array(replayed.clone()), "the page is the replay");
    assert_eq!((page["ch"].as_str(), page["head"].as_u64(), page["oldest"].as_u64()), (Some("h"), Some(30), Some(1)));
    assert_eq!(page["epoch"], subscribed["epoch"]);
    let newest = get_ok(s.addr, "/api/history/h?limit=3").await;
    assert_eq!(newest["messages"], Value::Array(replayed[17..].to_vec()), "without from: the newest");
    assert_eq!(get_ok(s.addr, "/api/history/h?from=30").await["messages"], json!([]));
    let fresh = get_ok(s.addr, "/api/history/never.used").await;
    assert_eq!((fresh["head"].as_u64(), fresh["messages"].as_array().map(Vec::len)), (Some(0), Some(0)));
}

#[tokio::test]
async fn channels_are_listed_with_subscribers_from_every_core() {
    let s = node("");
    let t = token("u", None, None);
    let mut held = Vec::new();
    // Connections land on either core (SO_REUSEPORT): subscribe until both hold some.
    for n in 1.. {
        held.push(subscriber(s.addr, &t, "room.a").await);
        let m = s.metrics().await;
        let on = |core: &str| m.sum("tether_connections", &[&format!("core=\"{core}\"")]);
        if on("0") > 0.0 && on("1") > 0.0 {
            break;
        }
        assert!(n < 64, "64 connections all on one core");
    }
    let on_a = held.len();
    for ch in ["room.b", "other"] {
        held.push(subscriber(s.addr, &t, ch).await);
    }
    let v = get_ok(s.addr, "/api/channels?prefix=room.").await;
    assert_eq!(
        v,
        json!({"channels": [{"ch":"room.a","subscribers":on_a},{"ch":"room.b","subscribers":1}], "truncated": false})
    );
    let v = get_ok(s.addr, "/api/channels?limit=1").await;
    assert_eq!(v, json!({"channels": [{"ch":"other","subscribers":1}], "truncated": true}));
}

#[tokio::test]
async fn unsubscribe_disconnect_and_revoke_reach_the_users_connections() {
    let s = node("");
    let (alice1, alice2, bob) =
        (token("alice", Some("a-1"), None), token("alice", Some("a-2"), None), token("bob", Some("b-1"), None));
    let mut a1 = subscriber(s.addr, &alice1, "news").await;
    let mut a2 = subscriber(s.addr, &alice2, "news").await;
    let mut b = subscriber(s.addr, &bob, "news").await;

    let v = post_ok(s.addr, "/api/unsubscribe", json!({"user": "alice", "ch": "news"})).await;
    assert_eq!(v, json!({"unsubscribed": 2, "other_nodes": 0}));
    for ws in [&mut a1, &mut a2] {
        assert_eq!(tung::next_json(ws).await, json!({"op":"unsubscribed","ch":"news","reason":"server"}));
    }
    s.publish("news", "1").await;
    assert_eq!(tung::next_json(&mut b).await["seq"], 1);
    tung::quiet(&mut a1, Duration::from_millis(200)).await;

    let v = post_ok(s.addr, "/api/disconnect", json!({"user": "alice", "code": 4000, "reason": "bye"})).await;
    assert_eq!(v, json!({"closed": 2, "other_nodes": 0}));
    for ws in [&mut a1, &mut a2] {
        assert_eq!(closed(ws).await, (4000, "bye".to_owned()));
    }
    assert_eq!(upgrade_status(s.addr, &alice1).await, 101, "a disconnect is not a revocation");

    // Revoked by token id: bob's connection closes with 4003; his token is refused, another is not.
    let v = post_ok(s.addr, "/api/revoke", json!({"jti": "b-1"})).await;
    assert_eq!((v["closed"].as_u64(), v["other_nodes"].as_u64()), (Some(1), Some(0)), "{v}");
    let (code, reason) = closed(&mut b).await;
    assert_eq!(
        (code, serde_json::from_str::<Value>(&reason).unwrap()),
        (4003, json!({"reason":"forbidden","detail":"token revoked"}))
    );
    assert_eq!(upgrade_status(s.addr, &bob).await, 401);
    assert_eq!(upgrade_status(s.addr, &token("bob", Some("b-2"), None)).await, 101);

    // Revoked by user: tokens issued up to that second are refused, at the upgrade and at
    // refresh; a token issued later passes.
    let carol_old = token("carol", None, Some(now_s() - 5));
    let mut c = subscriber(s.addr, &token("carol", None, None), "news").await;
    let v = post_ok(s.addr, "/api/revoke", json!({"user": "carol"})).await;
    assert_eq!(v["closed"], 1, "{v}");
    assert_eq!(closed(&mut c).await.0, 4003);
    assert_eq!(upgrade_status(s.addr, &carol_old).await, 401);
    let carol_new = token("carol", None, Some(now_s() + 2));
    let mut c = subscriber(s.addr, &carol_new, "news").await;
    tung::send(&mut c, json!({"op": "refresh", "token": carol_old})).await;
    assert_eq!(closed(&mut c).await.0, 4003, "a revoked token is refused at refresh");
}

#[tokio::test]
async fn the_guard_and_bad_input() {
    // Without publish keys: the admin rules (this test's loopback peer and Host pass).
    let s = node("");
    let body = json!({"channels": ["g"], "data": 1}).to_string();
    assert_eq!(call(s.addr, "POST", "/api/publish", &[], &body).await.status, 200);
    let browser = [("Origin", "https://evil.example"), ("Sec-Fetch-Site", "cross-site")];
    assert_eq!(call(s.addr, "POST", "/api/disconnect", &browser, r#"{"user":"x"}"#).await.status, 403);
    for (method, path, body, field) in [
        ("POST", "/api/publish", r#"{"channels":["ok","bad name"],"data":1}"#, "channels"),
        ("POST", "/api/publish", r#"{"channels":["ok"]}"#, "data"),
        ("POST", "/api/publish", r#"{"channels":["ok"],"data":1,"extra":2}"#, "extra"),
        ("GET", "/api/history/bad%20name", "", "ch"),
        ("GET", "/api/history/ok?limit=5000", "", "limit"),
        ("GET", "/api/channels?prefix=a%20b", "", "prefix"),
        // A misspelt query parameter is refused by its name, never ignored.
        ("GET", "/api/history/ok?form=3&limit=1", "", "form"),
        ("GET", "/api/channels?prefx=a", "", "prefx"),
        ("GET", "/api/presence_stats/ok?x=1", "", "x"),
        ("POST", "/api/disconnect?user=u", r#"{"user":"u"}"#, "user"),
        ("POST", "/api/disconnect", r#"{"user":"u","code":1000}"#, "code"),
        ("POST", "/api/unsubscribe", r#"{"user":"u"}"#, "ch"),
        ("POST", "/api/revoke", r#"{"until_ms":1}"#, "until_ms"),
        ("POST", "/api/revoke", r#"{}"#, "jti"),
    ] {
        let a = call(s.addr, method, path, &[], body).await;
        assert_eq!((a.status, a.field()), (400, field), "{method} {path} {body}: {a:?}");
        assert!(header(&a.head, "content-type").is_some_and(|c| c.starts_with("application/json")), "{}", a.head);
    }
    assert_eq!(call(s.addr, "GET", "/api/nope", &[], "").await.status, 404);
    let a = call(s.addr, "GET", "/api/publish", &[], "").await;
    assert_eq!((a.status, header(&a.head, "allow")), (405, Some("POST")));
    let a = call(s.addr, "POST", "/api/channels", &[], "").await;
    assert_eq!((a.status, header(&a.head, "allow")), (405, Some("GET, HEAD")));

    // With publish keys: the key is the credential, loopback is not.
    let s = node(&format!("publish_keys = [\"{KEY}\"]\n"));
    let good = format!("Bearer {KEY}");
    assert_eq!(call(s.addr, "GET", "/api/channels", &[], "").await.status, 401);
    let wrong = call(s.addr, "GET", "/api/channels", &[("Authorization", "Bearer nope-0123456789abcdef")], "").await;
    assert_eq!((wrong.status, header(&wrong.head, "www-authenticate").is_some()), (401, true));
    assert_eq!(call(s.addr, "GET", "/api/channels", &[("Authorization", &good)], "").await.status, 200);
    let a = call(s.addr, "POST", "/api/publish", &[("Authorization", &good), ("Sec-Fetch-Site", "cross-site")], &body)
        .await;
    assert_eq!(a.status, 403, "a browser's request from elsewhere, key or not");
    let failures = s.metric("tether_http_auth_failures_total", &["endpoint=\"api\""]).await;
    assert_eq!(failures, 3.0);

    // The body of a batch publish is bounded like POST /publish's.
    let s = Server::start("[limits]\nmax_publish_bytes = 200\n", &["--cores", "1"]);
    let big = json!({"channels": ["a", "b"], "data": "x".repeat(200)}).to_string();
    assert_eq!(call(s.addr, "POST", "/api/publish", &[], &big).await.status, 413);
}

#[tokio::test]
async fn a_history_page_of_large_messages_stops_at_a_mebibyte() {
    let s = node("");
    // 600 KiB each: a page holds one (the next would pass 1 MiB of data), whatever `limit`.
    let big = format!("\"{}\"", "x".repeat(600 * 1024));
    for _ in 0..3 {
        s.publish("big", &big).await;
    }
    let mut from = 0;
    let mut seqs = Vec::new();
    for _ in 0..5 {
        let page = get_ok(s.addr, &format!("/api/history/big?from={from}&limit=1000")).await;
        let got: Vec<u64> =
            page["messages"].as_array().expect("messages").iter().map(|m| m["seq"].as_u64().unwrap()).collect();
        assert_eq!(got.len(), 1, "one 600 KiB message per page");
        assert_eq!(page["messages"][0]["data"].as_str().map(str::len), Some(600 * 1024));
        from = got[0];
        seqs.extend(got);
        if from == page["head"].as_u64().unwrap() {
            break;
        }
    }
    assert_eq!(seqs, [1, 2, 3], "paging from the last seq reads every message once");
}

#[tokio::test]
async fn without_auth_no_connection_has_a_user() {
    let s = Server::start("", &["--cores", "1"]);
    let mut ws = tung::connect(&s.ws_url()).await;
    let v = post_ok(s.addr, "/api/disconnect", json!({"user": "anyone"})).await;
    assert_eq!(v, json!({"closed": 0, "other_nodes": 0}));
    tung::send(&mut ws, json!({"op":"sub","ch":"x"})).await;
    assert!(matches!(tung::read(&mut ws).await, Read::Json(v) if v["op"] == "subscribed"));
}

#[tokio::test]
async fn tether_api_prints_the_answer_as_one_line() {
    let s = node(&format!("publish_keys = [\"{KEY}\"]\n"));
    let url = format!("http://{}", s.addr);
    let api = |args: &[&str]| {
        let mut all = vec!["api", "--url", &url, "--token", KEY];
        all.extend_from_slice(args);
        run_tether(&all)
    };
    let out = api(&["publish", "-c", "cli.a", "-c", "cli.b", r#"{"n":1}"#, "--id", "k"]);
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8_lossy(&out.stdout);
    assert_eq!(line.lines().count(), 1, "{line}");
    let v: Value = serde_json::from_str(line.trim()).expect("JSON");
    assert_eq!(v, json!({"results": [{"ch":"cli.a","seq":1},{"ch":"cli.b","seq":1}]}));
    let out = api(&["history", "cli.b", "--from", "0"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["messages"], json!([{"seq":1,"data":{"n":1}}]));
    let out = api(&["disconnect", "alice", "--code", "1000"]);
    assert_eq!(out.status.code(), Some(1), "the node's 400");
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP 400: code:"), "{out:?}");
    let out = run_tether(&["api", "--url", &url, "channels"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP 401"), "{out:?}");
}

#[tokio::test]
async fn tether_sub_ends_when_the_server_unsubscribes_it() {
    let s = node("");
    let child = std::process::Command::new(common::server::BIN)
        .args(["sub", &s.ws_url(), "ended", "--token", &token("dora", None, None)])
        .env("TETHER_LOG", "off")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn tether sub");
    eventually(STEP, "tether sub subscribed", || async {
        let v = get_ok(s.addr, "/api/channels?prefix=ended").await;
        check(v["channels"].as_array().is_some_and(|c| c.len() == 1), || v)
    })
    .await;
    let v = post_ok(s.addr, "/api/unsubscribe", json!({"user": "dora", "ch": "ended"})).await;
    assert_eq!(v["unsubscribed"], 1);
    let out = wait_child(child, STEP, "tether sub");
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r#"{"op":"unsubscribed","ch":"ended","reason":"server"}"#), "{err}");
}
