//! Plain HTTP on the WebSocket port: the upgrade itself (`GET /ws`, `GET /echo`) and the API
//! (`POST /publish/{channel}`, `/healthz`, `/readyz`, `/metrics`). HTTP/1.1 keep-alive and
//! pipelining are honoured; an upgraded connection leaves this module for good.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;

use super::bus::{HttpWait, PublishResult};
use super::conn::on_ws_bytes;
use super::conn_state::*;
use super::core::CoreState;
use super::metrics::{self, HandshakeFailure};
use super::tick::first_ping;
use crate::http;
use crate::protocol;
use crate::ws::handshake::{self, HttpError, Method, Request};

/// `Retry-After` (seconds) sent with 503 answers to upgrades refused for capacity or rate.
const RETRY_AFTER_S: &str = "1";

/// Bytes arrived on a connection still speaking HTTP.
pub fn on_bytes(st: &mut CoreState, id: ConnId, data: &[u8]) {
    if let Some(c) = st.conn(id) {
        c.pending_in.extend_from_slice(data);
    }
    serve_pending(st, id);
}

/// The home core answered an HTTP publish.
pub fn on_reply(st: &mut CoreState, id: ConnId) {
    let Some(c) = st.conn(id) else { return };
    c.flags &= !(REPLY_READY | AWAITING);
    let keep_alive = c.flags & KEEP_ALIVE != 0;
    let resp = match c.reply.take().map(|b| *b) {
        Some(HttpWait::Publish(PublishResult::Stored { seq })) => {
            http::response(200, "application/json", &protocol::seq_json(seq), &[], keep_alive)
        }
        Some(HttpWait::Publish(PublishResult::Refused(e))) => http::error_response(409, &e.reason, &[], keep_alive),
        Some(HttpWait::Inspect { rows, .. }) => {
            let body = serde_json::to_vec(&serde_json::json!({ "connections": rows })).unwrap_or_default();
            http::response(200, "application/json", &body, &[], keep_alive)
        }
        None => return,
    };
    send(st, id, resp, keep_alive);
    serve_pending(st, id);
}

/// Answers pipelined requests held back while earlier answers waited for the socket.
pub fn resume(st: &mut CoreState, id: ConnId) {
    if st.conn(id).is_some_and(|c| c.phase == Phase::Http && c.flags & WANT_WRITE == 0) {
        serve_pending(st, id);
    }
}

/// Parses and answers every complete request held by the connection, in order, until an
/// answer has to wait for the socket (then the rest waits too: see [`resume`]).
fn serve_pending(st: &mut CoreState, id: ConnId) {
    let limits = st.shared.config.limits.clone();
    loop {
        let Some(c) = st.conn(id) else { return };
        let blocked = c.flags & WANT_WRITE != 0;
        if blocked || c.flags & (AWAITING | KILL) != 0 || c.phase != Phase::Http || c.pending_in.is_empty() {
            if c.pending_in.is_empty() && c.pending_in.capacity() > 0 {
                c.pending_in = Vec::new();
            }
            return;
        }
        let req = match handshake::parse_request(&c.pending_in, limits.max_header_bytes) {
            Ok(None) => return,
            Ok(Some(r)) => r,
            Err(e) => {
                let why = if e.status == 431 { HandshakeFailure::HeadTooLarge } else { HandshakeFailure::BadRequest };
                return reject(st, id, e, why, &[]);
            }
        };
        let expect = http::expectation(&req);
        if let http::Expectation::Failed(e) = expect {
            return reject(st, id, e, HandshakeFailure::BadRequest, &[]);
        }
        let body_area = &c.pending_in[req.head_len..];
        let (body, consumed) = if req.chunked {
            match http::decode_chunked(body_area, limits.max_publish_bytes) {
                Ok(None) => return send_continue(st, id, expect),
                Ok(Some((b, n))) => (b, req.head_len + n),
                Err(e) => return reject(st, id, e, HandshakeFailure::BadRequest, &[]),
            }
        } else {
            let len = req.content_length.unwrap_or(0);
            if len > limits.max_publish_bytes {
                return reject(st, id, HttpError::new(413, "request body larger than limits.max_publish_bytes"), HandshakeFailure::BadRequest, &[]);
            }
            if body_area.len() < len {
                return send_continue(st, id, expect);
            }
            (body_area[..len].to_vec(), req.head_len + len)
        };
        c.pending_in.drain(..consumed);
        c.flags &= !CONTINUED;
        c.flags |= if req.method == Method::Head { HEAD_ONLY } else { 0 };
        route(st, id, &req, &body);
    }
}

/// RFC 9110 §10.1.1: the client waits for `100 Continue` before sending the content; sent
/// once per request, and only when the content has not all arrived yet.
fn send_continue(st: &mut CoreState, id: ConnId, expect: http::Expectation) {
    let Some(c) = st.conn(id) else { return };
    if expect == http::Expectation::Continue && c.flags & CONTINUED == 0 {
        c.flags |= CONTINUED;
        c.push(Bytes::from_static(http::CONTINUE), NO_CHAN);
        st.flush(id);
    }
}

fn route(st: &mut CoreState, id: ConnId, req: &Request, body: &[u8]) {
    let keep_alive = req.keep_alive;
    let path = req.path.as_str();
    if req.method == Method::Other {
        // RFC 9110 §9.1: a method the server does not implement at all gets 501.
        return send(st, id, http::error_response(501, "method not implemented: use GET, HEAD or POST", &[], keep_alive), keep_alive);
    }
    if path == "/ws" || (path == "/echo" && st.shared.echo) {
        return upgrade(st, id, req, path == "/echo");
    }
    if let Some(ch) = path.strip_prefix("/publish/") {
        if req.method != Method::Post {
            return send(st, id, http::error_response(405, "use POST", &[("Allow", "POST")], keep_alive), keep_alive);
        }
        return publish(st, id, req, ch, body);
    }
    let draining = st.shared.drain_code.load(Relaxed) != 0;
    let resp = match (req.method, path) {
        (Method::Get | Method::Head, "/healthz") => http::response(200, "application/json", b"{\"status\":\"ok\"}", &[], keep_alive),
        (Method::Get | Method::Head, "/readyz") if draining => {
            http::response(503, "application/json", b"{\"status\":\"draining\"}", &[], keep_alive)
        }
        (Method::Get | Method::Head, "/readyz") => http::response(200, "application/json", b"{\"status\":\"ready\"}", &[], keep_alive),
        (Method::Get | Method::Head, "/metrics") => {
            let text = metrics::render(&st.shared.metrics, draining);
            http::response(200, "text/plain; version=0.0.4", text.as_bytes(), &[], keep_alive)
        }
        (Method::Get | Method::Head, "/connections") => {
            let top = req.query.as_deref().and_then(|q| http::query_param(q, "top")).and_then(|t| t.parse().ok()).unwrap_or(10usize);
            if let Some(c) = st.conn(id) {
                if keep_alive {
                    c.flags |= KEEP_ALIVE;
                } else {
                    c.flags &= !KEEP_ALIVE;
                }
            }
            return st.start_inspect(id, top.min(10_000));
        }
        (_, "/healthz" | "/readyz" | "/metrics" | "/connections") => {
            http::error_response(405, "use GET or HEAD", &[("Allow", "GET, HEAD")], keep_alive)
        }
        _ => http::error_response(404, "no such endpoint", &[], keep_alive),
    };
    send(st, id, resp, keep_alive);
}

/// `POST /publish/{channel}`: body = the JSON value that becomes `data`.
fn publish(st: &mut CoreState, id: ConnId, req: &Request, ch: &str, body: &[u8]) {
    let keep_alive = req.keep_alive;
    let bad = |reason: &str| http::error_response(400, reason, &[], keep_alive);
    let Some(ch) = http::percent_decode(ch).filter(|c| protocol::valid_channel(c)) else {
        return send(st, id, bad("invalid channel name: 1-128 bytes of [A-Za-z0-9._:-]"), keep_alive);
    };
    let data = match protocol::parse_publish_body(body) {
        Ok(d) => d,
        Err(e) => return send(st, id, bad(&e.reason), keep_alive),
    };
    let key = req.idempotency_key.as_deref();
    if key.is_some_and(|k| !protocol::valid_message_id(k)) {
        return send(st, id, bad("Idempotency-Key must be 1-128 bytes"), keep_alive);
    }
    if let Some(c) = st.conn(id) {
        c.flags |= AWAITING;
        if keep_alive {
            c.flags |= KEEP_ALIVE;
        } else {
            c.flags &= !KEEP_ALIVE;
        }
    }
    let data = Bytes::copy_from_slice(data.get().as_bytes());
    st.client_pub(id, &ch, key.map(Into::into), data);
}

/// RFC 6455 §4.2: validate, admit, answer 101 and switch the connection to WebSocket.
fn upgrade(st: &mut CoreState, id: ConnId, req: &Request, echo: bool) {
    let accept = match handshake::check_upgrade(req) {
        Ok(a) => a,
        Err(e) => {
            let why = if e.status == 426 { HandshakeFailure::Version } else { HandshakeFailure::BadRequest };
            return reject(st, id, e, why, &[]);
        }
    };
    let shared = st.shared.clone();
    let retry = [("Retry-After", RETRY_AFTER_S)];
    if shared.drain_code.load(Relaxed) != 0 {
        return reject(st, id, HttpError::new(503, "server is draining"), HandshakeFailure::Draining, &retry);
    }
    if !shared.config.allowed_origins.is_empty() && !req.origin.as_ref().is_some_and(|o| shared.config.allowed_origins.contains(o)) {
        return reject(st, id, HttpError::new(403, "origin not allowed"), HandshakeFailure::Origin, &[]);
    }
    if !st.take_accept_token() {
        return reject(st, id, HttpError::new(503, "accept_rate exceeded"), HandshakeFailure::RateLimited, &retry);
    }
    if shared.open.fetch_add(1, Relaxed) >= shared.config.max_connections {
        shared.open.fetch_sub(1, Relaxed);
        return reject(st, id, HttpError::new(503, "max_connections reached"), HandshakeFailure::OverCapacity, &retry);
    }
    let m = st.metrics();
    m.upgraded.fetch_add(1, Relaxed);
    m.connections.fetch_add(1, Relaxed);
    let Some(c) = st.conn(id) else { return };
    c.phase = Phase::Open;
    c.flags |= UPGRADED | if echo { ECHO } else { 0 };
    c.push(Bytes::from(handshake::switching_protocols(&accept)), NO_CHAN);
    first_ping(st, id);
    st.flush(id);
    // Frames the client sent right behind its request head.
    if st.conn(id).is_some_and(|c| !c.pending_in.is_empty()) {
        on_ws_bytes(st, id, &[]);
    }
}

/// Answers a refused request and closes the connection once the answer is written.
fn reject(st: &mut CoreState, id: ConnId, e: HttpError, why: HandshakeFailure, extra: &[(&str, &str)]) {
    st.metrics().handshake_failure(why);
    super::events::handshake_failed(st.me, st.conn(id).map(|c| c.fd), why, e.status, e.reason);
    let resp = http::handshake_rejection(e, extra);
    if let Some(c) = st.conn(id) {
        c.pending_in = Vec::new();
    }
    send(st, id, resp, false);
}

/// Queues one response; without keep-alive the connection closes after it. Keep-alive
/// connections stay open during a drain, so probes and scrapers that hold one see `/readyz`
/// turn 503 and the drain progress in `/metrics` until the process exits.
fn send(st: &mut CoreState, id: ConnId, resp: Vec<u8>, keep_alive: bool) {
    let idle = st.now_tick() + CoreState::ticks(st.shared.config.limits.handshake_timeout_ms);
    st.metrics().http_requests.fetch_add(1, Relaxed);
    let Some(c) = st.conn(id) else { return };
    let resp = if c.flags & HEAD_ONLY != 0 { http::head_only(resp) } else { resp };
    c.flags &= !HEAD_ONLY;
    c.push(Bytes::from(resp), NO_CHAN);
    c.flags |= HTTP_SERVED;
    if !keep_alive {
        c.phase = Phase::Flushing;
    }
    st.schedule(id, idle);
    st.flush(id);
}
