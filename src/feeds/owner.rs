//! The owner task of one feed (docs/feeds.md, "The owner"): while this node holds the feed's
//! lease, keep an outbound WebSocket to the upstream, and publish each upstream text message
//! unchanged as `data` into the feed's channel with publish id `feed:<id>:<upstream seq>` and
//! the lease's fencing token, through the same broker path as a client's publish.
//!
//! Order: one publish at a time, each waited for; a refusal that may pass (`unavailable`, a
//! full queue) is retried after a wait without reading further, so the upstream is
//! back-pressured and order is kept. A `fenced` refusal ends the task at once (the lease is
//! someone else's). Reconnects use the client's full-jitter backoff and close-code classes
//! ([`crate::client::backoff`], [`crate::client::close`]), resuming from the last stored
//! upstream seq (`resume_query`, `{last_seq}` in `subscribe`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as WsCloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

use super::host::{FeedHost, FeedPublish};
use super::metrics::FeedProgress;
use super::record::{validate_seq, FeedDef};
use crate::logging::redact_url;
use crate::protocol::backoff::{Backoff, BackoffConfig};
use crate::protocol::close::{classify_close, retry_hint, CloseAction};
use crate::protocol::codes;

/// How long connecting (TCP, TLS, upgrade) may take before it counts as a failed attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a publish may wait for the broker's answer before it is retried (same id: dedup
/// makes the retry safe).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a stopping owner waits for the answer to the publish it has in flight (see
/// `Owner::publish`); well inside the renew interval within which a STOP closes the upstream.
const STOP_ANSWER_GRACE: Duration = Duration::from_millis(100);
/// Wait after a terminal close code (1002, 1003, 1007, …): the upstream refused us for a
/// reason a quick retry will not fix, but the feed stays desired, so it is retried slowly.
const TERMINAL_RETRY: Duration = Duration::from_secs(30);

/// What an owner task tells the feed runtime.
#[derive(Debug)]
pub(super) enum OwnerEvent {
    /// A publish was refused as `fenced`: another node holds a newer lease. The task ended.
    Fenced {
        /// The feed.
        id: String,
        /// The stale token.
        token: u64,
    },
}

/// Everything an owner task needs.
pub(super) struct Owner {
    pub(super) def: FeedDef,
    pub(super) token: u64,
    pub(super) progress: Arc<FeedProgress>,
    pub(super) shared: Arc<dyn FeedHost>,
    /// Becomes `true` when the runtime wants a graceful stop (STOPPED, deleted, SIGTERM): a
    /// publish waiting for the broker's answer is abandoned (its message is published again
    /// by the next owner, deduplicated), the upstream is closed with 1000.
    pub(super) stop: watch::Receiver<bool>,
    pub(super) events: mpsc::UnboundedSender<OwnerEvent>,
}

/// How one upstream connection ended.
enum Ended {
    /// The runtime asked to stop.
    Stop,
    /// A publish was fenced out.
    Fenced,
    /// The upstream closed (code, reason) or the connection failed (`None`).
    Closed(Option<u16>, String),
}

/// How one publish ended.
enum Outcome {
    Stored,
    Fenced,
    Stop,
}

/// The upstream URL for a connection: `def.url` with `resume_query=last_seq` appended (or
/// replacing the parameter) when both are set.
pub fn upstream_url(def: &FeedDef, last_seq: Option<&str>) -> String {
    let (Some(seq), false) = (last_seq, def.resume_query.is_empty()) else { return def.url.clone() };
    let (base, query) = match def.url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (def.url.as_str(), ""),
    };
    let name = def.resume_query.as_str();
    let mut params: Vec<String> =
        query.split('&').filter(|p| !p.is_empty() && p.split('=').next() != Some(name)).map(str::to_owned).collect();
    params.push(format!("{name}={}", percent_encode(seq)));
    format!("{base}?{}", params.join("&"))
}

/// Percent-encodes everything but RFC 3986 unreserved bytes.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `subscribe` text with `{last_seq}` replaced by the last stored upstream seq (`0` before
/// any).
pub fn subscribe_text(def: &FeedDef, last_seq: Option<&str>) -> String {
    def.subscribe.replace("{last_seq}", last_seq.unwrap_or("0"))
}

/// The upstream seq of a message: the value at `pointer`, a JSON string as its text or a
/// number as written; `None` when missing or of another type.
pub fn upstream_seq(msg: &serde_json::Value, pointer: &str) -> Option<String> {
    match msg.pointer(pointer)? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The publish id of upstream message `seq` of feed `feed`: `feed:<feed>:<seq>`, or, when that
/// would pass the 128-byte limit of publish ids (`protocol::MAX_ID_BYTES`; a feed id has up to
/// 64 bytes and a seq up to 256), `feed:<feed>:sha1:<40 hex digits of SHA-1(seq)>` (at most 115
/// bytes). Either way the same message always gets the same id, which is all dedup needs.
pub fn publish_id(feed: &str, seq: &str) -> Box<str> {
    use sha1::{Digest, Sha1};
    let plain = format!("feed:{feed}:{seq}");
    if plain.len() <= crate::protocol::MAX_ID_BYTES {
        return plain.into();
    }
    let digest = Sha1::digest(seq.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("feed:{feed}:sha1:{hex}").into()
}

/// Whether `seq` was already stored: both parse as integers and `seq <= last`. Non-numeric
/// seqs are left to the broker's dedup on the publish id.
fn already_stored(seq: &str, last: Option<&str>) -> bool {
    match (seq.parse::<u64>(), last.map(str::parse::<u64>)) {
        (Ok(s), Some(Ok(l))) => s <= l,
        _ => false,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Owner {
    /// Runs until stopped or fenced out.
    pub(super) async fn run(mut self) {
        let id = self.def.id.clone();
        let mut backoff = Backoff::new(BackoffConfig::default());
        let mut first = true;
        loop {
            if *self.stop.borrow() {
                return;
            }
            let last = self.progress.last_seq();
            let url = upstream_url(&self.def, last.as_deref());
            let connect = tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(url.as_str()));
            let connected = tokio::select! {
                r = connect => r,
                _ = self.stop.changed() => return,
            };
            let (delay_floor, terminal) = match connected {
                Ok(Ok((ws, _))) => {
                    if !first {
                        self.progress.reconnects.fetch_add(1, Relaxed);
                    }
                    first = false;
                    self.progress.connected.store(true, Relaxed);
                    tracing::info!(feed = %id, url = %redact_url(&url), "upstream connected");
                    let (ended, delivered) = self.serve(ws, last.as_deref()).await;
                    self.progress.connected.store(false, Relaxed);
                    if delivered {
                        // The connection worked: the next wait starts from the first window.
                        backoff = Backoff::new(BackoffConfig::default());
                    }
                    match ended {
                        Ended::Stop => return,
                        Ended::Fenced => {
                            let _ = self.events.send(OwnerEvent::Fenced { id: id.clone(), token: self.token });
                            return;
                        }
                        Ended::Closed(code, reason) => {
                            let terminal = code.is_some_and(|c| classify_close(c) == CloseAction::Stop);
                            if terminal {
                                tracing::error!(feed = %id, code, reason = %crate::logging::Escaped(reason.as_bytes()), "upstream closed with a terminal code; retrying in 30 s");
                            } else {
                                tracing::info!(feed = %id, code, reason = %crate::logging::Escaped(reason.as_bytes()), "upstream connection ended; reconnecting");
                            }
                            (retry_hint(&reason), terminal)
                        }
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(feed = %id, url = %redact_url(&url), error = %e, "cannot connect upstream");
                    (None, false)
                }
                Err(_) => {
                    tracing::warn!(feed = %id, url = %redact_url(&url), "upstream connect timed out");
                    (None, false)
                }
            };
            let wait = if terminal { TERMINAL_RETRY } else { backoff.next_delay(delay_floor) };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.stop.changed() => return,
            }
        }
    }

    /// Serves one upstream connection: sends `subscribe`, then publishes every text message.
    /// Returns how it ended and whether any message was stored.
    async fn serve<S>(&mut self, mut ws: tokio_tungstenite::WebSocketStream<S>, last: Option<&str>) -> (Ended, bool)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let mut delivered = false;
        if !self.def.subscribe.is_empty() {
            if let Err(e) = ws.send(Message::text(subscribe_text(&self.def, last))).await {
                return (Ended::Closed(None, e.to_string()), false);
            }
        }
        loop {
            let msg = tokio::select! {
                m = ws.next() => m,
                _ = self.stop.changed() => {
                    let _ = ws.close(Some(CloseFrame { code: WsCloseCode::Normal, reason: "feed stopped".into() })).await;
                    return (Ended::Stop, delivered);
                }
            };
            let text = match msg {
                Some(Ok(Message::Text(t))) => t,
                Some(Ok(Message::Close(frame))) => {
                    let (code, reason) =
                        frame.map_or((None, String::new()), |f| (Some(u16::from(f.code)), f.reason.to_string()));
                    return (Ended::Closed(code, reason), delivered);
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return (Ended::Closed(None, e.to_string()), delivered),
                None => return (Ended::Closed(None, "connection closed".into()), delivered),
            };
            match self.publish(text.as_str()).await {
                Some(Outcome::Stored) => delivered = true,
                Some(Outcome::Fenced) => return (Ended::Fenced, delivered),
                Some(Outcome::Stop) => {
                    let _ =
                        ws.close(Some(CloseFrame { code: WsCloseCode::Normal, reason: "feed stopped".into() })).await;
                    return (Ended::Stop, delivered);
                }
                None => {}
            }
        }
    }

    /// The broker answered the publish of upstream `seq`: it becomes the feed's `last_seq`.
    fn stored(&self, seq: String) {
        self.progress.set_last_seq(Some(seq));
        self.progress.last_message_ms.store(now_ms(), Relaxed);
    }

    /// Publishes one upstream message; `None` when it was skipped (not JSON, no seq, too
    /// large, or already stored).
    async fn publish(&mut self, text: &str) -> Option<Outcome> {
        let id = &self.def.id;
        let value: serde_json::Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(feed = %id, error = %e, "upstream message is not JSON; skipped");
                return None;
            }
        };
        let Some(seq) = upstream_seq(&value, &self.def.seq_pointer) else {
            tracing::warn!(feed = %id, seq_pointer = %self.def.seq_pointer, "upstream message has no seq at seq_pointer; skipped");
            return None;
        };
        // The seq is stored as last_seq with the next renew and sent upstream on resume: one
        // the lease store would refuse (a space, over 256 bytes) would fail every renew.
        if let Err(e) = validate_seq(&seq) {
            tracing::warn!(feed = %id, reason = %e.reason, "upstream seq unusable as last_seq; message skipped");
            return None;
        }
        if already_stored(&seq, self.progress.last_seq().as_deref()) {
            return None;
        }
        let max = self.shared.config().limits.max_publish_bytes;
        if text.len() > max {
            tracing::warn!(feed = %id, bytes = text.len(), max, "upstream message above limits.max_publish_bytes; skipped");
            return None;
        }
        let data = Bytes::from(crate::protocol::compact_json(text).into_owned());
        let publish_id = publish_id(id, &seq);
        let mut backoff = Backoff::new(BackoffConfig {
            base: Duration::from_millis(50),
            cap: Duration::from_secs(5),
            stable_after: Duration::MAX,
        });
        loop {
            if *self.stop.borrow() {
                return Some(Outcome::Stop);
            }
            let (done, mut answer) = oneshot::channel();
            let p = FeedPublish {
                ch: self.def.channel.as_str().into(),
                id: publish_id.clone(),
                data: data.clone(),
                feed: id.as_str().into(),
                token: self.token,
                done,
            };
            let wait = match self.shared.try_publish(p) {
                Err(_) => Some(Duration::from_millis(5)),
                Ok(()) => match tokio::select! {
                    r = tokio::time::timeout(PUBLISH_TIMEOUT, &mut answer) => r,
                    _ = self.stop.changed() => {
                        // Stopping with this publish in flight. A running node answers within
                        // microseconds: wait that long, so that a message its subscribers got
                        // is in the last_seq stored at the stop (START resumes after it). A
                        // draining node's cores may stop before answering: then last_seq stays
                        // before this message, the next owner publishes it again under the
                        // same id, and the broker answers that as a duplicate.
                        if let Ok(Ok(Ok(_seq))) = tokio::time::timeout(STOP_ANSWER_GRACE, answer).await {
                            self.stored(seq);
                        }
                        return Some(Outcome::Stop);
                    }
                } {
                    Ok(Ok(Ok(_seq))) => {
                        self.stored(seq);
                        return Some(Outcome::Stored);
                    }
                    Ok(Ok(Err(e))) if e.code == codes::FENCED => {
                        tracing::error!(feed = %id, token = self.token, reason = %e.reason, "publish fenced out: another node holds a newer lease; feed stopped here");
                        return Some(Outcome::Fenced);
                    }
                    Ok(Ok(Err(e))) => {
                        tracing::warn!(feed = %id, code = e.code, reason = %e.reason, "publish refused; retrying");
                        Some(backoff.next_delay(e.retry_after_ms.map(Duration::from_millis)))
                    }
                    Ok(Err(_)) | Err(_) => Some(backoff.next_delay(None)),
                },
            };
            if let Some(wait) = wait {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = self.stop.changed() => return Some(Outcome::Stop),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(url: &str, rq: &str, sub: &str) -> FeedDef {
        FeedDef {
            id: "f".into(),
            url: url.into(),
            channel: "c".into(),
            desired_state: Default::default(),
            subscribe: sub.into(),
            resume_query: rq.into(),
            seq_pointer: "/seq".into(),
        }
    }

    #[test]
    fn resume_query_is_set_or_replaced() {
        assert_eq!(upstream_url(&def("ws://h/s", "from", ""), None), "ws://h/s");
        assert_eq!(upstream_url(&def("ws://h/s", "", ""), Some("7")), "ws://h/s");
        assert_eq!(upstream_url(&def("ws://h/s", "from", ""), Some("7")), "ws://h/s?from=7");
        assert_eq!(upstream_url(&def("ws://h/s?a=1&from=2", "from", ""), Some("7")), "ws://h/s?a=1&from=7");
        assert_eq!(upstream_url(&def("ws://h/s", "from", ""), Some("a b")), "ws://h/s?from=a%20b");
    }

    #[test]
    fn subscribe_and_seq() {
        assert_eq!(subscribe_text(&def("ws://h", "", r#"{"from":{last_seq}}"#), Some("9")), r#"{"from":9}"#);
        assert_eq!(subscribe_text(&def("ws://h", "", r#"{"from":{last_seq}}"#), None), r#"{"from":0}"#);
        let v: serde_json::Value = serde_json::from_str(r#"{"seq":12,"m":{"id":"x"}}"#).unwrap();
        assert_eq!(upstream_seq(&v, "/seq").as_deref(), Some("12"));
        assert_eq!(upstream_seq(&v, "/m/id").as_deref(), Some("x"));
        assert_eq!(upstream_seq(&v, "/m"), None);
        assert!(already_stored("3", Some("3")) && !already_stored("4", Some("3")) && !already_stored("a", Some("3")));
    }

    #[test]
    fn publish_ids_fit_the_limit_and_stay_stable() {
        assert_eq!(&*publish_id("btc", "17"), "feed:btc:17");
        let long_feed = "f".repeat(64);
        let long_seq = "s".repeat(256);
        let id = publish_id(&long_feed, &long_seq);
        assert!(id.len() <= crate::protocol::MAX_ID_BYTES, "{} bytes", id.len());
        assert!(id.starts_with(&format!("feed:{long_feed}:sha1:")), "{id}");
        assert_eq!(id, publish_id(&long_feed, &long_seq));
        assert_ne!(id, publish_id(&long_feed, &"t".repeat(256)));
        // The longest plain id is kept as is.
        let seq = "9".repeat(crate::protocol::MAX_ID_BYTES - "feed::".len() - 3);
        assert_eq!(&*publish_id("abc", &seq), format!("feed:abc:{seq}"));
    }
}
