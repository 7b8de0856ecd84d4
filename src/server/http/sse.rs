//! `GET /sse?ch=a&ch=b[&from=b:EPOCH:SEQ]`: a Server-Sent Events stream of the named channels
//! (docs/protocol.md, "Server-Sent Events"). It is admitted by the same checks as a WebSocket
//! upgrade (drain, `Origin`, the JWT in `?token=` or `Authorization: Bearer`, the accept rate,
//! `max_connections`), then every channel is subscribed as a `sub` would be (with `from` and
//! `epoch` when the request carries a position for it), and the connection's session turns
//! into an SSE stream ([`Session::start_sse`](crate::session::Session::start_sse)).
//!
//! What is wrong with the request itself is refused before the stream starts, with a JSON
//! reason: 400 (no or bad channels, a bad position or `Last-Event-ID`, more channels than
//! `max_subscriptions`), 403 (a channel the token may not subscribe to), 405 (not `GET`),
//! 406 (an `Accept` that excludes `text/event-stream`). What the broker refuses later (a
//! resume point beyond the head, `limits.max_channels`) comes as `event: error` in the stream.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::http::{self, Method, Request, StatusCode};
use crate::server::conn::ConnId;
use crate::server::core::CoreState;
use crate::server::io as sock;
use crate::session::HandshakeFailure;
use crate::sse;

impl CoreState {
    /// Serves `GET /sse` on connection `id` (see the module doc).
    pub(super) fn sse(&mut self, id: ConnId, req: &Request) {
        if req.method != Method::Get {
            let allow = [("Allow", "GET")];
            return self.refuse_stream(
                id,
                HandshakeFailure::BadRequest,
                StatusCode::METHOD_NOT_ALLOWED,
                "use GET",
                &allow,
            );
        }
        if !sse::accepts_event_stream(req.accept.as_deref()) {
            let reason = "Accept must admit text/event-stream (or be absent)";
            return self.refuse_stream(id, HandshakeFailure::BadRequest, StatusCode::NOT_ACCEPTABLE, reason, &[]);
        }
        let max = self.shared.config.limits.per_connection.max_subscriptions;
        let subs = match sse::subscriptions(req.query.as_deref(), req.last_event_id.as_deref(), max) {
            Ok(subs) => subs,
            Err(reason) => {
                return self.refuse_stream(id, HandshakeFailure::BadRequest, StatusCode::BAD_REQUEST, &reason, &[]);
            }
        };
        let Some(verified) = self.admit_peer(id, req) else { return };
        if let Some(v) = &verified {
            if let Some((ch, _)) = subs.iter().find(|(ch, _)| !v.grant.may_subscribe(ch)) {
                let reason = format!("the token does not allow to subscribe to {ch}");
                return self.refuse_stream(id, HandshakeFailure::Unauthorized, StatusCode::FORBIDDEN, &reason, &[]);
            }
        }
        if !self.admit_capacity(id, req) {
            return;
        }
        self.metrics().sse_connections.fetch_add(1, Relaxed);
        let pending = self.with_session(id, |s, ctx| {
            s.start_sse(ctx, req.origin.as_deref(), &mut rand::rng());
            s.has_pending_input()
        });
        if let Some(v) = verified {
            self.grant_upgraded(id, v);
        }
        if let Some(fd) = self.conn(id).map(|c| c.fd) {
            // The heartbeat's bytes must be acknowledged within the pong timeout, as a ping
            // must be answered within it (`session/sse.rs`).
            sock::set_user_timeout(fd, Duration::from_millis(self.shared.config.heartbeat.pong_timeout_ms));
        }
        for (ch, pos) in subs {
            let (from, epoch) = pos.map_or((None, None), |p| (Some(p.seq), Some(p.epoch).filter(|e| !e.is_empty())));
            self.client_sub(id, &ch, from, epoch, false);
        }
        self.flush(id);
        // Bytes the client sent behind its request head end the stream.
        if pending == Some(true) {
            self.on_bytes(id, &[]);
        }
    }

    /// Refuses a `GET /sse` request before its stream starts: `status` with the JSON body
    /// `{"error":REASON}` and `extra` headers, the connection closed after it; counted and
    /// logged as a handshake failure `why`.
    fn refuse_stream(
        &mut self,
        id: ConnId,
        why: HandshakeFailure,
        status: StatusCode,
        reason: &str,
        extra: &[(&str, &str)],
    ) {
        self.metrics().session.handshake_failure(why);
        let fd = self.conn(id).map(|c| c.fd);
        crate::server::events::handshake_failed(self.me, fd, why, Some(status), reason);
        self.send(id, http::error_response(status, reason, extra, false), false);
    }
}
