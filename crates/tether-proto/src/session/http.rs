//! The session's plain HTTP side: taking complete requests out of the input (head, content,
//! `Expect: 100-continue`), answering them, and the upgrade to WebSocket.

use crate::http::StatusCode;
use bytes::Bytes;
use rand::Rng;

use super::{Ctx, Flags, Session, SessionConfig, State, NO_CHAN};
use crate::http::{self, HttpError, Request};

impl Session {
    /// The next complete HTTP request held in the input (head and body), in order; `None`
    /// while it is incomplete, or while an earlier answer waits (for the socket or another
    /// core). An `Err` is a request to refuse (400, 413, 417, 431 …) and close after.
    ///
    /// A request with `Expect: 100-continue` whose content has not all arrived gets
    /// `100 Continue` queued right after its head (RFC 9110 §10.1.1), once.
    pub fn next_request(&mut self, cfg: &SessionConfig) -> Option<Result<(Request, Vec<u8>), HttpError>> {
        let State::Http(phase) = self.state else { return None };
        if phase.awaiting || self.pending_in.is_empty() {
            return None;
        }
        let req = match http::parse_request(self.pending_in.as_slice(), cfg.max_header_bytes) {
            Ok(None) => return None,
            Ok(Some(r)) => r,
            Err(e) => return Some(Err(e)),
        };
        let expect = crate::http::expectation(&req);
        if let crate::http::Expectation::Failed(e) = expect {
            return Some(Err(e));
        }
        let body_area = &self.pending_in.as_slice()[req.head_len..];
        let (body, consumed) = if req.chunked {
            match crate::http::decode_chunked(body_area, cfg.max_publish_bytes) {
                Ok(None) => return self.send_continue(expect),
                Ok(Some((b, n))) => (b, req.head_len + n),
                Err(e) => return Some(Err(e)),
            }
        } else {
            let len = req.content_length.unwrap_or(0);
            if len > cfg.max_publish_bytes {
                return Some(Err(HttpError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body larger than limits.max_publish_bytes",
                )));
            }
            if body_area.len() < len {
                return self.send_continue(expect);
            }
            (body_area[..len].to_vec(), req.head_len + len)
        };
        self.pending_in.consume(consumed);
        if let State::Http(p) = &mut self.state {
            p.continued = false;
            p.head = req.method == http::Method::Head;
        }
        Some(Ok((req, body)))
    }

    /// Queues `100 Continue` for a request that expects it, once; the request stays
    /// incomplete (`None`).
    fn send_continue<T>(&mut self, expect: crate::http::Expectation) -> Option<T> {
        if let State::Http(p) = &mut self.state {
            if expect == crate::http::Expectation::Continue && !p.continued {
                p.continued = true;
                self.queue.push(Bytes::from_static(crate::http::CONTINUE), NO_CHAN);
            }
        }
        None
    }

    /// The answer to the current request waits for another core; `keep_alive` as requested.
    pub fn await_answer(&mut self, keep_alive: bool) {
        if let State::Http(p) = &mut self.state {
            p.awaiting = true;
            p.keep_alive = keep_alive;
        }
    }

    /// Whether the current request waits for another core's answer, and its keep-alive.
    pub fn awaiting(&self) -> Option<bool> {
        match self.state {
            State::Http(p) if p.awaiting => Some(p.keep_alive),
            _ => None,
        }
    }

    /// Queues an HTTP response. Without keep-alive the connection finishes after it (and the
    /// input still held is dropped); with it, the idle deadline restarts. HTTP answers are not
    /// bounded by the queue limits: the I/O owner stops reading while they wait for the socket.
    pub fn respond(&mut self, ctx: &Ctx, resp: Vec<u8>, keep_alive: bool) {
        let State::Http(p) = &mut self.state else { return };
        p.served = true;
        let resp = if std::mem::take(&mut p.head) { crate::http::head_only(resp) } else { resp };
        if std::mem::take(&mut p.awaiting) {
            // The I/O owner stopped reading while the answer was awaited: resume it.
            self.wake();
        }
        self.queue.push(Bytes::from(resp), NO_CHAN);
        if keep_alive {
            self.deadline = ctx.now.wrapping_add(ctx.cfg.handshake_timeout);
        } else {
            self.pending_in.clear();
            self.finish(ctx);
        }
    }

    /// RFC 6455 §4.2.2: queues the 101 `response`, becomes a WebSocket connection (an `/echo`
    /// one with `echo`; one that negotiated permessage-deflate, RFC 7692, with `deflate`) and
    /// schedules its first heartbeat. Frames the client sent right behind its request head stay
    /// in the input: feed them with `handle_bytes(ctx, &[], …)`.
    pub fn upgrade(&mut self, ctx: &Ctx, response: Vec<u8>, echo: bool, deflate: bool, rng: &mut impl Rng) {
        self.state = State::Open;
        self.flags.set(Flags::UPGRADED);
        if echo {
            self.flags.set(Flags::ECHO);
        }
        if deflate {
            self.flags.set(Flags::DEFLATE);
            ctx.stats.deflate_connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.queue.push(Bytes::from(response), NO_CHAN);
        self.first_ping(ctx, rng);
    }

    /// Whether input is held that the session has not consumed yet.
    pub fn has_pending_input(&self) -> bool {
        !self.pending_in.is_empty()
    }
}
