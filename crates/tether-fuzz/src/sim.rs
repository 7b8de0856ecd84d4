//! A session driven without sockets, the way a core drives it (`server::core`,
//! `server::http::route`): bytes in, requests taken out and answered, the upgrade, and a socket
//! that writes everything at once.

use std::io::IoSlice;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{MAX_BODY_BYTES, MAX_HEAD_BYTES, MAX_MESSAGE_BYTES};
use tether_proto::http::{HttpError, Method, Request};
use tether_proto::session::{queue, Ctx, Event, Events, Inbound, Session, SessionConfig, SessionStats, State};
use tether_proto::ws::deflate::Deflate;
use tether_proto::ws::handshake;

/// What happened on one simulated connection, in order. Equal for every split of the same
/// input: that is the split invariant of the session targets.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Transcript {
    /// Requests, refusals and the upgrade, each as its debug text.
    pub(super) events: Vec<String>,
    /// Every byte the session wrote, `100 Continue` interim responses left out (whether one is
    /// sent depends on whether the body had arrived with the head: on the split).
    pub(super) output: Vec<u8>,
    /// The end state and why the connection ended, if it did.
    pub(super) end: String,
}

/// One core's limits and counters for one session, at a fixed tick.
pub(super) struct Sim {
    cfg: SessionConfig,
    stats: SessionStats,
    deflate: Deflate,
    rng: StdRng,
}

impl Sim {
    pub(super) fn new() -> Sim {
        let cfg = SessionConfig {
            ping_interval: 1000,
            pong_timeout: 1000,
            close_timeout: 500,
            handshake_timeout: 500,
            // Roomy queue limits: overflow is not a parser outcome, and a socket that writes
            // everything at once never lets the queue grow anyway.
            queue_max_bytes: 1 << 30,
            queue_max_messages: 1 << 20,
            max_message_bytes: MAX_MESSAGE_BYTES,
            max_header_bytes: MAX_HEAD_BYTES,
            max_publish_bytes: MAX_BODY_BYTES,
            // No rate limits and no auth: limits and tokens are not parser outcomes.
            rates: Default::default(),
            token_refresh_grace: 0,
        };
        Sim { cfg, stats: SessionStats::default(), deflate: Deflate::default(), rng: StdRng::seed_from_u64(0) }
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx { now: 0, cfg: &self.cfg, stats: &self.stats, deflate: &self.deflate }
    }

    /// A fresh connection speaking HTTP (it has no socket: the session never touches one).
    pub(super) fn http_session(&self) -> Session {
        Session::new(0, &self.cfg)
    }

    /// A fresh connection already upgraded (its `101` written).
    pub(super) fn open_session(&mut self) -> Session {
        let mut s = self.http_session();
        let response = handshake::switching_protocols("fuzz", None);
        s.upgrade(
            &Ctx { now: 0, cfg: &self.cfg, stats: &self.stats, deflate: &self.deflate },
            response,
            false,
            false,
            &mut self.rng,
        );
        write_all(&mut s, &mut Vec::new());
        s
    }

    /// Feeds `pieces` one read at a time, answering between reads as a core does, and records
    /// what happened.
    pub(super) fn run(&mut self, s: &mut Session, pieces: &[&[u8]]) -> Transcript {
        let mut t = Transcript::default();
        let mut ops = Events::default();
        for piece in pieces {
            s.handle_bytes(&self.ctx(), piece, &mut ops);
            // The core's next passes: what one turn left (MESSAGES_PER_TURN) goes on.
            while s.poll_turn_ended() && s.has_input() {
                s.handle_bytes(&self.ctx(), &[], &mut ops);
            }
            self.serve_pending(s, &mut ops, &mut t);
            record_ops(s, &self.ctx(), &mut ops, &mut t);
            write_all(s, &mut t.output);
        }
        t.end = format!("{:?} {:?}", s.state(), s.reap_reason());
        t
    }

    /// `CoreState::serve_pending` + `route` reduced to what the parsers decide: every complete
    /// request is answered (an upgrade on `/ws`, a marker answer otherwise) until one is refused
    /// or the connection stops speaking HTTP.
    fn serve_pending(&mut self, s: &mut Session, ops: &mut Events, t: &mut Transcript) {
        while let State::Http(_) = s.state() {
            let Some(next) = s.next_request(&self.cfg) else { return };
            match next {
                Err(e) => return self.refuse(s, e, t),
                Ok((req, body)) => {
                    check_request(&req, &body);
                    t.events.push(format!("request {req:?} body {body:?} {}", derived(&req)));
                    if req.path == "/ws" && req.method != Method::Other {
                        match handshake::check_upgrade(&req) {
                            Ok(accept) => {
                                t.events.push(format!("upgrade {accept}"));
                                let ctx = Ctx { now: 0, cfg: &self.cfg, stats: &self.stats, deflate: &self.deflate };
                                s.upgrade(
                                    &ctx,
                                    handshake::switching_protocols(&accept, None),
                                    false,
                                    false,
                                    &mut self.rng,
                                );
                                // Frames sent right behind the head (`server::http::route` upgrade).
                                s.handle_bytes(&self.ctx(), &[], ops);
                            }
                            Err(e) => return self.refuse(s, e, t),
                        }
                    } else {
                        let answer = format!("answer {:?} {}\r\n", req.method, req.path);
                        s.respond(&self.ctx(), answer.into_bytes(), req.keep_alive);
                    }
                }
            }
        }
    }

    /// A refusal answered and the connection finished, as `route::reject` does (with a
    /// marker answer: the real one carries a `Date`, which would differ between runs).
    fn refuse(&self, s: &mut Session, e: HttpError, t: &mut Transcript) {
        t.events.push(format!("refused {e}"));
        s.respond(&self.ctx(), format!("refused {e}\r\n").into_bytes(), false);
    }
}

/// Invariants of one accepted request, whatever the bytes were.
fn check_request(req: &Request, body: &[u8]) {
    assert!(req.head_len <= MAX_HEAD_BYTES, "head of {} bytes accepted over the limit", req.head_len);
    assert!(body.len() <= MAX_BODY_BYTES, "body of {} bytes accepted over the limit", body.len());
    assert!(!(req.chunked && req.content_length.is_some()), "both chunked and Content-Length: {req:?}");
    if let Some(n) = req.content_length.filter(|_| !req.chunked) {
        assert_eq!(body.len(), n, "body length differs from Content-Length");
    }
}

/// What the routes derive from a request (decoded path, `top`, `token`, expectation), so the
/// fuzzer runs those decoders on the same client bytes.
fn derived(req: &Request) -> String {
    let path = tether_proto::http::percent_decode(&req.path);
    if let Some(p) = &path {
        assert!(p.len() <= req.path.len(), "percent-decoding grew {:?}", req.path);
    }
    let query = req.query.as_deref().unwrap_or("");
    let top = tether_proto::http::query_param(query, "top");
    let token = tether_proto::http::query_param(query, "token");
    format!("{path:?} {top:?} {token:?} {:?}", tether_proto::http::expectation(req))
}

fn record_ops(s: &mut Session, ctx: &Ctx, ops: &mut Events, t: &mut Transcript) {
    while let Some(event) = ops.poll_event() {
        match event {
            Event::Request(Inbound::Op(op)) => t.events.push(format!("op {op:?}")),
            // Answered by the session itself: the core queues it as it serves it.
            Event::Request(Inbound::Answered { frame, .. }) => {
                s.reply(ctx, frame);
            }
            // What the core would log: part of the transcript, so it must not depend on the
            // split either.
            Event::PeerClosed { code, reason } => t.events.push(format!("peer closed {code:?} {reason:?}")),
            Event::Refused(e) => t.events.push(format!("refused request {} {:?}", e.code, e.ch)),
        }
    }
}

/// Plays a socket that takes everything the session offers.
fn write_all(s: &mut Session, out: &mut Vec<u8>) {
    loop {
        let written = {
            let mut iov = [IoSlice::new(&[]); queue::MAX_IOV];
            let n = s.poll_transmit(&mut iov);
            let mut written = 0;
            for slice in &iov[..n] {
                if **slice != *tether_proto::http::CONTINUE {
                    out.extend_from_slice(slice);
                }
                written += slice.len();
            }
            written
        };
        if written == 0 {
            return;
        }
        s.transmitted(written, 0);
    }
}

/// The frames a session wrote, as (opcode, payload); panics on bytes that are not whole,
/// valid server frames.
pub(super) fn server_frames(mut bytes: &[u8]) -> Vec<(u8, Bytes)> {
    let mut v = Vec::new();
    while !bytes.is_empty() {
        let (n, fin, op, payload) = match tether_proto::ws::codec::decode_server_frame(bytes) {
            Ok(Some(frame)) => frame,
            other => panic!("the session wrote something that is not a whole server frame: {other:?}"),
        };
        assert!(fin, "the server never fragments");
        v.push((op, payload));
        bytes = &bytes[n..];
    }
    v
}
