//! Token expiry on live connections (DESIGN §9, docs/security.md), on a real server: at `exp`
//! the server sends `error` `token_expired`; without a refresh the connection is closed with
//! 4001 after `token_refresh_grace_ms`; a `refresh` keeps it with no gap in deliveries; a
//! narrowing refresh ends the subscriptions it no longer allows; a refused refresh closes 4003;
//! a server without auth answers `refresh` with `bad_op`.

mod common;

use std::time::{Duration, Instant};

use common::auth::*;
use common::tung::{self, next_json, read_within, send, Read, Ws};
use common::*;
use serde_json::{json, Value};

async fn subscribe(ws: &mut Ws, ch: &str) {
    send(ws, json!({"op":"sub","ch":ch})).await;
    let v = next_json(ws).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str()), (Some("subscribed"), Some(ch)), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_warns_then_closes_4001_after_the_grace() {
    let _serial = serial().await;
    let srv = Server::start(&hs256_config(1000), &["--cores", "1"]);
    let connected = Instant::now();
    let exp = now_s() + 2;
    let mut ws = tung::connect(&ws_url_with(srv.addr, &hs256(&claims("alice", exp, &["news.*"], &[])))).await;
    subscribe(&mut ws, "news.a").await;

    let warned = match read_within(&mut ws, Duration::from_secs(5)).await {
        Read::Json(v) if v["code"] == "token_expired" => Instant::now(),
        other => panic!("expected token_expired, got {other:?}"),
    };
    let at = warned - connected;
    assert!(at >= Duration::from_millis(900) && at <= Duration::from_millis(3000), "token_expired after {at:?}");
    match read_within(&mut ws, Duration::from_secs(5)).await {
        Read::Close(code, reason) => {
            assert_eq!((code, reason.as_str()), (4001, r#"{"reason":"token_expired"}"#));
        }
        other => panic!("expected close 4001, got {other:?}"),
    }
    let grace = warned.elapsed();
    assert!(grace >= Duration::from_millis(900) && grace <= Duration::from_millis(2500), "closed {grace:?} after");
    srv.wait_gauge(0.0, STEP).await;
    assert_eq!(srv.metric("tether_reaped_total", &["reason=\"token_expired\""]).await, 1.0);
    assert_eq!(srv.metric("tether_closes_total", &["code=\"4001\""]).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_keeps_the_connection_and_deliveries_have_no_gap() {
    let _serial = serial().await;
    let srv = Server::start(&hs256_config(1000), &["--cores", "2"]);
    let ch = "feed.refresh";
    let mut ws = tung::connect(&ws_url_with(srv.addr, &hs256(&claims("alice", now_s() + 2, &["feed.*"], &[])))).await;
    subscribe(&mut ws, ch).await;

    // A steady publisher across the expiry and the refresh: one message every 20 ms for 4 s.
    let addr = srv.addr;
    let publisher = tokio::spawn(async move {
        let mut http = HttpConn::new(addr).await;
        let mut last = 0;
        for n in 1..=200u64 {
            last = http.publish(ch, json!({ "n": n }).to_string().as_bytes()).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        last
    });

    let mut seqs = Vec::new();
    let (mut warnings, mut refreshed) = (0, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    let last = loop {
        assert!(Instant::now() < deadline, "stalled at {:?} of the stream", seqs.last());
        if seqs.len() == 200 {
            break tokio::time::timeout(STEP, publisher).await.expect("publisher done").expect("publisher");
        }
        let v = match read_within(&mut ws, STEP).await {
            Read::Json(v) => v,
            Read::Close(code, reason) => panic!("closed {code} {reason} after seq {:?}", seqs.last()),
        };
        match v["op"].as_str() {
            Some("msg") => seqs.push(v["seq"].as_u64().expect("seq")),
            Some("error") if v["code"] == "token_expired" => {
                warnings += 1;
                let exp = now_s() + 600;
                send(&mut ws, json!({"op":"refresh","token": hs256(&claims("alice", exp, &["feed.*"], &[]))})).await;
                refreshed = Some(exp);
            }
            Some("refreshed") => assert_eq!(v["exp"].as_u64(), refreshed, "{v}"),
            _ => panic!("unexpected {v}"),
        }
    };
    assert_eq!(warnings, 1, "one token_expired, none after the refresh");
    assert!(refreshed.is_some(), "the token expired during the stream");
    assert_eq!(seqs, (1..=last).collect::<Vec<_>>(), "every seq exactly once, in order, across the refresh");
    assert_eq!(last, 200);
    assert_eq!(srv.gauge().await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowing_refresh_ends_each_channel_it_no_longer_allows() {
    let _serial = serial().await;
    let srv = Server::start(&hs256_config(30_000), &["--cores", "2"]);
    let exp = now_s() + 600;
    let mut ws =
        tung::connect(&ws_url_with(srv.addr, &hs256(&claims("alice", exp, &["news.*", "sports.*"], &[])))).await;
    for ch in ["news.a", "sports.b", "sports.c"] {
        subscribe(&mut ws, ch).await;
    }
    send(&mut ws, json!({"op":"refresh","token": hs256(&claims("alice", exp + 1, &["news.*"], &[]))})).await;
    let mut ended = Vec::new();
    loop {
        let v = next_json(&mut ws).await;
        match v["op"].as_str() {
            Some("error") => {
                assert_eq!(v["code"], "forbidden", "{v}");
                ended.push(v["ch"].as_str().expect("ch").to_string());
            }
            Some("refreshed") => break,
            _ => panic!("unexpected {v}"),
        }
    }
    ended.sort();
    assert_eq!(ended, ["sports.b", "sports.c"], "one error per channel no longer allowed");

    // sports.b is no longer delivered; news.a still is.
    assert_eq!(srv.publish("sports.b", "1").await, 1);
    assert_eq!(srv.publish("news.a", "2").await, 1);
    let v = next_json(&mut ws).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str()), (Some("msg"), Some("news.a")), "{v}");
    send(&mut ws, json!({"op":"sub","ch":"sports.b"})).await;
    assert_eq!(next_json(&mut ws).await["code"], "forbidden");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_refresh_closes_4003() {
    let _serial = serial().await;
    let srv = Server::start(&hs256_config(30_000), &["--cores", "1"]);
    let exp = now_s() + 600;
    let good = hs256(&claims("alice", exp, &["news.*"], &[]));
    let bad_signature = tether::auth::mint::Signer::hs256("another-secret-0123456789abcdef-xyz")
        .expect("signer")
        .sign(&claims("alice", exp, &["news.*"], &[]))
        .expect("sign");
    for (refresh, detail) in [
        (bad_signature, "bad signature"),
        (hs256(&claims("mallory", exp, &["news.*"], &[])), "different sub"),
        (hs256(&claims("alice", now_s() - 5, &["news.*"], &[])), "token expired"),
    ] {
        let mut ws = tung::connect(&ws_url_with(srv.addr, &good)).await;
        send(&mut ws, json!({"op":"refresh","token": refresh})).await;
        match read_within(&mut ws, STEP).await {
            Read::Close(code, reason) => {
                assert_eq!(code, 4003, "{detail}");
                let r: Value = serde_json::from_str(&reason).expect("JSON reason");
                assert_eq!(r, json!({"reason":"forbidden","detail":detail}));
            }
            other => panic!("{detail}: expected close 4003, got {other:?}"),
        }
    }
    srv.wait_gauge(0.0, STEP).await;
    assert_eq!(srv.metric("tether_closes_total", &["code=\"4003\""]).await, 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_without_auth_is_a_bad_op_and_the_connection_stays() {
    let _serial = serial().await;
    let srv = Server::start("", &["--cores", "1"]);
    let mut raw = RawWs::connect(srv.addr, "/ws").await;
    raw.send_json(&json!({"op":"refresh","token":"a.b.c"})).await;
    let v = raw.frame_skip_pings(STEP).await.json();
    assert_eq!((v["op"].as_str(), v["code"].as_str()), (Some("error"), Some("bad_op")), "{v}");
    assert_eq!(raw.subscribe("news").await["op"], "subscribed");
}
