//! Traffic for failover tests: publishers that keep every publish until it is acked (HTTP
//! `POST /publish` with an `Idempotency-Key`, WS `pub` with an id), subscribers that record
//! every `msg` and `reset` per channel, and [`audit`], which holds each recorded stream to
//! the delivery contract (docs/protocol.md): seq 1..N exactly once, every acked message under
//! its acked seq, and any discontinuity announced by a `reset`.
//!
//! A message's data is `{"t": TAG}` with TAG its publish id, so a delivery can be matched to
//! its ack. Every wait is bounded; a publish not acked within [`PUBLISH_LIMIT`] panics.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use super::*;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// Publishes per second of each publisher.
pub const RATE: u64 = 100;
/// How long one publish may take to be acked, retries included.
pub const PUBLISH_LIMIT: Duration = Duration::from_secs(25);
/// Pause before retrying a refused or failed publish.
const RETRY: Duration = Duration::from_millis(50);

/// Spawned tasks, aborted when dropped (a failing test stops its publishers and readers
/// before the servers they talk to go away).
#[derive(Default)]
pub struct Tasks(Vec<JoinHandle<()>>);

impl Tasks {
    pub fn spawn(&mut self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        self.0.push(tokio::spawn(f));
    }

    /// Waits for every task (they were told to stop), re-raising a task's panic; panics after
    /// `limit`.
    pub async fn join(mut self, limit: Duration) {
        for t in std::mem::take(&mut self.0) {
            match tokio::time::timeout(limit, t).await.expect("a task did not stop in time") {
                Ok(()) => {}
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// What [`audit`] found, one line per finding.
#[derive(Debug, Default)]
pub struct Findings {
    /// A seq beyond the next one with no `reset` before it.
    pub silent_gaps: Vec<String>,
    /// A seq at or below one already delivered.
    pub duplicates: Vec<String>,
    /// An acked message not delivered under its seq, and whether the stream had a `reset`.
    pub lost_acked: Vec<(String, bool)>,
    pub resets: Vec<String>,
}

/// Holds every subscriber's stream of every channel to the contract; `acked` is each
/// channel's acks.
pub fn audit(subs: &[Subscriber], acked: &HashMap<String, Vec<&Ack>>) -> Findings {
    let mut f = Findings::default();
    for s in subs {
        let seen = s.seen.lock().unwrap();
        for c in &s.chans {
            let who = format!("{} {} {c}", s.node, s.client);
            let mut expect = 1;
            let mut delivered: HashMap<u64, &str> = HashMap::new();
            let mut had_reset = false;
            for e in seen.get(c).map(Vec::as_slice).unwrap_or_default() {
                match e {
                    Seen::Msg(seq, tag) if *seq >= expect => {
                        if *seq > expect {
                            f.silent_gaps.push(format!("{who}: {expect}..{} missing", seq - 1));
                        }
                        delivered.insert(*seq, tag);
                        expect = seq + 1;
                    }
                    Seen::Msg(seq, _) => f.duplicates.push(format!("{who}: seq {seq} again")),
                    Seen::Reset { seq, reason } => {
                        f.resets.push(format!("{who}: reset {reason} at {seq} (next was {expect})"));
                        had_reset = true;
                        expect = seq + 1;
                    }
                }
            }
            let mut tags = HashSet::new();
            for t in delivered.values() {
                assert!(tags.insert(*t), "{who}: message {t} delivered under two seqs");
            }
            for a in acked.get(c).into_iter().flatten() {
                if delivered.get(&a.seq) != Some(&a.tag.as_str()) {
                    let got = delivered.get(&a.seq).copied().unwrap_or("nothing");
                    f.lost_acked.push((format!("{who}: acked {} as {} but got {got}", a.tag, a.seq), had_reset));
                }
            }
        }
    }
    f
}

/// One acked publish.
#[derive(Debug, Clone)]
pub struct Ack {
    pub ch: String,
    pub seq: u64,
    /// The publish's id, also its data: `{"t": TAG}`.
    pub tag: String,
    /// When the ack arrived.
    pub at: Instant,
}

/// What the publishers did, together.
#[derive(Debug, Default)]
pub struct Tally {
    pub acks: Mutex<Vec<Ack>>,
    /// 503 (HTTP) or `unavailable` (WS) answers: not stored; each followed by a retry with
    /// the same id.
    pub refused: AtomicU64,
    /// 504 (HTTP) or `unknown_outcome` (WS) answers: perhaps stored; each followed by a retry
    /// with the same id (a duplicate then, answered with the original seq).
    pub unknown: AtomicU64,
    /// Connection errors and timeouts, each followed by a retry with the same id.
    pub failed: AtomicU64,
}

impl Tally {
    pub fn ack(&self, ch: &str, seq: u64, tag: &str) {
        self.acks.lock().unwrap().push(Ack { ch: ch.into(), seq, tag: tag.into(), at: Instant::now() });
    }

    pub fn acked(&self) -> usize {
        self.acks.lock().unwrap().len()
    }
}

/// What a subscriber saw on one channel.
#[derive(Debug, Clone)]
pub enum Seen {
    Msg(u64, String),
    Reset { seq: u64, reason: String },
}

pub type SeenLog = Arc<Mutex<HashMap<String, Vec<Seen>>>>;

/// A subscriber connection: tokio-tungstenite (an independent client) or the raw RFC 6455
/// client of tests/common (which answers pings itself here).
pub enum Wire {
    Tung(Box<Ws>),
    Raw(RawWs),
}

impl Wire {
    pub async fn open(addr: SocketAddr, tung: bool) -> Wire {
        if tung {
            let (ws, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(format!("ws://{addr}/ws")))
                .await
                .expect("connect timed out")
                .expect("connect");
            Wire::Tung(Box::new(ws))
        } else {
            Wire::Raw(RawWs::connect(addr, "/ws").await)
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Wire::Tung(_) => "tungstenite",
            Wire::Raw(_) => "raw",
        }
    }

    pub async fn send(&mut self, v: Value) {
        match self {
            Wire::Tung(ws) => ws.send(Message::text(v.to_string())).await.expect("send"),
            Wire::Raw(ws) => ws.send_json(&v).await,
        }
    }

    /// The next text frame as JSON (pings answered); panics on anything else or after `limit`.
    pub async fn recv(&mut self, limit: Duration) -> Value {
        match self {
            Wire::Tung(ws) => loop {
                match tokio::time::timeout(limit, ws.next()).await.expect("no frame in time") {
                    Some(Ok(Message::Text(t))) => return serde_json::from_str(&t).expect("JSON"),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                    other => panic!("expected a text frame, got {other:?}"),
                }
            },
            Wire::Raw(ws) => loop {
                let f = ws.frame(limit).await;
                match f.opcode {
                    OP_TEXT => return f.json(),
                    OP_PING => ws.send(OP_PONG, true, &f.payload).await,
                    _ => panic!("expected a text frame, got {f:?}"),
                }
            },
        }
    }

    /// Subscribes `chans` (all at once), retrying those refused while the broker links up.
    pub async fn subscribe(&mut self, chans: &[String]) {
        let end = Instant::now() + Duration::from_secs(20);
        let mut pending: HashSet<String> = chans.iter().cloned().collect();
        while !pending.is_empty() {
            assert!(Instant::now() < end, "still not subscribed after 20 s: {pending:?}");
            for ch in &pending {
                self.send(json!({"op": "sub", "ch": ch})).await;
            }
            let mut refused = 0;
            for _ in 0..pending.len() {
                let v = self.recv(STEP).await;
                match v["op"].as_str() {
                    Some("subscribed") => {
                        assert_eq!(v["seq"], 0, "a fresh channel's head is 0: {v}");
                        pending.remove(v["ch"].as_str().expect("ch"));
                    }
                    Some("error") if v["code"] == "unavailable" => refused += 1,
                    _ => panic!("reply to sub: {v}"),
                }
            }
            if refused > 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// Records every `msg` and `reset` until `stop`.
    pub async fn read(mut self, seen: SeenLog, mut stop: watch::Receiver<bool>) {
        loop {
            let v = tokio::select! {
                v = self.recv(Duration::from_secs(120)) => v,
                _ = stop.changed() => return,
            };
            let ch = v["ch"].as_str().unwrap_or_default().to_owned();
            let ev = match v["op"].as_str() {
                Some("msg") => Seen::Msg(v["seq"].as_u64().expect("seq"), v["data"]["t"].as_str().expect("tag").into()),
                Some("reset") => Seen::Reset {
                    seq: v["seq"].as_u64().expect("seq"),
                    reason: v["reason"].as_str().unwrap_or_default().into(),
                },
                _ => panic!("unexpected frame for a subscriber: {v}"),
            };
            seen.lock().unwrap().entry(ch).or_default().push(ev);
        }
    }
}

/// One subscriber connection's record: which node, which client, what it saw.
pub struct Subscriber {
    pub node: &'static str,
    pub client: &'static str,
    pub chans: Vec<String>,
    pub seen: SeenLog,
}

impl Subscriber {
    /// The last seq this subscriber reached on `ch` (a `reset` moves it to `reset.seq`).
    pub fn reached(&self, ch: &str) -> u64 {
        let seen = self.seen.lock().unwrap();
        match seen.get(ch).and_then(|v| v.last()) {
            Some(Seen::Msg(s, _)) | Some(Seen::Reset { seq: s, .. }) => *s,
            None => 0,
        }
    }
}

impl Subscriber {
    /// The last seq this subscriber reached on `ch` after its latest `reset`; `None` before
    /// any `reset`.
    pub fn reached_after_reset(&self, ch: &str) -> Option<u64> {
        let seen = self.seen.lock().unwrap();
        let v = seen.get(ch)?;
        let at = v.iter().rposition(|e| matches!(e, Seen::Reset { .. }))?;
        v[at..].last().map(|e| match e {
            Seen::Msg(s, _) | Seen::Reset { seq: s, .. } => *s,
        })
    }
}

/// `POST /publish/{ch}` with an `Idempotency-Key` on a keep-alive connection (re-opened after
/// any failure); `Err` on a connection error or a 5 s timeout.
async fn http_publish(
    conn: &mut Option<TcpStream>,
    addr: SocketAddr,
    ch: &str,
    key: &str,
    body: &str,
) -> Result<(u16, Vec<u8>), String> {
    let attempt = async {
        if conn.is_none() {
            *conn = Some(TcpStream::connect(addr).await.map_err(|e| e.to_string())?);
        }
        let s = conn.as_mut().expect("connection");
        let req = format!(
            "POST /publish/{ch} HTTP/1.1\r\nHost: {addr}\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or(format!("bad head {head:?}"))?;
                let len: usize = header(&head, "content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    return Ok((status, buf[end + 4..end + 4 + len].to_vec()));
                }
            }
            let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".to_string());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let r = match tokio::time::timeout(Duration::from_secs(5), attempt).await {
        Ok(r) => r,
        Err(_) => Err("no answer within 5 s".to_string()),
    };
    if r.is_err() {
        *conn = None;
    }
    r
}

/// Which channel publish `i` of publisher `k` goes to: every publisher cycles through every
/// channel, from its own offset.
fn pick(chans: &[String], k: usize, i: usize) -> &str {
    &chans[(i + k * 17) % chans.len()]
}

/// Publishes over HTTP at [`RATE`] until `stop`, each publish retried (same key) until acked.
pub async fn http_publisher(
    addr: SocketAddr,
    k: usize,
    chans: Arc<Vec<String>>,
    tally: Arc<Tally>,
    stop: watch::Receiver<bool>,
) {
    http_publisher_at(addr, k, chans, RATE, tally, stop).await;
}

/// [`http_publisher`] at `rate` publishes per second. Its publishes go one at a time: each is
/// sent after the one before it was acked.
pub async fn http_publisher_at(
    addr: SocketAddr,
    k: usize,
    chans: Arc<Vec<String>>,
    rate: u64,
    tally: Arc<Tally>,
    stop: watch::Receiver<bool>,
) {
    let mut conn = None;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut i = 0;
    while !*stop.borrow() {
        tick.tick().await;
        let ch = pick(&chans, k, i);
        let tag = format!("h{k}-{i}");
        let body = json!({ "t": tag }).to_string();
        let started = Instant::now();
        loop {
            match http_publish(&mut conn, addr, ch, &tag, &body).await {
                Ok((200, reply)) => {
                    let seq = seq_of_reply(&reply);
                    tally.ack(ch, seq, &tag);
                    break;
                }
                Ok((503, _)) => drop(tally.refused.fetch_add(1, Relaxed)),
                Ok((504, _)) => drop(tally.unknown.fetch_add(1, Relaxed)),
                Ok((status, reply)) => panic!("publish {tag} to {ch}: {status} {}", String::from_utf8_lossy(&reply)),
                Err(_) => drop(tally.failed.fetch_add(1, Relaxed)),
            }
            assert!(started.elapsed() < PUBLISH_LIMIT, "HTTP publish {tag} to {ch} not acked within {PUBLISH_LIMIT:?}");
            tokio::time::sleep(RETRY).await;
        }
        i += 1;
    }
}

/// Publishes with WS `pub` at [`RATE`] until `stop`, each publish resent (same id) until acked.
pub async fn ws_publisher(
    addr: SocketAddr,
    k: usize,
    chans: Arc<Vec<String>>,
    tally: Arc<Tally>,
    stop: watch::Receiver<bool>,
) {
    let Wire::Tung(mut ws) = Wire::open(addr, true).await else { unreachable!() };
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut i = 0;
    while !*stop.borrow() {
        tick.tick().await;
        let ch = pick(&chans, k, i);
        let tag = format!("w{k}-{i}");
        let started = Instant::now();
        'publish: loop {
            let frame = json!({"op": "pub", "ch": ch, "id": tag, "data": {"t": tag}}).to_string();
            ws.send(Message::text(frame)).await.expect("send pub");
            let end = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                let m = match tokio::time::timeout_at(end, ws.next()).await {
                    Err(_) => {
                        tally.failed.fetch_add(1, Relaxed);
                        break;
                    }
                    Ok(m) => m,
                };
                let v: Value = match m {
                    Some(Ok(Message::Text(t))) => serde_json::from_str(&t).expect("JSON"),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    other => panic!("publisher w{k}: expected a text frame, got {other:?}"),
                };
                if v["id"] != tag.as_str() {
                    continue; // the late answer to an earlier attempt of a previous publish
                }
                match v["op"].as_str() {
                    Some("ack") => {
                        let seq = v["seq"].as_u64().expect("seq");
                        tally.ack(ch, seq, &tag);
                        break 'publish;
                    }
                    Some("error") if v["code"] == "unavailable" || v["code"] == "unknown_outcome" => {
                        let n = if v["code"] == "unavailable" { &tally.refused } else { &tally.unknown };
                        n.fetch_add(1, Relaxed);
                        break;
                    }
                    _ => panic!("answer to pub {tag}: {v}"),
                }
            }
            assert!(started.elapsed() < PUBLISH_LIMIT, "WS publish {tag} to {ch} not acked within {PUBLISH_LIMIT:?}");
            tokio::time::sleep(RETRY).await;
        }
        i += 1;
    }
}
