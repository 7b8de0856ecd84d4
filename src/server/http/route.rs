//! Plain HTTP on the WebSocket port: the upgrade itself (`GET /ws`, `GET /echo`; an SSE stream,
//! `GET /sse`, is [`super::sse`]'s, admitted by the same checks) and the API
//! (`POST /publish/{channel}`, `/healthz`, `/readyz`, `/metrics`, `/connections`; the status
//! page is [`super::status`], `/feeds` is [`super::feeds`], `/api/` is [`super::api`]). HTTP/1.1 keep-alive and
//! pipelining are honoured; an upgraded connection leaves this module for good.
//! The session parses requests ([`Session::next_request`](crate::session::Session::next_request));
//! this module routes them and answers.

use crate::http::StatusCode;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;

use super::auth::{self, Guarded, Refusal};
use super::inspect::Gather;
use super::status;
use crate::http;
use crate::http::{HttpError, Method, Request};
use crate::protocol;
use crate::server::broker::PublishResult;
use crate::server::bus::ConnRow;
use crate::server::conn::{ConnId, IoFlags};
use crate::server::core::CoreState;
use crate::server::metrics;
use crate::session::{HandshakeFailure, State};
use crate::ws::{deflate, handshake};

/// `Retry-After` (seconds) sent with 503 answers to upgrades refused for capacity or rate.
const RETRY_AFTER_S: &str = "1";

impl CoreState {
    /// Answers every complete request the connection holds, in order, until one has to wait (for
    /// the socket or for another core; it resumes when that answer is written).
    pub fn serve_pending(&mut self, id: ConnId) {
        loop {
            let cfg = &self.clock.cfg;
            let Some(c) = self.conns.get(id) else { return };
            if c.io.has(IoFlags::WANT_WRITE) {
                // The last answer waits for the socket: the next request waits for it.
                return;
            }
            let next = c.session.next_request(cfg);
            match next {
                None => return,
                Some(Ok((req, body))) => self.route(id, &req, &body),
                Some(Err(e)) if e.status == StatusCode::PAYLOAD_TOO_LARGE => {
                    // Name the limit and its value, so the sender knows what to change.
                    let max = cfg.max_publish_bytes;
                    self.metrics().session.handshake_failure(HandshakeFailure::BadRequest);
                    let fd = self.conn(id).map(|c| c.fd);
                    crate::server::events::handshake_failed(
                        self.me,
                        fd,
                        HandshakeFailure::BadRequest,
                        Some(StatusCode::PAYLOAD_TOO_LARGE),
                        e.reason,
                    );
                    let reason = format!("request body larger than limits.max_publish_bytes = {max} bytes");
                    return self.send(
                        id,
                        http::error_response(StatusCode::PAYLOAD_TOO_LARGE, &reason, &[], false),
                        false,
                    );
                }
                Some(Err(e)) => {
                    let why = match e.status {
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => HandshakeFailure::HeadTooLarge,
                        _ => HandshakeFailure::BadRequest,
                    };
                    return self.reject(id, e, why, &[]);
                }
            }
        }
    }

    /// Answers pipelined requests held back while earlier answers waited for the socket.
    pub fn resume_http(&mut self, id: ConnId) {
        if self.session(id).is_some_and(|s| matches!(s.state(), State::Http(_))) {
            self.serve_pending(id);
        }
    }

    /// The broker answered the HTTP publish of `id`.
    pub fn answer_publish(&mut self, id: ConnId, result: PublishResult, keep_alive: bool) {
        let resp = match result {
            PublishResult::Stored { seq } => {
                http::response(StatusCode::OK, "application/json", &protocol::seq_json(seq), &[], keep_alive)
            }
            // Sent to Redis and not answered in time: perhaps stored (docs/redis.md). 504,
            // RFC 9110 §15.6.5: the upstream did not answer in time.
            PublishResult::Refused(e) if e.code == protocol::codes::UNKNOWN_OUTCOME => {
                let secs = e.retry_after_ms.unwrap_or(1000).div_ceil(1000).max(1).to_string();
                let mut body = Vec::with_capacity(e.reason.len() + 40);
                body.extend_from_slice(b"{\"error\":");
                protocol::push_json_str(&mut body, &e.reason);
                body.extend_from_slice(b",\"outcome\":\"unknown\"}");
                http::response(
                    StatusCode::GATEWAY_TIMEOUT,
                    "application/json",
                    &body,
                    &[("Retry-After", &secs)],
                    keep_alive,
                )
            }
            PublishResult::Refused(e) => match e.retry_after_ms {
                // The broker cannot store it now (Redis unreachable), or `limits.max_channels`
                // channels exist and this one would be new: the server, not this client, is
                // at capacity (so 503, RFC 9110 §15.6.4, not 429, RFC 6585 §4, which says the
                // client sent too many requests). docs/security.md.
                Some(ms) => {
                    let secs = ms.div_ceil(1000).max(1).to_string();
                    http::error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &e.reason,
                        &[("Retry-After", &secs)],
                        keep_alive,
                    )
                }
                None => http::error_response(StatusCode::CONFLICT, &e.reason, &[], keep_alive),
            },
        };
        self.send(id, resp, keep_alive);
        self.serve_pending(id);
    }

    /// Every core answered the `GET /connections` of `id`.
    pub fn answer_inspect(&mut self, id: ConnId, rows: Vec<ConnRow>) {
        let Some(keep_alive) = self.session(id).and_then(|s| s.awaiting()) else { return };
        let body = serde_json::to_vec(&serde_json::json!({ "connections": rows })).unwrap_or_default();
        self.send(id, http::response(StatusCode::OK, "application/json", &body, &[], keep_alive), keep_alive);
        self.serve_pending(id);
    }

    fn route(&mut self, id: ConnId, req: &Request, body: &[u8]) {
        let keep_alive = req.keep_alive;
        let path = req.path.as_str();
        if req.method == Method::Other {
            // RFC 9110 §9.1: a method the server does not implement at all gets 501.
            let resp = http::error_response(
                StatusCode::NOT_IMPLEMENTED,
                "method not implemented: use GET, HEAD, POST, PUT or DELETE",
                &[],
                keep_alive,
            );
            return self.send(id, resp, keep_alive);
        }
        if path == "/ws" || (path == "/echo" && self.shared.echo) {
            return self.upgrade(id, req, path == "/echo");
        }
        if path == "/sse" {
            return self.sse(id, req);
        }
        if let Some(ch) = path.strip_prefix("/publish/") {
            if req.method != Method::Post {
                return self.send(
                    id,
                    http::error_response(StatusCode::METHOD_NOT_ALLOWED, "use POST", &[("Allow", "POST")], keep_alive),
                    keep_alive,
                );
            }
            if let Err(r) = auth::check_publish(&self.shared.config, req) {
                return self.refuse_auth(id, Guarded::Publish, r, keep_alive);
            }
            return self.http_publish(id, req, ch, body);
        }
        if let Some(what) = status::Resource::at(path) {
            return self.serve_status(id, req, what);
        }
        if path == "/feeds" || path.starts_with("/feeds/") {
            return self.feeds_api(id, req, body);
        }
        if path == "/api" || path.starts_with("/api/") {
            return self.api(id, req, body);
        }
        let admin_only = path == "/connections" || (path == "/metrics" && self.shared.config.admin.protect_metrics);
        if admin_only {
            if let Err(r) = self.check_admin(id, req) {
                return self.refuse_auth(id, Guarded::Admin, r, keep_alive);
            }
        }
        let draining = self.shared.draining();
        let resp = match (req.method, path) {
            (Method::Get | Method::Head, "/healthz") => {
                http::response(StatusCode::OK, "application/json", b"{\"status\":\"ok\"}", &[], keep_alive)
            }
            (Method::Get | Method::Head, "/readyz") if draining => http::response(
                StatusCode::SERVICE_UNAVAILABLE,
                "application/json",
                b"{\"status\":\"draining\"}",
                &[],
                keep_alive,
            ),
            (Method::Get | Method::Head, "/readyz") if !self.shared.broker.ready() => http::response(
                StatusCode::SERVICE_UNAVAILABLE,
                "application/json",
                b"{\"status\":\"broker_down\"}",
                &[],
                keep_alive,
            ),
            (Method::Get | Method::Head, "/readyz") => {
                http::response(StatusCode::OK, "application/json", b"{\"status\":\"ready\"}", &[], keep_alive)
            }
            (Method::Get | Method::Head, "/metrics") => {
                let mut text = metrics::render(&self.shared.metrics, draining);
                metrics::render_channels(&mut text, self.shared.channels.count());
                crate::server::tls::render(&mut text, &self.shared.metrics, self.shared.tls.as_deref());
                self.shared.broker.render_into(&mut text, self.shared.config.broker.kind.as_str());
                self.shared.feeds.render_into(&mut text, crate::feeds::runtime::now_ms());
                http::response(StatusCode::OK, "text/plain; version=0.0.4", text.as_bytes(), &[], keep_alive)
            }
            (Method::Get | Method::Head, "/connections") => {
                if let Some(s) = self.session(id) {
                    s.await_answer(keep_alive);
                }
                return self.start_inspect(id, super::inspect::top_of(req), Gather::Connections);
            }
            (_, "/healthz" | "/readyz" | "/metrics" | "/connections") => http::error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "use GET or HEAD",
                &[("Allow", "GET, HEAD")],
                keep_alive,
            ),
            _ => http::error_response(StatusCode::NOT_FOUND, "no such endpoint", &[], keep_alive),
        };
        self.send(id, resp, keep_alive);
    }

    /// [`auth::check_admin`] for a request on connection `id`, with the connection's two
    /// addresses.
    pub(super) fn check_admin(&mut self, id: ConnId, req: &Request) -> Result<(), Refusal> {
        let c = self.conn(id);
        let ends = auth::Ends {
            peer: c.as_ref().and_then(|c| c.peer()).map(|a| a.ip()),
            local: c.and_then(|c| c.local()).map(|a| a.ip()),
        };
        auth::check_admin(&self.shared.config, req, ends)
    }

    /// Answers a request refused by a guard with the refusal's status (401 with
    /// `WWW-Authenticate`, 403 or 421). The connection stays open when the request asked for
    /// keep-alive: a client may retry with the right token.
    pub(super) fn refuse_auth(&mut self, id: ConnId, what: Guarded, r: Refusal, keep_alive: bool) {
        self.metrics().http_auth_failures[what as usize].fetch_add(1, Relaxed);
        let fd = self.conn(id).map(|c| c.fd);
        crate::server::events::http_auth_failed(self.me, fd, auth::GUARDED_NAMES[what as usize], r.reason);
        let challenge = [("WWW-Authenticate", r.challenge)];
        let headers: &[(&str, &str)] = if r.status == StatusCode::UNAUTHORIZED { &challenge } else { &[] };
        let resp = http::error_response(r.status, r.reason, headers, keep_alive);
        self.send(id, resp, keep_alive);
    }

    /// `POST /publish/{channel}`: body = the JSON value that becomes `data`. A bad channel,
    /// body or `Idempotency-Key` is answered 400 with the reason (and logged, channel escaped).
    fn http_publish(&mut self, id: ConnId, req: &Request, raw_ch: &str, body: &[u8]) {
        let keep_alive = req.keep_alive;
        let decoded = http::percent_decode(raw_ch);
        let key = req.idempotency_key.as_deref();
        let checked = match decoded.as_deref().filter(|c| protocol::valid_channel(c)) {
            None => {
                let sent = decoded.as_deref().unwrap_or(raw_ch);
                let name = crate::logging::Escaped(sent.as_bytes());
                Err(format!("invalid channel name \"{name}\" (after percent-decoding): 1-128 bytes of [A-Za-z0-9._:-]")
                    .into())
            }
            Some(ch) => match protocol::parse_publish_body(body) {
                Err(e) => Err(std::borrow::Cow::Owned(e.reason)),
                Ok(_) if key.is_some_and(|k| !protocol::valid_message_id(k)) => {
                    Err("Idempotency-Key must be 1-128 bytes".into())
                }
                Ok(data) => Ok((ch, data)),
            },
        };
        let (ch, data) = match checked {
            Ok(ok) => ok,
            Err(reason) => {
                let sent = decoded.as_deref().unwrap_or(raw_ch);
                crate::server::events::publish_refused(self.me, self.conn(id).map(|c| c.fd), &reason, sent.as_bytes());
                return self.send(
                    id,
                    http::error_response(StatusCode::BAD_REQUEST, &reason, &[], keep_alive),
                    keep_alive,
                );
            }
        };
        if let Some(s) = self.session(id) {
            s.await_answer(keep_alive);
        }
        let data = Bytes::copy_from_slice(data.get().as_bytes());
        self.publish(id, ch, key.map(Into::into), data);
    }

    /// RFC 6455 §4.2: validate, admit (draining, `Origin`, the JWT when `[auth]` is on, the
    /// accept rate, `max_connections`), answer 101 and switch the connection to WebSocket.
    fn upgrade(&mut self, id: ConnId, req: &Request, echo: bool) {
        let accept = match handshake::check_upgrade(req) {
            Ok(a) => a,
            Err(e) => {
                let why = if e.status == StatusCode::UPGRADE_REQUIRED {
                    HandshakeFailure::Version
                } else {
                    HandshakeFailure::BadRequest
                };
                return self.refuse(id, req, e, why, &[]);
            }
        };
        let Some(verified) = self.admit_peer(id, req) else { return };
        if !self.admit_capacity(id, req) {
            return;
        }
        // RFC 7692 §5: the first acceptable permessage-deflate offer, or none (declined: the
        // connection goes on uncompressed, never refused for its offers).
        let deflate = match &req.ws_extensions {
            Some(offers) if self.clock.deflate.enabled() => deflate::negotiate(offers),
            _ => None,
        };
        let pending = self.with_session(id, |s, ctx| {
            let response = handshake::switching_protocols(&accept, deflate.as_ref().map(|a| a.response.as_str()));
            s.upgrade(ctx, response, echo, deflate.is_some(), &mut rand::rng());
            s.has_pending_input()
        });
        if let Some(v) = verified {
            self.grant_upgraded(id, v);
        }
        self.flush(id);
        // Frames the client sent right behind its request head.
        if pending == Some(true) {
            self.on_bytes(id, &[]);
        }
    }

    /// The admission of a long-lived connection (a WebSocket upgrade or an SSE stream) that
    /// depends on who asks: not while draining (503), `Origin` in `allowed_origins` (403), the
    /// JWT when `[auth]` is on (401, or 400 when ambiguous). `Some` with the verified token
    /// (`None` inside without auth) when admitted; `None` when refused (answered here).
    pub(super) fn admit_peer(&mut self, id: ConnId, req: &Request) -> Option<Option<crate::auth::Verified>> {
        if self.shared.draining() {
            let e = HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "server is draining");
            self.refuse(id, req, e, HandshakeFailure::Draining, &[("Retry-After", RETRY_AFTER_S)]);
            return None;
        }
        if !self.shared.config.origin_allowed(req.origin.as_deref()) {
            let e = HttpError::new(StatusCode::FORBIDDEN, "origin not allowed");
            self.refuse(id, req, e, HandshakeFailure::Origin, &[]);
            return None;
        }
        match self.verify_upgrade(req) {
            Ok(v) => Some(v),
            Err(crate::auth::AuthError::Ambiguous) => {
                let e = HttpError::new(StatusCode::BAD_REQUEST, crate::auth::AuthError::Ambiguous.reason());
                self.reject(id, e, HandshakeFailure::BadRequest, &[]);
                None
            }
            Err(e) => {
                let challenge = [("WWW-Authenticate", crate::server::authorize::www_authenticate(e))];
                let e = HttpError::new(StatusCode::UNAUTHORIZED, e.reason());
                self.reject(id, e, HandshakeFailure::Unauthorized, &challenge);
                None
            }
        }
    }

    /// The admission of a long-lived connection that depends on the server's load: the
    /// accept rate and `max_connections` (503 with `Retry-After`). When admitted the connection
    /// is counted (the gauge, `open`, the upgrades) and `true` is returned.
    pub(super) fn admit_capacity(&mut self, id: ConnId, req: &Request) -> bool {
        let retry = [("Retry-After", RETRY_AFTER_S)];
        // A TLS connection took its token when accepted: its handshake counted against the rate.
        // Only a TLS connection has an entry in the side table: the flag spares a plain
        // upgrade the lookup.
        let tls = self.conn(id).is_some_and(|c| c.io.has(IoFlags::TLS));
        let rated = tls && self.tls.get(id.key).is_some_and(|t| t.has(crate::server::tls::TlsConn::RATED));
        if !rated && !self.take_accept_token() {
            let e = HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "accept_rate exceeded");
            self.refuse(id, req, e, HandshakeFailure::RateLimited, &retry);
            return false;
        }
        if self.shared.open.fetch_add(1, Relaxed) >= self.shared.config.max_connections {
            self.shared.open.fetch_sub(1, Relaxed);
            let e = HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "max_connections reached");
            self.refuse(id, req, e, HandshakeFailure::OverCapacity, &retry);
            return false;
        }
        let m = self.metrics();
        m.upgraded.fetch_add(1, Relaxed);
        m.connections.fetch_add(1, Relaxed);
        true
    }

    /// Answers a refused request and closes the connection once the answer is written.
    fn reject(&mut self, id: ConnId, e: HttpError, why: HandshakeFailure, extra: &[(&str, &str)]) {
        self.metrics().session.handshake_failure(why);
        crate::server::events::handshake_failed(self.me, self.conn(id).map(|c| c.fd), why, Some(e.status), e.reason);
        self.send(id, http::handshake_rejection(e, extra), false);
    }

    /// [`Self::reject`] for a request whose head was read: the log line also names its
    /// target and `Origin` (escaped).
    pub(super) fn refuse(
        &mut self,
        id: ConnId,
        req: &Request,
        e: HttpError,
        why: HandshakeFailure,
        extra: &[(&str, &str)],
    ) {
        self.metrics().session.handshake_failure(why);
        crate::server::events::handshake_failed_for(self.me, self.conn(id).map(|c| c.fd), why, e.status, e.reason, req);
        self.send(id, http::handshake_rejection(e, extra), false);
    }

    /// Queues one response; without keep-alive the connection closes after it. Keep-alive
    /// connections stay open during a drain, so probes and scrapers that hold one see `/readyz`
    /// turn 503 and the drain progress in `/metrics` until the process exits.
    pub(super) fn send(&mut self, id: ConnId, resp: Vec<u8>, keep_alive: bool) {
        self.metrics().http_requests.fetch_add(1, Relaxed);
        self.with_session(id, |s, ctx| s.respond(ctx, resp, keep_alive));
        self.flush(id);
    }
}
