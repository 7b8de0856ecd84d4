//! Helpers for tests with several tether nodes on one broker: a WebSocket client that is
//! either the raw RFC 6455 client of tests/common or tokio-tungstenite (an independent
//! implementation), reader tasks that log every `msg` and `reset` with its arrival time, and
//! the checks the logs must pass.
//!
//! Every wait here is bounded; a helper that runs out of time panics with what it saw.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use crate::common::{check, eventually, http_request, tung, RawWs, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT, STEP};

/// A WebSocket client connection.
pub enum Conn {
    /// tests/common's raw client (the test can reset its TCP connection).
    Raw(RawWs),
    /// tokio-tungstenite.
    Tung(Box<tung::Ws>),
}

impl Conn {
    /// Connects to `ws://addr/ws` with the raw client.
    pub async fn raw(addr: SocketAddr) -> Conn {
        Conn::Raw(RawWs::connect(addr, "/ws").await)
    }

    /// Connects to `ws://addr/ws` with tokio-tungstenite.
    pub async fn tung(addr: SocketAddr) -> Conn {
        Conn::Tung(Box::new(tung::connect(&format!("ws://{addr}/ws")).await))
    }

    /// Sends `v` as a text frame.
    pub async fn send(&mut self, v: &Value) {
        match self {
            Conn::Raw(ws) => ws.send_json(v).await,
            Conn::Tung(ws) => ws.send(Message::text(v.to_string())).await.expect("tungstenite send"),
        }
    }

    /// The next text frame as JSON, answering pings on the way; `Err` says how the connection
    /// ended (a close frame, EOF, an error). Unbounded: callers bound it.
    pub async fn recv(&mut self) -> Result<Value, String> {
        loop {
            match self {
                Conn::Raw(ws) => match ws.next(Duration::from_secs(3600)).await {
                    Ok(f) if f.opcode == OP_TEXT => return Ok(f.json()),
                    Ok(f) if f.opcode == OP_PING => ws.send(OP_PONG, true, &f.payload).await,
                    Ok(f) if f.opcode == OP_CLOSE => return Err(format!("close frame {}", f.close_code())),
                    Ok(_) => {}
                    Err(e) => return Err(format!("stream ended: {e:?}")),
                },
                Conn::Tung(ws) => match ws.next().await {
                    Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(&t).expect("text frame is JSON")),
                    Some(Ok(Message::Close(c))) => return Err(format!("close frame {c:?}")),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(format!("tungstenite: {e}")),
                    None => return Err("stream ended".into()),
                },
            }
        }
    }

    /// The next text frame within `limit`; panics with how it ended otherwise.
    pub async fn recv_within(&mut self, limit: Duration) -> Value {
        match tokio::time::timeout(limit, self.recv()).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => panic!("connection ended while a frame was expected: {e}"),
            Err(_) => panic!("no frame within {limit:?}"),
        }
    }

    /// `sub` to `ch` (resuming after `from` of `epoch` when given); returns the first reply.
    pub async fn sub(&mut self, ch: &str, from: Option<(u64, &str)>) -> Value {
        let req = match from {
            Some((from, epoch)) => json!({"op": "sub", "ch": ch, "from": from, "epoch": epoch}),
            None => json!({"op": "sub", "ch": ch}),
        };
        self.send(&req).await;
        self.recv_within(STEP).await
    }

    /// `sub` to `ch` from now on; asserts `subscribed` and returns `(head, epoch)`.
    pub async fn sub_live(&mut self, ch: &str) -> (u64, String) {
        let v = self.sub(ch, None).await;
        assert_eq!(v["op"], "subscribed", "reply to sub: {v}");
        (v["seq"].as_u64().expect("subscribed.seq"), v["epoch"].as_str().expect("subscribed.epoch").to_owned())
    }

    /// `pub` with `id`; returns the reply (`ack` or `error`).
    pub async fn publish(&mut self, ch: &str, id: &str, data: Value) -> Value {
        self.send(&json!({"op": "pub", "ch": ch, "id": id, "data": data})).await;
        self.recv_within(STEP).await
    }

    /// Pings and waits for the pong: the connection is still open. Returns the text frames
    /// that arrived before the pong (a reader that stopped at its target should see none).
    pub async fn alive(&mut self) -> Vec<Value> {
        let mut extra = Vec::new();
        let end = tokio::time::Instant::now() + STEP;
        match self {
            Conn::Raw(ws) => {
                ws.send(OP_PING, true, b"alive?").await;
                loop {
                    let f = match tokio::time::timeout_at(end, ws.next(STEP)).await {
                        Ok(Ok(f)) => f,
                        Ok(Err(e)) => panic!("connection ended instead of answering a ping: {e:?}"),
                        Err(_) => panic!("no pong within {STEP:?}"),
                    };
                    match f.opcode {
                        OP_PONG if &f.payload[..] == b"alive?" => return extra,
                        OP_TEXT => extra.push(f.json()),
                        OP_CLOSE => panic!("close frame {} instead of a pong", f.close_code()),
                        _ => {}
                    }
                }
            }
            Conn::Tung(ws) => {
                ws.send(Message::Ping(b"alive?".to_vec().into())).await.expect("send ping");
                loop {
                    match tokio::time::timeout_at(end, ws.next()).await {
                        Ok(Some(Ok(Message::Pong(p)))) if &p[..] == b"alive?" => return extra,
                        Ok(Some(Ok(Message::Text(t)))) => extra.push(serde_json::from_str(&t).expect("JSON")),
                        Ok(Some(Ok(_))) => {}
                        Ok(other) => panic!("connection ended instead of answering a ping: {other:?}"),
                        Err(_) => panic!("no pong within {STEP:?}"),
                    }
                }
            }
        }
    }

    /// Sets SO_LINGER 0 (raw client only), so dropping the connection sends a TCP RST.
    pub fn set_rst_on_close(&self) {
        match self {
            Conn::Raw(ws) => crate::common::set_rst_on_close(&ws.s),
            Conn::Tung(_) => panic!("set_rst_on_close needs the raw client"),
        }
    }
}

/// One event a subscriber received.
#[derive(Debug, Clone)]
pub enum Ev {
    /// A `msg`: its seq, its `data.n`, and when it arrived.
    Msg { seq: u64, n: u64, at: Instant },
    /// A `reset`.
    Reset { seq: u64, epoch: String, reason: String, oldest: u64 },
}

/// What a reader task saw.
pub struct Log {
    pub evs: Vec<Ev>,
    /// How the reading ended, when it ended otherwise than at its target.
    pub ended: Option<String>,
    pub conn: Conn,
}

impl Log {
    /// `(seq, n)` of every `msg`, in arrival order.
    pub fn msgs(&self) -> Vec<(u64, u64)> {
        self.evs.iter().filter_map(|e| if let Ev::Msg { seq, n, .. } = e { Some((*seq, *n)) } else { None }).collect()
    }

    /// When `msg` `seq` arrived (the first time).
    pub fn arrival(&self, seq: u64) -> Option<Instant> {
        self.evs.iter().find_map(|e| match e {
            Ev::Msg { seq: s, at, .. } if *s == seq => Some(*at),
            _ => None,
        })
    }
}

/// Reads `conn` in a task, logging every `msg` and `reset` on `ch`, until a `msg` whose
/// `data.n` reaches the value of `stop` (set it when the last publish is acked), the
/// connection ends, or `limit` passes.
pub fn spawn_reader(mut conn: Conn, ch: &str, mut stop: watch::Receiver<u64>, limit: Duration) -> JoinHandle<Log> {
    let ch = ch.to_owned();
    tokio::spawn(async move {
        let end = tokio::time::Instant::now() + limit;
        let mut evs = Vec::new();
        let mut last_n = 0;
        let mut stop_gone = false;
        let ended = loop {
            if last_n >= *stop.borrow_and_update() {
                break None;
            }
            tokio::select! {
                biased;
                v = conn.recv() => match v {
                    Ok(v) => {
                        let at = Instant::now();
                        assert_eq!(v["ch"], ch.as_str(), "frame on another channel: {v}");
                        match v["op"].as_str() {
                            Some("msg") => {
                                let seq = v["seq"].as_u64().expect("msg.seq");
                                let n = v["data"]["n"].as_u64().unwrap_or_else(|| panic!("msg without data.n: {v}"));
                                last_n = last_n.max(n);
                                evs.push(Ev::Msg { seq, n, at });
                            }
                            Some("reset") => evs.push(Ev::Reset {
                                seq: v["seq"].as_u64().expect("reset.seq"),
                                epoch: v["epoch"].as_str().expect("reset.epoch").to_owned(),
                                reason: v["reason"].as_str().expect("reset.reason").to_owned(),
                                oldest: v["oldest"].as_u64().expect("reset.oldest"),
                            }),
                            _ => break Some(format!("unexpected frame {v}")),
                        }
                    }
                    Err(e) => break Some(e),
                },
                r = stop.changed(), if !stop_gone => stop_gone = r.is_err(),
                _ = tokio::time::sleep_until(end) => break Some(format!("timed out after {limit:?} at n = {last_n}")),
            }
        };
        Log { evs, ended, conn }
    })
}

/// Joins reader tasks; panics if any ended otherwise than at its target.
pub async fn join_readers(readers: Vec<JoinHandle<Log>>) -> Vec<Log> {
    let mut logs = Vec::with_capacity(readers.len());
    for (i, r) in readers.into_iter().enumerate() {
        let log = r.await.expect("reader task");
        if let Some(e) = &log.ended {
            let tail: Vec<_> = log.msgs().into_iter().rev().take(5).collect();
            panic!("subscriber {i}: {e}; last (seq, n) received, newest first: {tail:?}");
        }
        logs.push(log);
    }
    logs
}

/// Asserts that `msgs` are exactly seq `first..=last` in order, once each, and that each
/// carries `data.n == seq + offset`.
pub fn assert_contiguous(who: &str, msgs: &[(u64, u64)], first: u64, last: u64, offset: i64) {
    let mut want = first;
    for &(seq, n) in msgs {
        assert_eq!(seq, want, "{who}: expected seq {want}, got {seq} (n = {n})");
        assert_eq!(n as i64, seq as i64 + offset, "{who}: seq {seq} carries n = {n}, want {}", seq as i64 + offset);
        want += 1;
    }
    assert_eq!(want, last + 1, "{who}: seqs end at {}, want {last}", want - 1);
}

/// Polls `GET /readyz` until it answers `status`; returns how long that took.
pub async fn wait_ready_status(addr: SocketAddr, status: u16, limit: Duration) -> Duration {
    let t0 = Instant::now();
    eventually(limit, &format!("/readyz of {addr} answering {status}"), || async {
        let (got, _, body) = http_request(addr, "GET", "/readyz", &[], b"").await;
        check(got == status, || format!("{got} {}", String::from_utf8_lossy(&body)))
    })
    .await;
    t0.elapsed()
}
