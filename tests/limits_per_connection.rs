//! Per-connection abuse limits and the process-wide channel cap against a real server
//! (`[limits.per_connection]`, `limits.max_channels`; docs/security.md, "Per-connection
//! limits"): the 1,025th subscription is refused, a publisher past its rate gets `limit` errors
//! and then 1008 while everyone else carries on, a ping flood is closed while a normal client
//! is not, and `max_channels` refuses new channels only, until channels go (with the memory
//! broker, and with the Redis broker, where it bounds the channels subscribed on the node).
//! Every refusal is checked against `tether_limit_refusals_total{limit}`.
//!
//! Clients: tokio-tungstenite (independent of tether's code), tether's own client, and raw
//! RFC 6455 frames for the flood.

mod common;

use std::time::{Duration, Instant};

use common::tung::{connect, next_json, read, send, Read};
use common::*;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tether::client::{Client, ClientConfig};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

fn refusals(m: &Metrics, limit: &str) -> f64 {
    m.sum("tether_limit_refusals_total", &[&format!("limit=\"{limit}\"")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_1025th_subscription_gets_error_limit_and_the_connection_stays() {
    let _serial = serial().await;
    let srv = Server::start("", &["--cores", "2"]);
    let mut w = connect(&srv.ws_url()).await;
    for i in 0..1025 {
        w.feed(Message::text(json!({"op": "sub", "ch": format!("many.{i}")}).to_string())).await.unwrap();
    }
    w.flush().await.unwrap();
    let (mut subscribed, mut refused) = (std::collections::BTreeSet::new(), Vec::new());
    while subscribed.len() + refused.len() < 1025 {
        let v = next_json(&mut w).await;
        match v["op"].as_str() {
            Some("subscribed") => assert!(subscribed.insert(v["ch"].as_str().unwrap().to_string()), "twice: {v}"),
            Some("error") => refused.push(v),
            _ => panic!("unexpected reply {v}"),
        }
    }
    assert_eq!(subscribed.len(), 1024, "the default max_subscriptions");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0]["code"], "limit", "{}", refused[0]);
    assert_eq!(refused[0]["ch"], "many.1024", "the refusal names the channel: {}", refused[0]);
    assert!(refused[0]["reason"].as_str().unwrap().contains("max_subscriptions"), "{}", refused[0]);
    assert!(refused[0].get("retry_after_ms").is_none(), "waiting does not help: {}", refused[0]);

    // The connection stays: one unsub makes room for exactly one more.
    send(&mut w, json!({"op": "unsub", "ch": "many.0"})).await;
    send(&mut w, json!({"op": "sub", "ch": "many.1024"})).await;
    let v = next_json(&mut w).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str()), (Some("unsubscribed"), Some("many.0")), "{v}");
    let v = next_json(&mut w).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str()), (Some("subscribed"), Some("many.1024")), "{v}");
    send(&mut w, json!({"op": "sub", "ch": "many.1025"})).await;
    let v = next_json(&mut w).await;
    assert_eq!((v["code"].as_str(), v["ch"].as_str()), (Some("limit"), Some("many.1025")), "{v}");
    // Still subscribed to what it holds.
    srv.publish("many.7", r#"{"still":"here"}"#).await;
    let v = next_json(&mut w).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str(), v["seq"].as_u64()), (Some("msg"), Some("many.7"), Some(1)));
    let m = srv.metrics().await;
    assert_eq!(refusals(&m, "max_subscriptions"), 2.0);
    assert_eq!(m.sum("tether_closes_total", &["code=\"1008\""]), 0.0);
}

/// Publishes to `ch` every 250 ms (4 per second, under a `publish_rate` of 5) through
/// tether's client until `stop`; returns every outcome.
async fn steady_publisher(
    url: String,
    ch: &'static str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<Result<u64, String>> {
    let mut cfg = ClientConfig::new(url);
    cfg.seed = Some(11);
    let client = Client::connect(cfg).expect("tether client");
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    let mut i = 0;
    while !*stop.borrow() {
        tick.tick().await;
        let r = tokio::time::timeout(STEP, client.publish(ch, &json!({"from": "steady", "i": i})))
            .await
            .expect("steady publish answered in time");
        out.push(r.map(|a| a.seq).map_err(|e| e.to_string()));
        i += 1;
    }
    client.close().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_over_its_rate_gets_limit_then_1008_and_nobody_else_is_affected() {
    let _serial = serial().await;
    let srv = Server::start("[limits.per_connection]\npublish_rate = 5\n", &["--cores", "2"]);
    let url = srv.ws_url();
    const CH: &str = "rated.feed";

    let mut sub = connect(&url).await;
    send(&mut sub, json!({"op": "sub", "ch": CH})).await;
    assert_eq!(next_json(&mut sub).await["op"], "subscribed");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let steady = tokio::spawn(steady_publisher(url.clone(), CH, stop_rx));

    let mut greedy = connect(&url).await;
    let mut acked = Vec::new();
    let mut errors = 0u32;
    // The burst (5) passes.
    for i in 0..5 {
        send(&mut greedy, json!({"op": "pub", "ch": CH, "id": format!("g{i}"), "data": i})).await;
        let v = next_json(&mut greedy).await;
        assert_eq!((v["op"].as_str(), v["id"].as_str()), (Some("ack"), Some(format!("g{i}").as_str())), "{v}");
        acked.push(v["seq"].as_u64().unwrap());
    }
    // The 6th is refused, with when to retry: one token at 5 per second is at most 200 ms away.
    send(&mut greedy, json!({"op": "pub", "ch": CH, "id": "g5", "data": 5})).await;
    let v = next_json(&mut greedy).await;
    errors += 1;
    assert_eq!((v["op"].as_str(), v["code"].as_str(), v["id"].as_str()), (Some("error"), Some("limit"), Some("g5")));
    let retry = v["retry_after_ms"].as_u64().unwrap_or_else(|| panic!("no retry_after_ms in {v}"));
    assert!((1..=200).contains(&retry), "retry_after_ms {retry}");
    // Honouring the hint is enough.
    tokio::time::sleep(Duration::from_millis(retry)).await;
    send(&mut greedy, json!({"op": "pub", "ch": CH, "id": "g5", "data": 5})).await;
    let v = next_json(&mut greedy).await;
    assert_eq!((v["op"].as_str(), v["id"].as_str()), (Some("ack"), Some("g5")), "after retry_after_ms: {v}");
    acked.push(v["seq"].as_u64().unwrap());

    // A flood far past the rate: limit errors, then 1008 naming the limit.
    for i in 0..300 {
        greedy
            .feed(Message::text(json!({"op": "pub", "ch": CH, "id": format!("f{i}"), "data": i}).to_string()))
            .await
            .unwrap();
    }
    greedy.flush().await.unwrap();
    let mut flood_errors = 0u32;
    let (code, reason) = loop {
        match read(&mut greedy).await {
            Read::Json(v) if v["op"] == "ack" => acked.push(v["seq"].as_u64().unwrap()),
            Read::Json(v) => {
                assert_eq!(v["code"], "limit", "{v}");
                assert!(v["id"].as_str().is_some_and(|id| id.starts_with('f')), "{v}");
                assert!(v["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{v}");
                flood_errors += 1;
            }
            Read::Close(code, reason) => break (code, reason),
        }
    };
    errors += flood_errors;
    assert_eq!(code, u16::from(CloseCode::Policy));
    let reason: Value = serde_json::from_str(&reason).unwrap_or_else(|e| panic!("{reason}: {e}"));
    assert_eq!(reason, json!({"reason": "limit", "limit": "publish_rate"}));
    // The 1008 rule: more than 10 × 5 refusals within one second (the window may have opened
    // at g5's refusal, which then counts too).
    assert!((50..=51).contains(&flood_errors), "{flood_errors} refusals before the close");
    let closed_at = Instant::now();

    // The steady publisher goes on after the close, and is never refused.
    srv.wait_metric("tether_reaped_total", &["reason=\"limit\""], STEP, |v| v == 1.0).await;
    tokio::time::sleep_until((closed_at + Duration::from_millis(1200)).into()).await;
    stop_tx.send(true).unwrap();
    let steady = steady.await.expect("steady task");
    assert!(steady.len() >= 4, "steady published {} times", steady.len());
    let steady_seqs: Vec<u64> =
        steady.iter().map(|r| r.clone().unwrap_or_else(|e| panic!("steady refused: {e}"))).collect();

    // The subscriber got every stored message, in order, without a gap, also after the close.
    let head = acked.iter().chain(&steady_seqs).copied().max().unwrap();
    let mut seen = Vec::new();
    while seen.last() != Some(&head) {
        let v = next_json(&mut sub).await;
        assert_eq!(v["op"], "msg", "{v}");
        seen.push(v["seq"].as_u64().unwrap());
    }
    assert_eq!(seen, (1..=head).collect::<Vec<_>>());
    assert!(steady_seqs.iter().any(|s| *s > *acked.iter().max().unwrap()), "steady publishes after the close");

    let m = srv.metrics().await;
    assert_eq!(refusals(&m, "publish_rate"), errors as f64, "every refusal answered is counted");
    assert_eq!(refusals(&m, "publish_bytes_rate"), 0.0);
    assert_eq!(m.sum("tether_closes_total", &["code=\"1008\""]), 1.0);
    assert_eq!(srv.gauge().await, 1.0, "the subscriber is still connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_channels_refuses_new_channels_only_until_channels_are_forgotten() {
    let _serial = serial().await;
    let srv = Server::start("[limits]\nmax_channels = 3\n[dedup]\nwindow_ms = 1000\n", &["--cores", "2"]);
    let mut observed = 0u32;
    srv.publish("cap.1", "1").await;
    srv.publish("cap.2", "1").await;
    let mut w = connect(&srv.ws_url()).await;
    send(&mut w, json!({"op": "sub", "ch": "cap.3"})).await;
    assert_eq!(next_json(&mut w).await["op"], "subscribed");
    assert_eq!(srv.metric("tether_channels", &[]).await, 3.0);

    // A 4th channel: refused for a sub, a WS pub and an HTTP publish.
    send(&mut w, json!({"op": "sub", "ch": "cap.4"})).await;
    let v = next_json(&mut w).await;
    assert_eq!((v["code"].as_str(), v["ch"].as_str()), (Some("limit"), Some("cap.4")), "{v}");
    assert_eq!(v["retry_after_ms"], 5000, "{v}");
    assert!(v["reason"].as_str().unwrap().contains("max_channels"), "{v}");
    send(&mut w, json!({"op": "pub", "ch": "cap.5", "id": "x", "data": 1})).await;
    let v = next_json(&mut w).await;
    assert_eq!(
        (v["code"].as_str(), v["id"].as_str(), v["retry_after_ms"].as_u64()),
        (Some("limit"), Some("x"), Some(5000))
    );
    let (status, head, body) = http_request(srv.addr, "POST", "/publish/cap.6", &[], b"1").await;
    assert_eq!(status, 503, "{head}");
    assert_eq!(header(&head, "retry-after"), Some("5"));
    assert!(String::from_utf8_lossy(&body).contains("max_channels"), "{}", String::from_utf8_lossy(&body));
    observed += 3;

    // Existing channels are untouched.
    assert_eq!(srv.publish("cap.1", "2").await, 2);
    send(&mut w, json!({"op": "pub", "ch": "cap.1", "id": "y", "data": 3})).await;
    let v = next_json(&mut w).await;
    assert_eq!((v["op"].as_str(), v["seq"].as_u64()), (Some("ack"), Some(3)), "{v}");
    send(&mut w, json!({"op": "sub", "ch": "cap.2"})).await;
    assert_eq!(next_json(&mut w).await["op"], "subscribed");

    // A never-published channel is forgotten with its last subscriber: its slot is free at
    // once (the unsub and the next sub may reach different home cores, so the sub is retried).
    send(&mut w, json!({"op": "unsub", "ch": "cap.3"})).await;
    let v = next_json(&mut w).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str()), (Some("unsubscribed"), Some("cap.3")), "{v}");
    let end = Instant::now() + STEP;
    loop {
        send(&mut w, json!({"op": "sub", "ch": "cap.4"})).await;
        let v = next_json(&mut w).await;
        if v["op"] == "subscribed" {
            break;
        }
        assert_eq!(v["code"], "limit", "{v}");
        observed += 1;
        assert!(Instant::now() < end, "cap.3's slot never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // cap.1 (published, no subscriber) is forgotten by the sweep once idle past the dedup
    // window: then a new channel fits. Poll as a client honouring no hint would.
    let t0 = Instant::now();
    loop {
        let (status, _, _) = http_request(srv.addr, "POST", "/publish/cap.7", &[], b"1").await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503);
        observed += 1;
        assert!(t0.elapsed() < Duration::from_secs(12), "cap.1 was never swept");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let m = srv.metrics().await;
    assert_eq!(refusals(&m, "max_channels"), observed as f64);
    assert_eq!(m.sum("tether_channels", &[]), 3.0, "cap.2, cap.4, cap.7");
    // The subscriber of cap.2 still receives.
    srv.publish("cap.2", r#""after""#).await;
    let v = next_json(&mut w).await;
    assert_eq!((v["ch"].as_str(), v["data"].as_str()), (Some("cap.2"), Some("after")), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_flood_is_closed_with_1008_while_a_normal_client_is_fine() {
    let _serial = serial().await;
    // Heartbeat pings every 100 ms: a client answers 10 per second, five times the control
    // frame rate, so this fails if the pongs to our own pings were counted.
    let cfg = "[heartbeat]\nping_interval_ms = 100\npong_timeout_ms = 2000\n\
               [limits.per_connection]\ncontrol_frames_rate = 2\n";
    let srv = Server::start(cfg, &["--cores", "2"]);

    let url = srv.ws_url();
    let normal = tokio::spawn(async move {
        let mut w = connect(&url).await;
        send(&mut w, json!({"op": "sub", "ch": "calm"})).await;
        let (mut pongs, mut server_pings) = (Vec::new(), 0);
        let mut next_ping = tokio::time::Instant::now();
        let end = tokio::time::Instant::now() + Duration::from_millis(2500);
        let mut i = 0u8;
        while tokio::time::Instant::now() < end {
            if tokio::time::Instant::now() >= next_ping {
                // One ping a second: half the rate.
                w.send(Message::Ping(vec![i].into())).await.unwrap();
                i += 1;
                next_ping += Duration::from_secs(1);
            }
            let wait = next_ping.min(end);
            match tokio::time::timeout_at(wait, w.next()).await {
                Err(_) => {}
                Ok(Some(Ok(Message::Pong(p)))) => pongs.push(p.to_vec()),
                Ok(Some(Ok(Message::Ping(_)))) => server_pings += 1,
                Ok(Some(Ok(Message::Text(_)))) => {}
                Ok(other) => panic!("normal client: {other:?}"),
            }
        }
        (w, pongs, server_pings, i)
    });

    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut flood = RawWs::connect(srv.addr, "/ws").await;
    let mut wire = Vec::new();
    for _ in 0..100 {
        wire.extend_from_slice(&tether::ws::codec::encode_client_frame(OP_PING, true, b"flood", [1, 2, 3, 4]));
    }
    tokio::io::AsyncWriteExt::write_all(&mut flood.s, &wire).await.unwrap();
    let mut pongs = 0;
    let close = loop {
        let f = flood.frame(STEP).await;
        match f.opcode {
            OP_PONG => pongs += 1,
            OP_CLOSE => break f,
            _ => {}
        }
    };
    assert!((2..=4).contains(&pongs), "{pongs} pongs: the burst of 2 (and what refills meanwhile)");
    assert_eq!(close.close_code(), 1008);
    let reason: Value = serde_json::from_slice(&close.payload[2..]).expect("JSON close reason");
    assert_eq!(reason, json!({"reason": "limit", "limit": "control_frames_rate"}));

    let (mut w, pongs, server_pings, sent) = normal.await.expect("normal client");
    assert_eq!(pongs, (0..sent).map(|i| vec![i]).collect::<Vec<_>>(), "every ping of the normal client answered");
    assert!(server_pings >= 10, "{server_pings} heartbeat pings answered in 2.5 s");
    srv.publish("calm", r#""still open""#).await;
    assert_eq!(next_json(&mut w).await["data"], "still open");
    let m = srv.metrics().await;
    assert_eq!(refusals(&m, "control_frames"), 21.0, "the flooder's 21 (past 10 × 2), none of the normal client's");
    assert_eq!(m.sum("tether_closes_total", &["code=\"1008\""]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_max_channels_bounds_the_channels_subscribed_here_and_never_a_publish() {
    let _serial = serial().await;
    let redis = common::redis::RedisProc::start();
    let srv =
        Server::start(&common::redis::redis_config(&redis.url(), "[limits]\nmax_channels = 2\n"), &["--cores", "2"]);
    wait_ready(srv.addr, STEP).await;
    let mut w = connect(&srv.ws_url()).await;
    for ch in ["r.1", "r.2"] {
        send(&mut w, json!({"op": "sub", "ch": ch})).await;
        assert_eq!(next_json(&mut w).await["op"], "subscribed");
    }
    send(&mut w, json!({"op": "sub", "ch": "r.3"})).await;
    let v = next_json(&mut w).await;
    assert_eq!(
        (v["code"].as_str(), v["ch"].as_str(), v["retry_after_ms"].as_u64()),
        (Some("limit"), Some("r.3"), Some(5000))
    );
    // Channels live in Redis: a publish to a channel nobody here subscribes to holds nothing
    // in this process, so it is never refused.
    send(&mut w, json!({"op": "pub", "ch": "r.9", "id": "p", "data": 1})).await;
    let v = next_json(&mut w).await;
    assert_eq!((v["op"].as_str(), v["seq"].as_u64()), (Some("ack"), Some(1)), "{v}");
    assert_eq!(srv.publish("r.10", "1").await, 1);
    assert_eq!(srv.metric("tether_channels", &[]).await, 2.0);
    // The last subscriber of r.1 leaving frees its slot (the unsub and the sub travel to the
    // broker thread in order).
    send(&mut w, json!({"op": "unsub", "ch": "r.1"})).await;
    send(&mut w, json!({"op": "sub", "ch": "r.3"})).await;
    let v = next_json(&mut w).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str()), (Some("unsubscribed"), Some("r.1")), "{v}");
    let v = next_json(&mut w).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str()), (Some("subscribed"), Some("r.3")), "{v}");
    let m = srv.metrics().await;
    assert_eq!(refusals(&m, "max_channels"), 1.0);
    assert_eq!(m.sum("tether_channels", &[]), 2.0);
}
