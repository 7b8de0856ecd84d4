//! End-to-end client tests against a fake tether server written with tokio-tungstenite on
//! 127.0.0.1:0, speaking the v1 wire protocol of docs/protocol.md.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{accept_async, WebSocketStream};

use super::*;

pub(super) type Srv = WebSocketStream<TcpStream>;

pub(super) async fn bounded<F: Future>(fut: F) -> F::Output {
    timeout(Duration::from_secs(15), fut).await.expect("test finished in time")
}

pub(super) async fn listen() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}/ws", l.local_addr().expect("addr"));
    (l, url)
}

pub(super) async fn accept(l: &TcpListener) -> Srv {
    let (s, _) = l.accept().await.expect("accept");
    accept_async(s).await.expect("upgrade")
}

pub(super) async fn recv(ws: &mut Srv) -> Value {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => return serde_json::from_str(t.as_str()).expect("json"),
            Some(Ok(_)) => continue,
            other => panic!("server expected a text frame, got {other:?}"),
        }
    }
}

pub(super) async fn send(ws: &mut Srv, text: &str) {
    ws.send(Message::text(text.to_string())).await.expect("server send");
}

pub(super) fn msg(ch: &str, seq: u64) -> String {
    format!(r#"{{"op":"msg","ch":"{ch}","seq":{seq},"data":{{"n":{seq}}}}}"#)
}

/// Closes from the server side and completes the close handshake.
pub(super) async fn close(mut ws: Srv, code: u16, reason: &str) {
    let frame = CloseFrame { code: CloseCode::from(code), reason: reason.into() };
    let _ = ws.close(Some(frame)).await;
    while let Some(Ok(_)) = ws.next().await {}
}

/// Reads until the client closes.
pub(super) async fn drain(mut ws: Srv) {
    while let Some(Ok(_)) = ws.next().await {}
}

pub(super) fn fast(url: &str) -> ClientConfig {
    let mut cfg = ClientConfig::new(url);
    cfg.backoff = BackoffConfig {
        base: Duration::from_millis(20),
        cap: Duration::from_millis(100),
        stable_after: Duration::from_secs(10),
    };
    cfg.seed = Some(7);
    cfg.connect_timeout = Duration::from_secs(2);
    cfg.idle_timeout = None;
    cfg
}

pub(super) async fn next(c: &mut Client) -> Event {
    timeout(Duration::from_secs(5), c.next_event()).await.expect("event in time").expect("event")
}

/// The next event that is not `Connected`/`Disconnected`.
pub(super) async fn next_data(c: &mut Client) -> Event {
    loop {
        match next(c).await {
            Event::Connected { .. } | Event::Disconnected { .. } => continue,
            ev => return ev,
        }
    }
}

pub(super) fn expect_msg(ev: Event, want_ch: &str, want_seq: u64) -> String {
    match ev {
        Event::Message { ch, seq, raw, .. } if ch == want_ch && seq == want_seq => raw,
        other => panic!("expected msg {want_ch}#{want_seq}, got {other:?}"),
    }
}

pub(super) fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tether-e2e-{name}-{}-{}", std::process::id(), rand::random::<u32>()));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

#[tokio::test]
async fn resubscribes_from_committed_seq_after_1012() {
    bounded(async {
        let (l, url) = listen().await;
        let (go, gone) = oneshot::channel::<()>();
        let verbatim = r#"{"op":"msg", "ch":"news", "seq":3, "data": {"n": 3}}"#;
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"news"}));
            send(&mut ws, r#"{"op":"subscribed","ch":"news","seq":0,"epoch":"e1"}"#).await;
            send(&mut ws, &msg("news", 1)).await;
            send(&mut ws, &msg("news", 2)).await;
            send(&mut ws, verbatim).await;
            gone.await.expect("go");
            close(ws, 1012, r#"{"reason":"restart","retry_after_ms":30}"#).await;

            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"news","from":2,"epoch":"e1"}));
            let sub = r#"{"op":"subscribed","ch":"news","seq":3,"epoch":"e1","recovered":true}"#;
            send(&mut ws, sub).await;
            for seq in [3, 3, 2, 4] {
                send(&mut ws, &msg("news", seq)).await;
            }
            drain(ws).await;
        });

        let mut c = Client::connect(fast(&url)).expect("client");
        c.subscribe("news", None).expect("subscribe");
        assert!(matches!(next(&mut c).await, Event::Connected { .. }));
        match next(&mut c).await {
            Event::Subscribed { ch, seq: 0, epoch, recovered: None } => {
                assert_eq!((ch.as_str(), epoch.as_str()), ("news", "e1"));
            }
            other => panic!("{other:?}"),
        }
        for seq in 1..=2 {
            expect_msg(next(&mut c).await, "news", seq);
            c.commit("news", seq).await.expect("commit");
        }
        match next(&mut c).await {
            Event::Message { seq: 3, raw, data, .. } => {
                assert_eq!(raw, verbatim, "the frame text is kept verbatim");
                assert_eq!(data.get(), r#"{"n": 3}"#);
            }
            other => panic!("{other:?}"),
        }
        go.send(()).expect("go");
        match next(&mut c).await {
            Event::Disconnected { code: Some(1012), retry_in, .. } => {
                assert!(retry_in >= Duration::from_millis(30), "hint is the floor: {retry_in:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(next(&mut c).await, Event::Connected { .. }));
        assert!(matches!(next(&mut c).await, Event::Subscribed { seq: 3, recovered: Some(true), .. }));
        expect_msg(next(&mut c).await, "news", 3);
        expect_msg(next(&mut c).await, "news", 4);
        c.commit("news", 4).await.expect("commit");
        assert_eq!(c.stats().duplicates_dropped, 2);
        assert_eq!(c.stats().connects, 2);
        assert_eq!(c.position("news"), Some(Position { seq: 4, epoch: Some("e1".into()) }));
        c.close().await;
        server.await.expect("server");
    })
    .await;
}

#[tokio::test]
async fn outbox_is_resent_in_order_with_the_same_ids_after_a_cut() {
    bounded(async {
        let (l, url) = listen().await;
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            let first: Vec<Value> = vec![recv(&mut ws).await, recv(&mut ws).await, recv(&mut ws).await];
            assert_eq!(first[0], json!({"op":"pub","ch":"c","id":"p1","data":{"k":1}}));
            assert_eq!(first[1]["data"], json!({"k":2}));
            assert_eq!(first[2]["id"], "p3");
            let generated = first[1]["id"].as_str().expect("id").to_string();
            assert_eq!(generated.len(), 32);
            send(&mut ws, r#"{"op":"ack","id":"p1","ch":"c","seq":1}"#).await;
            drop(ws); // cut: no close frame

            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, first[1], "unacked publishes resent, same id");
            assert_eq!(recv(&mut ws).await, first[2]);
            let ack = format!(r#"{{"op":"ack","id":"{generated}","ch":"c","seq":2}}"#);
            send(&mut ws, &ack).await;
            send(&mut ws, &ack).await; // a duplicate ack is ignored
            send(&mut ws, r#"{"op":"error","code":"too_large","reason":"64 KiB","id":"p3"}"#).await;
            drain(ws).await;
            generated
        });

        let c = Client::connect(fast(&url)).expect("client");
        let p = c.publisher();
        let h1 = p.send("c", Some("p1".into()), &json!({"k":1})).await.expect("send 1");
        let h2 = p.send("c", None, &json!({"k":2})).await.expect("send 2");
        let h3 = p.send("c", Some("p3".into()), &json!({"k":3})).await.expect("send 3");
        let a1 = h1.await.expect("ack 1");
        assert_eq!((a1.id.as_str(), a1.seq), ("p1", 1));
        let a2 = h2.await.expect("ack 2");
        assert_eq!(a2.seq, 2);
        assert_eq!(a2.raw, format!(r#"{{"op":"ack","id":"{}","ch":"c","seq":2}}"#, a2.id));
        let e3 = h3.await.expect_err("refused");
        assert_eq!(e3, ClientError::Refused { code: "too_large".into(), reason: "64 KiB".into(), retry_after: None });
        c.close().await;
        assert_eq!(server.await.expect("server"), a2.id);
    })
    .await;
}

#[tokio::test]
async fn stop_code_ends_the_client_and_fails_publishes() {
    bounded(async {
        let (l, url) = listen().await;
        let (got_pub, pub_seen) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await["op"], "sub");
            send(&mut ws, r#"{"op":"subscribed","ch":"c","seq":0,"epoch":"e"}"#).await;
            send(&mut ws, &msg("c", 1)).await;
            assert_eq!(recv(&mut ws).await["op"], "pub");
            got_pub.send(()).expect("signal");
            close(ws, 1008, "not allowed").await;
            // No reconnect after a stop code.
            assert!(timeout(Duration::from_millis(300), l.accept()).await.is_err());
        });

        let mut c = Client::connect(fast(&url)).expect("client");
        c.subscribe("c", None).expect("subscribe");
        let h = c.publisher().send("c", None, &json!(1)).await.expect("send");
        pub_seen.await.expect("pub seen");
        assert!(matches!(next_data(&mut c).await, Event::Subscribed { .. }));
        expect_msg(next_data(&mut c).await, "c", 1);
        let closed = ClientError::Closed { code: 1008, reason: "not allowed".into() };
        let err = loop {
            match timeout(Duration::from_secs(5), c.next_event()).await.expect("in time") {
                Ok(Event::Connected { .. }) => continue,
                Ok(other) => panic!("{other:?}"),
                Err(e) => break e,
            }
        };
        assert_eq!(err, closed);
        assert_eq!(h.await.expect_err("failed"), closed);
        assert_eq!(c.publish("c", &json!(2)).await.expect_err("stopped"), closed);
        assert_eq!(c.subscribe("d", None).expect_err("stopped"), closed);
        server.await.expect("server");
    })
    .await;
}

#[tokio::test]
async fn reset_is_surfaced_and_becomes_the_resume_point() {
    bounded(async {
        let (l, url) = listen().await;
        let (go, gone) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"c","from":50,"epoch":"old"}));
            let reset = r#"{"op":"reset","ch":"c","seq":10,"epoch":"new","reason":"epoch","oldest":1}"#;
            send(&mut ws, reset).await;
            send(&mut ws, &msg("c", 11)).await;
            gone.await.expect("go");
            close(ws, 1013, "queue_max_bytes").await;
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"c","from":11,"epoch":"new"}));
            drain(ws).await;
        });

        let mut c = Client::connect(fast(&url)).expect("client");
        c.subscribe_at("c", Position { seq: 50, epoch: Some("old".into()) }).expect("sub");
        match next_data(&mut c).await {
            Event::Reset { ch, seq: 10, epoch, reason, oldest: 1 } => {
                assert_eq!((ch.as_str(), epoch.as_str(), reason.as_str()), ("c", "new", "epoch"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.position("c"), Some(Position { seq: 10, epoch: Some("new".into()) }));
        expect_msg(next_data(&mut c).await, "c", 11);
        c.commit("c", 11).await.expect("commit");
        go.send(()).expect("go");
        match next(&mut c).await {
            Event::Disconnected { code: Some(1013), reason, .. } => assert_eq!(reason, "queue_max_bytes"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(next(&mut c).await, Event::Connected { .. }));
        c.close().await;
        server.await.expect("server");
    })
    .await;
}

#[tokio::test]
async fn offset_file_carries_positions_across_clients() {
    bounded(async {
        let (l, url) = listen().await;
        let dir = temp_dir("offsets");
        let file = dir.join("offsets.json");
        let (resumed, seen) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"c"}));
            send(&mut ws, r#"{"op":"subscribed","ch":"c","seq":5,"epoch":"e1"}"#).await;
            send(&mut ws, &msg("c", 6)).await;
            send(&mut ws, &msg("c", 7)).await;
            drain(ws).await;
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"c","from":7,"epoch":"e1"}));
            resumed.send(()).expect("signal");
            drain(ws).await;
        });

        let mut cfg = fast(&url);
        cfg.offset_file = Some(file.clone());
        let mut c = Client::connect(cfg.clone()).expect("client");
        c.subscribe("c", None).expect("sub");
        assert!(matches!(next_data(&mut c).await, Event::Subscribed { seq: 5, .. }));
        for seq in [6, 7] {
            expect_msg(next_data(&mut c).await, "c", seq);
            c.commit("c", seq).await.expect("commit");
        }
        c.close().await;
        let saved = std::fs::read_to_string(&file).expect("offset file");
        assert_eq!(saved, r#"{"c":{"seq":7,"epoch":"e1"}}"#);

        let c = Client::connect(cfg).expect("client 2");
        c.subscribe("c", Some(0)).expect("sub"); // the offset file wins over `from`
        seen.await.expect("resumed from the file");
        c.close().await;
        server.await.expect("server");
        std::fs::remove_dir_all(dir).ok();
    })
    .await;
}

#[tokio::test]
async fn silent_server_trips_the_idle_timeout() {
    bounded(async {
        let (l, url) = listen().await;
        let server = tokio::spawn(async move {
            let mut first = accept(&l).await;
            assert_eq!(recv(&mut first).await["op"], "sub");
            let mut second = accept(&l).await; // the client gave up on the silent one
            assert_eq!(recv(&mut second).await["op"], "sub");
            drain(second).await;
        });
        let mut cfg = fast(&url);
        cfg.idle_timeout = Some(Duration::from_millis(200));
        let mut c = Client::connect(cfg).expect("client");
        c.subscribe("c", None).expect("sub");
        assert!(matches!(next(&mut c).await, Event::Connected { .. }));
        assert!(matches!(next(&mut c).await, Event::Disconnected { code: None, .. }));
        assert!(matches!(next(&mut c).await, Event::Connected { .. }));
        c.close().await;
        server.await.expect("server");
    })
    .await;
}

#[tokio::test]
async fn each_reconnect_moves_to_the_next_url_and_resumes_there() {
    bounded(async {
        let (a, url_a) = listen().await;
        let (b, url_b) = listen().await;
        let (cut_a, a_cut) = oneshot::channel::<()>();
        let (cut_b, b_cut) = oneshot::channel::<()>();
        let node_a = tokio::spawn(async move {
            let mut ws = accept(&a).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"c"}));
            let publish = recv(&mut ws).await;
            assert_eq!(publish, json!({"op":"pub","ch":"c","id":"p1","data":{"k":1}}));
            send(&mut ws, r#"{"op":"subscribed","ch":"c","seq":0,"epoch":"e1"}"#).await;
            send(&mut ws, &msg("c", 1)).await;
            send(&mut ws, &msg("c", 2)).await;
            a_cut.await.expect("cut a");
            drop(ws); // node a dies: no close frame

            // After b fails too, the ring comes back to a.
            let mut ws = accept(&a).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"c","from":3,"epoch":"e1"}));
            drain(ws).await;
            publish
        });
        let node_b = tokio::spawn(async move {
            let mut ws = accept(&b).await;
            let sub = recv(&mut ws).await;
            assert_eq!(sub, json!({"op":"sub","ch":"c","from":2,"epoch":"e1"}), "resumes on the other node");
            let publish = recv(&mut ws).await;
            send(&mut ws, r#"{"op":"subscribed","ch":"c","seq":3,"epoch":"e1","recovered":true}"#).await;
            send(&mut ws, &msg("c", 3)).await;
            send(&mut ws, r#"{"op":"ack","id":"p1","ch":"c","seq":4}"#).await;
            b_cut.await.expect("cut b");
            drop(ws);
            publish
        });

        let mut c = Client::connect(fast(&format!("{url_a}, {url_b}"))).expect("client");
        c.subscribe("c", None).expect("subscribe");
        let acked = c.publisher().send("c", Some("p1".into()), &json!({"k":1})).await.expect("send");
        assert!(matches!(next(&mut c).await, Event::Connected { .. }));
        assert!(matches!(next(&mut c).await, Event::Subscribed { seq: 0, recovered: None, .. }));
        for seq in [1, 2] {
            expect_msg(next(&mut c).await, "c", seq);
            c.commit("c", seq).await.expect("commit");
        }
        cut_a.send(()).expect("cut a");
        match next(&mut c).await {
            Event::Disconnected { code: None, retry_in, .. } => {
                assert!(retry_in <= Duration::from_millis(20), "the next URL is tried promptly: {retry_in:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(next(&mut c).await, Event::Connected { .. }));
        assert!(matches!(next(&mut c).await, Event::Subscribed { seq: 3, recovered: Some(true), .. }));
        expect_msg(next(&mut c).await, "c", 3);
        c.commit("c", 3).await.expect("commit");
        let ack = acked.await.expect("acked by the other node");
        assert_eq!((ack.id.as_str(), ack.seq), ("p1", 4));
        cut_b.send(()).expect("cut b");
        assert!(matches!(next(&mut c).await, Event::Disconnected { code: None, .. }));
        assert!(matches!(next(&mut c).await, Event::Connected { .. }));
        assert_eq!(c.stats().connects, 3);
        c.close().await;
        let (on_a, on_b) = (node_a.await.expect("node a"), node_b.await.expect("node b"));
        assert_eq!(on_a, on_b, "the outbox is resent with the same id and data");
    })
    .await;
}

#[tokio::test]
async fn empty_url_list_is_refused_naming_the_field() {
    let cfg = ClientConfig::with_urls(Vec::<String>::new());
    match Client::connect(cfg) {
        Err(ClientError::InvalidUrl(e)) => assert!(e.starts_with("ClientConfig::urls is empty"), "{e}"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("an empty list was accepted"),
    }
    let cfg = ClientConfig::with_urls(["ws://127.0.0.1:1/ws", "wss://127.0.0.1:2/ws"]);
    match Client::connect(cfg) {
        Err(ClientError::InvalidUrl(e)) => {
            assert!(e.starts_with("ClientConfig::urls entry 2 of 2: wss://127.0.0.1:2/ws: wss:// needs TLS"), "{e}");
        }
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("wss:// was accepted"),
    }
    assert_eq!(ClientConfig::new("ws://a:1/ws,ws://b:2/ws").urls, ["ws://a:1/ws", "ws://b:2/ws"]);
    assert_eq!(ClientConfig::new("ws://a:1/ws").urls, ["ws://a:1/ws"]);
}

#[tokio::test]
async fn unknown_outcome_and_unavailable_are_retried_with_the_same_id() {
    bounded(async {
        let (l, url) = listen().await;
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            let first = recv(&mut ws).await;
            assert_eq!(first, json!({"op":"pub","ch":"c","id":"p1","data":{"k":1}}));
            let unknown = r#"{"op":"error","code":"unknown_outcome","reason":"no answer in time","id":"p1","ch":"c","retry_after_ms":30}"#;
            send(&mut ws, unknown).await;
            let t0 = std::time::Instant::now();
            assert_eq!(recv(&mut ws).await, first, "resent as it was: same id");
            assert!(t0.elapsed() >= Duration::from_millis(25), "resent before retry_after_ms: {:?}", t0.elapsed());
            let unavailable = r#"{"op":"error","code":"unavailable","reason":"down","id":"p1","ch":"c","retry_after_ms":30}"#;
            send(&mut ws, unavailable).await;
            assert_eq!(recv(&mut ws).await, first, "resent again, same id");
            send(&mut ws, r#"{"op":"ack","id":"p1","ch":"c","seq":7}"#).await;
            drain(ws).await;
        });
        let c = Client::connect(fast(&url)).expect("client");
        let ack = c.publisher().send("c", Some("p1".into()), &json!({"k":1})).await.expect("send").await;
        assert_eq!(ack.expect("acked after the retries").seq, 7);
        c.close().await;
        server.await.expect("server");
    })
    .await;
}
