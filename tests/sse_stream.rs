//! Server-Sent Events on `GET /sse` (docs/protocol.md, "Server-Sent Events") against a real
//! server: a raw socket reader (tests/common/sse.rs) and `curl -N` as subscribers, a
//! tokio-tungstenite WebSocket beside them; resume by `Last-Event-ID` and `from=`; the refusals
//! before a stream (401, 403, 400, 405, 406, 431); slowloris on the request head; a non-reader
//! under `disconnect` and `drop-oldest`; the drain's end of the stream; client bytes; many
//! channels; the transport gauge in /metrics and /status.json.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::sse::{Event, SseReader};
use common::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(10);

/// The `(epoch, seq)` of a message event's id `CH:EPOCH:SEQ` of channel `ch`.
fn position(ev: &Event, ch: &str) -> (String, u64) {
    let id = ev.id.as_deref().unwrap_or_else(|| panic!("no id on {ev:?}"));
    let rest = id.strip_prefix(ch).and_then(|r| r.strip_prefix(':')).unwrap_or_else(|| panic!("id {id} of {ch}"));
    let (epoch, seq) = rest.rsplit_once(':').expect("epoch:seq");
    (epoch.to_owned(), seq.parse().expect("seq"))
}

/// Seqs of the `msg` events of `ch`, in order.
fn seqs(evs: &[Event], ch: &str) -> Vec<u64> {
    evs.iter().filter(|e| e.name == "msg" && e.json()["ch"] == ch).map(|e| position(e, ch).1).collect()
}

#[tokio::test]
async fn sse_and_websocket_subscribers_get_the_same_msg_objects() {
    let srv = Server::start("", &[]);
    let mut sse = SseReader::open(srv.addr, "/sse?ch=a&ch=b", &[]).await;
    assert_eq!(sse.status, 200, "{}", sse.head);
    for (h, v) in [("content-type", "text/event-stream"), ("cache-control", "no-cache"), ("x-accel-buffering", "no")] {
        assert_eq!(header(&sse.head, h), Some(v), "{h} in {}", sse.head);
    }
    assert_eq!(header(&sse.head, "content-length"), None);
    assert_eq!(header(&sse.head, "transfer-encoding"), None);
    let mut ws = tung::connect(&format!("ws://{}/ws", srv.addr)).await;
    tung::send(&mut ws, serde_json::json!({"op":"sub","ch":"a"})).await;
    let sub = tung::next_json(&mut ws).await;
    assert_eq!(sub["op"], "subscribed");
    let epoch = sub["epoch"].as_str().unwrap().to_owned();
    srv.wait_metric("tether_connections_by_transport", &["transport=\"sse\""], T, |v| v == 1.0).await;
    srv.wait_metric("tether_connections_by_transport", &["transport=\"websocket\""], T, |v| v == 1.0).await;
    assert_eq!(srv.gauge().await, 2.0);
    // Both SSE subscriptions are live once answered.
    let subs = sse.collect("subscribed", 2, T).await;
    let mut chs: Vec<String> = subs.iter().map(|e| e.json()["ch"].as_str().unwrap().to_owned()).collect();
    chs.sort();
    assert_eq!(chs, ["a", "b"], "one answer per channel (in any order: their homes differ)");
    assert!(subs.iter().all(|e| e.id.is_none()));
    let bodies = ["{\"i\":1}", "\"two\"", "{\n  \"pretty\": [1,\n 2]\n}", "null"];
    for body in bodies {
        srv.publish("a", body).await;
        srv.publish("b", body).await;
    }
    let evs = sse.collect("msg", 8, T).await;
    assert_eq!(seqs(&evs, "a"), [1, 2, 3, 4]);
    assert_eq!(seqs(&evs, "b"), [1, 2, 3, 4]);
    for ev in evs.iter().filter(|e| e.json()["ch"] == "a") {
        let (ev_epoch, seq) = position(ev, "a");
        assert_eq!(ev_epoch, epoch, "the id names the channel's epoch");
        let ws_msg: Value = tung::next_json(&mut ws).await;
        assert_eq!(ev.json(), ws_msg, "seq {seq}: the same msg object on both transports");
    }
    let status = api::get_ok(srv.addr, "/status.json").await;
    assert_eq!(status["connections_by_transport"], serde_json::json!({"websocket": 1, "sse": 1}), "{status}");
    drop(sse);
    srv.wait_metric("tether_connections_by_transport", &["transport=\"sse\""], T, |v| v == 0.0).await;
}

#[tokio::test]
async fn curl_is_a_subscriber() {
    let srv = Server::start("", &[]);
    let url = format!("http://{}/sse?ch=news", srv.addr);
    let mut curl = Command::new("curl")
        .args(["-N", "-s", "--max-time", "20", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("curl is installed");
    let pid = curl.id() as i32;
    let stdout = curl.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut ids = Vec::new();
    let end = Instant::now() + T;
    let mut published = 0;
    while ids.len() < 3 {
        // Publish until curl's subscription is live and three messages came through.
        if published < 50 {
            srv.publish("news", "{\"x\":1}").await;
            published += 1;
        }
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            if let Some(id) = line.strip_prefix("id: ") {
                ids.push(id.to_owned());
            }
        }
        assert!(Instant::now() < end, "curl printed {ids:?}");
    }
    let seqs: Vec<u64> = ids.iter().map(|id| id.rsplit(':').next().unwrap().parse().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // SAFETY: a child process this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let _ = curl.wait();
}

#[tokio::test]
async fn last_event_id_and_from_resume_each_channel_exactly_once() {
    let srv = Server::start("", &[]);
    let mut first = SseReader::open(srv.addr, "/sse?ch=a&ch=b", &[]).await;
    first.collect("subscribed", 2, T).await;
    srv.publish("a", "1").await;
    srv.publish("b", "1").await;
    let (a_head, b_head) = (srv.publish("a", "2").await, srv.publish("b", "2").await);
    let evs = first.collect("msg", 4, T).await;
    let last_a = evs.iter().rev().find(|e| e.name == "msg" && e.json()["ch"] == "a").unwrap().clone();
    let last_b = evs.iter().rev().find(|e| e.name == "msg" && e.json()["ch"] == "b").unwrap().clone();
    assert_eq!((position(&last_a, "a").1, position(&last_b, "b").1), (a_head, b_head));
    drop(first);
    // Published while away.
    let mut want_a = Vec::new();
    let mut want_b = Vec::new();
    for i in 0..5 {
        want_a.push(srv.publish("a", &i.to_string()).await);
        want_b.push(srv.publish("b", &i.to_string()).await);
    }
    let last_id = last_a.id.clone().unwrap();
    let from = last_b.id.clone().unwrap();
    let mut back =
        SseReader::open(srv.addr, &format!("/sse?ch=a&ch=b&from={from}"), &[("Last-Event-ID", &last_id)]).await;
    assert_eq!(back.status, 200);
    let mut got = back.collect("msg", 10, T).await;
    let subs: Vec<Value> = got.iter().filter(|e| e.name == "subscribed").map(Event::json).collect();
    assert!(subs.iter().all(|s| s["recovered"] == true), "{subs:?}");
    // Live after the replays: once each, no gap at the seam.
    want_a.push(srv.publish("a", "\"live\"").await);
    want_b.push(srv.publish("b", "\"live\"").await);
    got.extend(back.collect("msg", 2, T).await);
    assert_eq!(seqs(&got, "a"), want_a);
    assert_eq!(seqs(&got, "b"), want_b);
    assert!(got.iter().all(|e| e.name == "msg" || e.name == "subscribed"), "no reset on a good resume: {got:?}");
    // A position under another epoch is a typed reset carrying the position it leaves.
    let mut stale = SseReader::open(srv.addr, "/sse?ch=a", &[("Last-Event-ID", "a:0000000000000000:3")]).await;
    let reset = stale.next(T).await.expect("a reset");
    let reset = if reset.name == "subscribed" { stale.next(T).await.expect("a reset") } else { reset };
    assert_eq!(reset.name, "reset");
    let r = reset.json();
    assert_eq!(
        (r["op"].as_str(), r["reason"].as_str(), r["seq"].as_u64()),
        (Some("reset"), Some("epoch"), Some(*want_a.last().unwrap()))
    );
    assert_eq!(
        reset.id.as_deref(),
        Some(format!("a:{}:{}", r["epoch"].as_str().unwrap(), *want_a.last().unwrap()).as_str())
    );
}

/// A request target, its extra headers, the status it gets and a word of its reason.
type Refusal = (String, Vec<(&'static str, String)>, u16, &'static str);

#[tokio::test]
async fn requests_are_refused_before_the_stream_with_a_reason() {
    let cfg = format!(
        "allowed_origins = [\"https://app.example\"]\n[limits]\nmax_header_bytes = 4096\n[limits.per_connection]\nmax_subscriptions = 4\n{}",
        auth::hs256_config(1000)
    );
    let srv = Server::start(&cfg, &["--cores", "1"]);
    let tok = auth::hs256(&auth::claims("u1", auth::now_s() + 600, &["ok.*"], &[]));
    let q = |s: &str| format!("/sse?{s}&token={tok}");
    let cases: Vec<Refusal> = vec![
        ("/sse?ch=ok.a".into(), vec![], 401, "token"),
        ("/sse?ch=ok.a&token=garbage".into(), vec![], 401, "token"),
        (q("ch=ok.a&ch=other"), vec![], 403, "subscribe to other"),
        (q("ch=ok.a"), vec![("Origin", "https://evil.example".into())], 403, "origin"),
        (q("ch=ok.a&ch=ok.a"), vec![], 400, "named twice"),
        (q("ch=ok.1&ch=ok.2&ch=ok.3&ch=ok.4&ch=ok.5"), vec![], 400, "max_subscriptions (4)"),
        (q(""), vec![], 400, "no channel"),
        (q("ch=ok.a"), vec![("Last-Event-ID", "ok.a:e:not-a-number".into())], 400, "Last-Event-ID"),
        (q("ch=ok.a"), vec![("Last-Event-ID", format!("ok.a:e:{}", "9".repeat(3000)))], 400, "longer than 256"),
        (q("ch=ok.a"), vec![("Last-Event-ID", "x".repeat(5000))], 431, ""),
    ];
    for (target, headers, status, reason) in cases {
        let hs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut r = SseReader::open(srv.addr, &target, &hs).await;
        assert_eq!(r.status, status, "{target} {hs:?}: {}", r.head);
        let body = r.body().await;
        assert!(body.contains(reason), "{target}: {body}");
    }
    let ok = SseReader::open(srv.addr, &q("ch=ok.a"), &[("Origin", "https://app.example")]).await;
    assert_eq!(ok.status, 200, "{}", ok.head);
    assert_eq!(
        header(&ok.head, "access-control-allow-origin"),
        Some("https://app.example"),
        "CORS for a page's EventSource"
    );
    let bearer = SseReader::open(srv.addr, "/sse?ch=ok.b", &[("Authorization", &format!("Bearer {tok}"))]).await;
    assert_eq!(bearer.status, 200, "{}", bearer.head);
    // The reader sends Accept: text/event-stream; a client that accepts only JSON gets 406.
    let mut s = connect(srv.addr).await;
    let req = format!("GET {} HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n\r\n", q("ch=ok.a"));
    s.write_all(req.as_bytes()).await.unwrap();
    assert_eq!(read_head(&mut s).await.0, 406);
    let mut post = connect(srv.addr).await;
    post.write_all(b"POST /sse?ch=ok.a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").await.unwrap();
    assert_eq!(read_head(&mut post).await.0, 405);
    srv.wait_gauge(2.0, T).await;
    drop((ok.s, bearer.s));
    srv.wait_gauge(0.0, T).await;
}

#[tokio::test]
async fn slowloris_on_the_request_head_is_cut_at_the_handshake_timeout() {
    let srv = Server::start("[limits]\nhandshake_timeout_ms = 500\n", &["--cores", "1"]);
    let mut s = connect(srv.addr).await;
    s.write_all(b"GET /sse?ch=a HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            // One header line every 100 ms, never the blank line that ends the head.
            let _ = s.write_all(b"X-Slow: 1\r\n").await;
            match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
                Ok(r) => return r,
                Err(_) => continue,
            }
        }
    })
    .await
    .expect("the server closes a slow head");
    assert!(matches!(n, Ok(0) | Err(_)), "closed, not answered: {n:?}");
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(3), "closed after {took:?}");
    assert_eq!(srv.metric("tether_handshake_failures_total", &["reason=\"timeout\""]).await, 1.0);
}

#[tokio::test]
async fn a_non_reader_meets_the_overflow_policy() {
    let cfg = "[limits]\nqueue_max_bytes = 65536\nqueue_max_messages = 64\nmax_publish_bytes = 16384\nmax_message_bytes = 16384\n\
               [[channels]]\npattern = \"drop.*\"\noverflow = \"drop-oldest\"\nhistory = 0\n\
               [[channels]]\npattern = \"*\"\noverflow = \"disconnect\"\nhistory = 0\n";
    let srv = Server::start(cfg, &["--cores", "1"]);
    let data = format!("\"{}\"", "x".repeat(4000));
    for (ch, policy) in [("strict", "disconnect"), ("drop.x", "drop-oldest")] {
        let s = connect_small_rcvbuf(srv.addr, 4096).await;
        let mut reader = SseReader::open_on(s, srv.addr, &format!("/sse?ch={ch}"), &[]).await;
        assert_eq!(reader.status, 200);
        reader.collect("subscribed", 1, T).await;
        let before = srv.metric("tether_overflow_total", &[&format!("policy=\"{policy}\"")]).await;
        let end = Instant::now() + T;
        // Never read: publish until the policy acts.
        while srv.metric("tether_overflow_total", &[&format!("policy=\"{policy}\"")]).await == before {
            for _ in 0..20 {
                srv.publish(ch, &data).await;
            }
            assert!(Instant::now() < end, "{policy}: no overflow");
        }
        if policy == "disconnect" {
            // The peer that reads again (within the close timeout) gets the typed close and a
            // retry after what the kernel already held, then the end of the stream.
            let evs = reader.until_end(T).await;
            let close =
                evs.iter().find(|e| e.name == "close").unwrap_or_else(|| panic!("{:?}", common::sse::summary(&evs)));
            assert_eq!(close.json()["code"], 1013);
            assert_eq!(evs.last().and_then(|e| e.retry), Some(2000));
            srv.wait_gauge(0.0, T).await;
            assert_eq!(srv.metric("tether_reaped_total", &["reason=\"overflow\""]).await, 1.0);
        } else {
            // Still open, the queue bounded; reading again resumes with the newest messages.
            assert_eq!(srv.gauge().await, 1.0);
            let last = srv.publish(ch, "\"last\"").await;
            let evs = reader.collect("msg", 1, T).await;
            let mut got = seqs(&evs, ch);
            while got.last() != Some(&last) {
                got.extend(seqs(&reader.collect("msg", 1, T).await, ch));
            }
            assert!(got.len() < last as usize, "some were dropped: {} of {last}", got.len());
            assert!(got.windows(2).all(|w| w[0] < w[1]), "in order");
            drop(reader);
            srv.wait_gauge(0.0, T).await;
        }
    }
}

#[tokio::test]
async fn drain_ends_streams_with_close_and_a_spread_retry() {
    let mut srv = Server::start("[drain]\nwindow_ms = 1000\n", &[]);
    let mut readers = Vec::new();
    for _ in 0..20 {
        readers.push(SseReader::open(srv.addr, "/sse?ch=d", &[]).await);
    }
    srv.wait_gauge(20.0, T).await;
    srv.signal(libc::SIGTERM);
    let mut retries = std::collections::BTreeSet::new();
    for r in &mut readers {
        let evs = r.until_end(T).await;
        let close =
            evs.iter().find(|e| e.name == "close").unwrap_or_else(|| panic!("{:?}", common::sse::summary(&evs)));
        assert_eq!(close.json()["code"], 1012);
        let retry = evs.iter().find_map(|e| e.retry).expect("a retry");
        assert!((1000..=4000).contains(&retry), "{retry}");
        retries.insert(retry);
    }
    assert!(retries.len() >= 10, "retries spread: {retries:?}");
    let st = srv.wait_exit(Duration::from_secs(5));
    assert!(st.is_some_and(|s| s.success()), "{st:?}");
}

#[tokio::test]
async fn client_bytes_end_the_stream_and_many_channels_stream() {
    let srv = Server::start("", &["--cores", "1"]);
    let mut r = SseReader::open(srv.addr, "/sse?ch=x", &[]).await;
    srv.wait_gauge(1.0, T).await;
    r.s.write_all(b"hello").await.unwrap();
    r.until_end(T).await;
    srv.wait_gauge(0.0, T).await;

    let chans: Vec<String> = (0..300).map(|i| format!("many.{i}")).collect();
    let q: Vec<String> = chans.iter().map(|c| format!("ch={c}")).collect();
    let mut r = SseReader::open(srv.addr, &format!("/sse?{}", q.join("&")), &[]).await;
    assert_eq!(r.status, 200);
    r.collect("subscribed", chans.len(), T).await;
    for c in &chans {
        srv.publish(c, "1").await;
    }
    let got = r.collect("msg", chans.len(), T).await;
    let mut seen: Vec<String> = got.iter().map(|e| e.json()["ch"].as_str().unwrap().to_owned()).collect();
    seen.sort();
    let mut want = chans.clone();
    want.sort();
    assert_eq!(seen, want, "every channel once");
}
