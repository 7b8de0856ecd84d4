//! The server API under `/api/` (docs/api.md, described by docs/api.yaml): what a backend asks
//! of the cluster besides `POST /publish/{channel}`. JSON in and out; behind
//! [`auth::check_api`] (the publish keys when set, else the admin rules).
//!
//! | endpoint | what | answered by |
//! |---|---|---|
//! | `POST /api/publish` | one message to several channels, each with its own seq | the channels' homes, one answer per channel ([`gather`]) |
//! | `GET /api/history/{ch}` | a page of the channel's history | the broker's history read |
//! | `GET /api/channels` | channels with subscribers on this node, with counts | every core ([`gather`]) |
//! | `POST /api/disconnect` | close a user's connections | every core, and the other nodes through the broker |
//! | `POST /api/unsubscribe` | end a user's subscription to a channel | likewise |
//! | `POST /api/revoke` | refuse a token (by `jti`) or a user's tokens, close their connections | likewise, kept in the broker's store |
//!
//! `/api/presence/{ch}` and `/api/presence_stats/{ch}` belong to presence (issue 28) and are
//! not routed here yet: they answer 404 like any unknown path.
//!
//! # Layout
//! - this file: routing, the guard, and the answers that need no gathering;
//! - [`input`]: bodies and queries read and checked (sans-IO), the bounds;
//! - [`gather`]: answers assembled from several cores or several homes.

pub mod gather;
pub mod input;

use std::sync::Arc;

use serde_json::{json, Value};

use super::auth::{self, Guarded};
use crate::http::{self, Method, Request, StatusCode};
use crate::protocol::RequestError;
use crate::server::broker::{Control, HistoryPage, PresenceQuery, Request as BrokerRequest};
use crate::server::bus::{ConnRef, CoreMsg};
use crate::server::conn::ConnId;
use crate::server::core::CoreState;
use gather::{Gathering, Pending};
use input::FieldError;

/// What a path under `/api` resolves to.
enum Route<'a> {
    Publish,
    History(&'a str),
    Presence(&'a str, bool),
    Channels,
    Control(fn(&[u8]) -> Result<Control, FieldError>),
    Revoke,
}

/// A request read and checked, about to be started.
enum Work {
    Batch(input::BatchPublish),
    History((String, Option<u64>, usize)),
    Presence(String, PresenceQuery),
    Channels((String, usize)),
    Control(Control),
}

/// The route of `rest` (the path after `/api`) for `method`, or the 404 / 405 refusal (with
/// its `Allow`).
fn route(method: Method, rest: &str) -> Result<Route<'_>, (StatusCode, &'static str, Option<&'static str>)> {
    // (route, whether it reads: GET and HEAD; else it takes POST)
    let (route, reads) = match rest {
        "/publish" => (Route::Publish, false),
        "/channels" => (Route::Channels, true),
        "/disconnect" => (Route::Control(input::disconnect), false),
        "/unsubscribe" => (Route::Control(input::unsubscribe), false),
        "/revoke" => (Route::Revoke, false),
        _ => {
            let under = |prefix: &str| rest.strip_prefix(prefix).filter(|ch| !ch.is_empty() && !ch.contains('/'));
            match (under("/history/"), under("/presence/"), under("/presence_stats/")) {
                (Some(ch), _, _) => (Route::History(ch), true),
                (_, Some(ch), _) => (Route::Presence(ch, false), true),
                (_, _, Some(ch)) => (Route::Presence(ch, true), true),
                _ => return Err((StatusCode::NOT_FOUND, "no such endpoint", None)),
            }
        }
    };
    match (reads, method) {
        (true, Method::Get | Method::Head) | (false, Method::Post) => Ok(route),
        (true, _) => Err((StatusCode::METHOD_NOT_ALLOWED, "use GET or HEAD", Some("GET, HEAD"))),
        (false, _) => Err((StatusCode::METHOD_NOT_ALLOWED, "use POST", Some("POST"))),
    }
}

/// A presence query of `ch` when its `[[channels]]` rule has presence on; else the `ch` field
/// refused (a channel without presence has no members to list).
fn presence_on(
    cfg: &crate::config::Config,
    ch: String,
    q: PresenceQuery,
) -> Result<(String, PresenceQuery), FieldError> {
    if cfg.channel_rule(&ch).presence {
        Ok((ch, q))
    } else {
        Err(input::bad("ch", format!("presence is off for {ch} (its [[channels]] rule has no presence = true)")))
    }
}

/// An answer of the API: `body` as JSON with `status`.
pub(super) fn json_response(status: StatusCode, body: &Value, extra: &[(&str, &str)], keep_alive: bool) -> Vec<u8> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    http::response(status, "application/json", &bytes, extra, keep_alive)
}

/// A refusal: `{"error":reason[,"field":field]}`.
fn error_body(reason: &str, field: Option<&str>) -> Value {
    match field {
        Some(f) => json!({"error": reason, "field": f}),
        None => json!({"error": reason}),
    }
}

/// The answer to a broker that cannot serve now (`unavailable`, Redis unreachable): 503 with
/// `Retry-After` (seconds) and the refusal's `retry_after_ms`; `more` adds fields (what this
/// node did nevertheless).
pub(super) fn unavailable(e: &RequestError, more: Value, keep_alive: bool) -> Vec<u8> {
    let ms = e.retry_after_ms.unwrap_or(1000);
    let mut body = json!({"error": e.reason, "code": e.code, "retry_after_ms": ms});
    if let (Some(b), Value::Object(m)) = (body.as_object_mut(), more) {
        b.extend(m);
    }
    let secs = ms.div_ceil(1000).max(1).to_string();
    json_response(StatusCode::SERVICE_UNAVAILABLE, &body, &[("Retry-After", &secs)], keep_alive)
}

impl CoreState {
    /// A request under `/api/`: the guard (401, 403, 421), then routing (404, 405), then the
    /// input (400 naming the field), then the work, answered when done.
    pub(in crate::server::http) fn api(&mut self, id: ConnId, req: &Request, body: &[u8]) {
        let keep_alive = req.keep_alive;
        let c = self.conn(id);
        let ends = auth::Ends {
            peer: c.as_ref().and_then(|c| c.peer()).map(|a| a.ip()),
            local: c.and_then(|c| c.local()).map(|a| a.ip()),
        };
        if let Err(r) = auth::check_api(&self.shared.config, req, ends) {
            return self.refuse_auth(id, Guarded::Api, r, keep_alive);
        }
        let route = match route(req.method, &req.path["/api".len()..]) {
            Ok(r) => r,
            Err((status, reason, allow)) => {
                let allow: Vec<(&str, &str)> = allow.map(|a| ("Allow", a)).into_iter().collect();
                return self.send(id, json_response(status, &error_body(reason, None), &allow, keep_alive), keep_alive);
            }
        };
        if matches!(route, Route::Revoke) {
            self.api.revocations.expire(crate::auth::unix_now_ms());
        }
        let params: &[&str] = match route {
            Route::History(_) => &["from", "limit"],
            Route::Presence(_, false) => &["cursor"],
            Route::Channels => &["prefix", "limit"],
            _ => &[],
        };
        let work = match input::known_params(req.query.as_deref(), params) {
            Err(e) => Err(e),
            Ok(()) => match route {
                Route::Publish => input::publish(body).map(Work::Batch),
                Route::History(raw) => input::history(raw, req.query.as_deref()).map(Work::History),
                Route::Presence(raw, stats) => input::presence(raw, req.query.as_deref(), stats)
                    .and_then(|(ch, q)| presence_on(&self.shared.config, ch, q))
                    .map(|(ch, q)| Work::Presence(ch, q)),
                Route::Channels => input::channels(req.query.as_deref()).map(Work::Channels),
                Route::Control(parse) => parse(body).map(Work::Control),
                Route::Revoke if self.api.revocations.len() >= crate::auth::revoke::MAX_REVOCATIONS => {
                    let why = format!(
                        "{} revocations are in force; more are refused until some reach their until_ms",
                        crate::auth::revoke::MAX_REVOCATIONS
                    );
                    let e = RequestError::unavailable(why, 60_000);
                    return self.send(id, unavailable(&e, json!({}), keep_alive), keep_alive);
                }
                Route::Revoke => input::revoke(body, crate::auth::unix_now_ms())
                    .map(|revocation| Work::Control(Control::Revoke { revocation })),
            },
        };
        let work = match work {
            Ok(w) => w,
            Err(e) => {
                let reason = format!("{}: {}", e.field, e.reason);
                let resp =
                    json_response(StatusCode::BAD_REQUEST, &error_body(&reason, Some(&e.field)), &[], keep_alive);
                return self.send(id, resp, keep_alive);
            }
        };
        // The answer comes when the work is done; the connection's next request waits.
        if let Some(s) = self.session(id) {
            s.await_answer(keep_alive);
        }
        let reply = ConnRef { core: self.me as u16, id };
        match work {
            Work::Batch(p) => self.start_batch(id, p),
            Work::History((ch, from, limit)) => {
                let req = BrokerRequest::History { ch: ch.into(), reply, from, limit };
                self.broker.request(&mut self.router, req);
            }
            Work::Presence(ch, query) => {
                let req = BrokerRequest::Presence { ch: ch.into(), conn: reply, query };
                self.broker.request(&mut self.router, req);
            }
            Work::Channels((prefix, limit)) => {
                self.start_gathering(id, Pending::channels(limit));
                let prefix = Arc::<str>::from(prefix);
                for core in 0..self.shared.cores {
                    self.router.to_core(core, CoreMsg::ListChannels { reply, prefix: prefix.clone(), limit });
                }
            }
            Work::Control(msg) => self.start_control(id, msg),
        }
    }

    /// Begins a node-wide action: every core of this node applies it (and answers with what
    /// it affected), and the broker tells the other nodes.
    fn start_control(&mut self, id: ConnId, msg: Control) {
        let msg = Arc::new(msg);
        self.start_gathering(id, Pending::control(msg.clone()));
        let reply = ConnRef { core: self.me as u16, id };
        for core in 0..self.shared.cores {
            self.router.to_core(core, CoreMsg::Control { msg: msg.clone(), reply: Some(reply) });
        }
        self.broker.request(&mut self.router, BrokerRequest::Control { msg, reply });
    }

    fn start_gathering(&mut self, id: ConnId, pending: Pending) {
        let missing = self.shared.cores + usize::from(matches!(pending, Pending::Control { .. }));
        self.api.gatherings.push(Gathering { conn: id, missing, pending });
    }

    /// The broker answered the `GET /api/presence/{ch}` (or `presence_stats`) of `id` with
    /// `json`, the object a WebSocket client would get: 200 with it (its `op` left out), 400
    /// naming `cursor` for a cursor the server did not give, 503 when the broker cannot read.
    pub(crate) fn answer_api_presence(&mut self, id: ConnId, json: &[u8], keep_alive: bool) {
        let mut v: Value = serde_json::from_slice(json).unwrap_or(Value::Null);
        let op = v.as_object_mut().and_then(|o| o.remove("op"));
        let resp = match op.as_ref().and_then(Value::as_str) {
            Some("error") => {
                let code = v["code"].as_str().unwrap_or_default().to_owned();
                let reason = v["reason"].as_str().unwrap_or_default().to_owned();
                if code == crate::protocol::codes::BAD_REQUEST {
                    json_response(StatusCode::BAD_REQUEST, &error_body(&reason, Some("cursor")), &[], keep_alive)
                } else {
                    let ms = v["retry_after_ms"].as_u64();
                    let e = RequestError {
                        code: crate::protocol::codes::UNAVAILABLE,
                        reason,
                        id: None,
                        ch: None,
                        retry_after_ms: ms,
                    };
                    unavailable(&e, json!({}), keep_alive)
                }
            }
            _ => json_response(StatusCode::OK, &v, &[], keep_alive),
        };
        self.send(id, resp, keep_alive);
        self.serve_pending(id);
    }

    /// The broker answered the `GET /api/history/{ch}` of `id`: 200 with the page (empty for a
    /// `from` at or beyond the head), 503 when the broker cannot read now.
    pub(crate) fn answer_history(&mut self, id: ConnId, ch: &str, page: Result<HistoryPage, Box<RequestError>>) {
        let Some(keep_alive) = self.session(id).and_then(|s| s.awaiting()) else { return };
        let resp = match page {
            Err(e) => unavailable(&e, json!({}), keep_alive),
            Ok(p) => history_body(ch, &p, keep_alive),
        };
        self.send(id, resp, keep_alive);
        self.serve_pending(id);
    }
}

/// `{"ch","epoch","head","oldest","messages":[{"seq","data"}…]}`, each `data` the stored JSON
/// text as is.
fn history_body(ch: &str, p: &HistoryPage, keep_alive: bool) -> Vec<u8> {
    let mut body = Vec::with_capacity(96 + ch.len() + p.messages.iter().map(|(_, d)| d.len() + 32).sum::<usize>());
    body.extend_from_slice(b"{\"ch\":");
    crate::protocol::push_json_str(&mut body, ch);
    body.extend_from_slice(b",\"epoch\":");
    crate::protocol::push_json_str(&mut body, &p.epoch);
    body.extend_from_slice(b",\"head\":");
    crate::protocol::push_u64(&mut body, p.head);
    body.extend_from_slice(b",\"oldest\":");
    crate::protocol::push_u64(&mut body, p.oldest);
    body.extend_from_slice(b",\"messages\":[");
    for (i, (seq, data)) in p.messages.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(b"{\"seq\":");
        crate::protocol::push_u64(&mut body, *seq);
        body.extend_from_slice(b",\"data\":");
        body.extend_from_slice(if data.is_empty() { b"null" } else { data.as_ref() });
        body.push(b'}');
    }
    body.extend_from_slice(b"]}");
    http::response(StatusCode::OK, "application/json", &body, &[], keep_alive)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn page(messages: &[(u64, &'static str)]) -> HistoryPage {
        let messages = messages.iter().map(|(s, d)| (*s, Bytes::from_static(d.as_bytes()))).collect();
        HistoryPage { epoch: "e1".into(), head: 9, oldest: 3, messages }
    }

    fn body_of(resp: &[u8]) -> Value {
        let at = resp.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
        serde_json::from_slice(&resp[at..]).expect("JSON")
    }

    #[test]
    fn routes_and_their_methods() {
        assert!(matches!(route(Method::Post, "/publish"), Ok(Route::Publish)));
        assert!(matches!(route(Method::Head, "/history/a.b"), Ok(Route::History("a.b"))));
        assert!(matches!(route(Method::Get, "/channels"), Ok(Route::Channels)));
        assert_eq!(route(Method::Get, "/publish").err().map(|e| e.2), Some(Some("POST")));
        assert_eq!(route(Method::Post, "/channels").err().map(|e| e.2), Some(Some("GET, HEAD")));
        assert_eq!(route(Method::Delete, "/history/a").err().map(|e| e.2), Some(Some("GET, HEAD")));
        assert!(matches!(route(Method::Get, "/presence/a.b"), Ok(Route::Presence("a.b", false))));
        assert!(matches!(route(Method::Get, "/presence_stats/a.b"), Ok(Route::Presence("a.b", true))));
        assert_eq!(route(Method::Post, "/presence/a").err().map(|e| e.2), Some(Some("GET, HEAD")));
        for unknown in ["", "/", "/history/", "/history/a/b", "/nope", "/presence/", "/presence_stats/a/b"] {
            assert_eq!(route(Method::Get, unknown).err().map(|e| e.0), Some(StatusCode::NOT_FOUND), "{unknown}");
        }
    }

    #[test]
    fn history_body_keeps_data_verbatim() {
        let v = body_of(&history_body("c", &page(&[(3, r#"{"a":[1,2]}"#), (4, "7")]), true));
        assert_eq!(
            v,
            json!({"ch":"c","epoch":"e1","head":9,"oldest":3,"messages":[{"seq":3,"data":{"a":[1,2]}},{"seq":4,"data":7}]})
        );
    }

    #[test]
    fn unavailable_answers_carry_retry_after_and_what_was_done() {
        let e = RequestError::unavailable("redis down", 1500);
        let resp = unavailable(&e, json!({"closed": 2}), true);
        let head =
            String::from_utf8_lossy(&resp[..resp.windows(4).position(|w| w == b"\r\n\r\n").unwrap()]).into_owned();
        assert!(head.starts_with("HTTP/1.1 503") && head.contains("Retry-After: 2"), "{head}");
        assert_eq!(body_of(&resp), json!({"error":"redis down","code":"unavailable","retry_after_ms":1500,"closed":2}));
    }
}
