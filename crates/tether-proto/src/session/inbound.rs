//! Frames in, requests out: the decoding of an open connection's input into messages, each
//! answered here (pongs, errors of malformed requests, the close handshake) or handed up to
//! the core as a request, in message order ([`Inbound`] in an [`Event`]), at most
//! [`MESSAGES_PER_TURN`] per call.

use super::{Ctx, Event, Events, Flags, Inbound, ReapReason, Session, State, MESSAGES_PER_TURN, NO_CHAN};
use crate::protocol::close::CloseCode;
use crate::protocol::{self, codes};
use tungstenite::protocol::frame::coding::Data;

use crate::ws::codec::{self, Message, OpCode};

impl Session {
    pub(super) fn decode(&mut self, ctx: &Ctx, data: &[u8], events: &mut Events) {
        let mut pending = self.pending_in.take();
        let buf: &[u8] = if pending.is_empty() {
            data
        } else {
            pending.extend_from_slice(data);
            &pending
        };
        let mut pos = 0;
        let mut turn = 0;
        while pos < buf.len() {
            if !self.state.can_read() {
                pos = buf.len();
                break;
            }
            if turn == MESSAGES_PER_TURN {
                // The rest waits for the reactor's next pass: one connection's pipeline does
                // not keep the core from its other connections.
                self.flags.set(Flags::TURN_ENDED);
                break;
            }
            let inflate = self.flags.has(Flags::DEFLATE).then_some(ctx.deflate);
            match self.decoder.decode_with(&buf[pos..], ctx.cfg.max_message_bytes, true, inflate) {
                Ok((0, None)) => break,
                Ok((n, None)) => pos += n,
                Ok((n, Some(m))) => {
                    pos += n;
                    turn += 1;
                    self.on_message(ctx, m, events);
                }
                Err(v) => {
                    self.queue_answered(ctx, events);
                    self.fail(ctx, v);
                    pos = buf.len();
                }
            }
        }
        if pos < buf.len() {
            self.pending_in.put(if pending.is_empty() {
                buf[pos..].to_vec()
            } else {
                pending.drain(..pos);
                pending
            });
        }
    }

    /// Echoes a data message on `/echo`, compressed when permessage-deflate was negotiated
    /// and it pays (the same rules as fan-out: `compression.min_bytes`, smaller than plain).
    fn echo(&mut self, ctx: &Ctx, opcode: OpCode, payload: &[u8]) {
        let frame = if self.flags.has(Flags::DEFLATE) {
            let deflated = ctx.deflate.deflate_message(opcode, payload);
            let plain = codec::header_len(payload.len()) + payload.len();
            ctx.stats.deflate.count(plain, deflated.as_ref().map(|f| f.len()));
            deflated
        } else {
            None
        };
        let frame = frame.unwrap_or_else(|| codec::encode_frame(opcode, payload));
        self.queue.push(frame, NO_CHAN);
    }

    fn on_message(&mut self, ctx: &Ctx, m: Message, events: &mut Events) {
        if self.state == State::ClosingByUs {
            // Our close is out: only the peer's close matters now (RFC 6455 §7.1.2).
            if let Message::Close { .. } = m {
                self.kill(self.reap.unwrap_or(ReapReason::Close));
            }
            return;
        }
        let echo = self.flags.has(Flags::ECHO);
        match m {
            // `/echo` is a conformance endpoint: not bounded by the queue limits; the I/O
            // owner stops reading while an echo waits for the socket instead.
            Message::Text(p) if echo => self.echo(ctx, OpCode::Data(Data::Text), &p),
            Message::Binary(p) if echo => self.echo(ctx, OpCode::Data(Data::Binary), &p),
            Message::Text(p) => match protocol::parse_client_op(&p) {
                Ok(op) => match self.admit_op(ctx, &op) {
                    Ok(()) => events.push_request(Inbound::Op(op)),
                    Err(refusal) => self.hand_up(ctx, refusal, events),
                },
                Err(e) => {
                    let refusal = self.admit_bad_request(ctx, e.ch.as_deref(), || e.to_json());
                    events.push(Event::Refused(e));
                    self.hand_up(ctx, refusal, events);
                }
            },
            Message::Binary(_) => {
                let e = || {
                    let reason = "binary frames are not part of protocol v1; send JSON text";
                    protocol::error_json(codes::BAD_REQUEST, reason, None)
                };
                let refusal = self.admit_bad_request(ctx, None, e);
                self.hand_up(ctx, refusal, events);
            }
            Message::Ping(p) => {
                if self.admit_control(ctx, events) {
                    if echo {
                        self.reply(ctx, codec::pong_frame(&p));
                    } else {
                        // In line with the answers to requests (they go out in message order).
                        events.push_request(Inbound::Answered { ch: None, frame: codec::pong_frame(&p) });
                    }
                }
            }
            Message::Pong(_) if self.flags.has(Flags::PONG_DUE) => self.flags.clear(Flags::PONG_DUE),
            Message::Pong(_) => {
                // Unsolicited (RFC 6455 §5.5.3 allows it): nothing to answer, but counted.
                self.admit_control(ctx, events);
            }
            Message::Close { code, reason } => {
                self.queue.drop_deliveries();
                self.queue_answered(ctx, events);
                events.push(Event::PeerClosed { code, reason });
                // Echo the peer's code (RFC 6455 §5.5.1), then close TCP once it is written.
                let code = code.unwrap_or(CloseCode::Normal);
                ctx.stats.close(code);
                self.queue.push(codec::close_frame(code, ""), NO_CHAN);
                self.reap.get_or_insert(ReapReason::Close);
                self.finish(ctx);
            }
        }
    }
}
