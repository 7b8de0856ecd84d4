//! The per-connection rates applied to what a session reads ([`super::limits`] holds the
//! buckets): every request that costs the server work is counted (`pub`, `sub`/`unsub`,
//! `refresh`, malformed requests, control frames), and one beyond its rate is answered with
//! `error` `limit` naming the key and `retry_after_ms` (a control frame: not answered),
//! counted in `tether_limit_refusals_total{limit}`, and past [`CLOSE_AFTER_BURSTS`](super::limits::CLOSE_AFTER_BURSTS) bursts of
//! refusals in one second the connection is closed with 1008.

use bytes::Bytes;

use super::limits::{Limiter, Op, Verdict};
use super::{Ctx, Events, Flags, Inbound, Limit, ReapReason, Session};
use crate::protocol::close::{CloseCode, CloseReason};
use crate::protocol::{self, codes, ClientOp};
use crate::ws::codec;

/// What the rates made of a request that is not let through.
pub(super) enum Refusal {
    /// Hand this answer up in the request's place.
    Answer(Inbound),
    /// The refusal took the connection past
    /// [`CLOSE_AFTER_BURSTS`](super::limits::CLOSE_AFTER_BURSTS): this answer goes out after
    /// those already handed up, then the close (1008) naming the limit.
    Close(Bytes, Limit),
}

impl Session {
    /// Hands up a refusal ([`Refusal`]): its answer joins `events`, or, for a close, every
    /// answer already in `events` is queued in order, then this one, then the close (the
    /// requests that would have gone to the broker stay; their answers can no longer go out).
    pub(super) fn hand_up(&mut self, ctx: &Ctx, r: Refusal, events: &mut Events) {
        match r {
            Refusal::Answer(a) => events.push_request(a),
            Refusal::Close(frame, over) => {
                self.queue_answered(ctx, events);
                self.reply(ctx, frame);
                self.close_for(ctx, over);
            }
        }
    }

    /// Queues, in order, the answers already in `events` (taking them out): before a close
    /// frame, which nothing may follow.
    pub(super) fn queue_answered(&mut self, ctx: &Ctx, events: &mut Events) {
        events.take_answered(|frame| {
            self.reply(ctx, frame);
        });
    }

    /// A request that parsed, at `ctx.now`: `Ok` when it goes on to the core; otherwise its
    /// refusal (`error` `limit` with the request's `ch`, and `id` for a `pub`).
    pub(super) fn admit_op(&mut self, ctx: &Ctx, op: &ClientOp) -> Result<(), Refusal> {
        let (v, ch, id) = match op {
            ClientOp::Pub { ch, id, data } => (self.publish_verdict(ctx, data.get().len()), Some(ch), Some(id)),
            ClientOp::Sub { ch, .. } | ClientOp::Unsub { ch } => (self.op_verdict(ctx, Op::Subscribe), Some(ch), None),
            ClientOp::Refresh { .. } => (self.op_verdict(ctx, Op::Refresh), None, None),
            ClientOp::Presence { ch, .. } | ClientOp::PresenceStats { ch } => {
                (self.op_verdict(ctx, Op::Presence), Some(ch), None)
            }
        };
        let Verdict::Refuse { limit, retry_after_ms, close } = v else { return Ok(()) };
        let reason = self.limit_reason(ctx, limit);
        let mut e = protocol::error_json_retry(codes::LIMIT, &reason, id.map(String::as_str), Some(retry_after_ms));
        if let Some(ch) = ch {
            e = protocol::with_channel(e, ch);
        }
        Err(refused(ctx, limit, close, e, ch.map(|c| c.as_str().into())))
    }

    /// A request answered with an error of its own (`answer` makes it), at `ctx.now`, under
    /// `bad_request_rate`: that answer or, beyond the rate, `error` `limit` (or the close).
    pub(super) fn admit_bad_request(
        &mut self,
        ctx: &Ctx,
        ch: Option<&str>,
        answer: impl FnOnce() -> Vec<u8>,
    ) -> Refusal {
        let ch_owned = ch.map(Box::from);
        let Verdict::Refuse { limit, retry_after_ms, close } = self.op_verdict(ctx, Op::BadRequest) else {
            return Refusal::Answer(Inbound::Answered { ch: ch_owned, frame: codec::text_frame(&answer()) });
        };
        let reason = self.limit_reason(ctx, limit);
        let mut e = protocol::error_json_retry(codes::LIMIT, &reason, None, Some(retry_after_ms));
        if let Some(ch) = ch {
            e = protocol::with_channel(e, ch);
        }
        refused(ctx, limit, close, e, ch_owned)
    }

    /// A control frame that counts against `control_frames_rate` (a ping, or a pong that
    /// answers none of our pings) at `ctx.now`. Returns whether it is within the rate (a ping
    /// is then answered); beyond it nothing is answered, and past [`CLOSE_AFTER_BURSTS`](super::limits::CLOSE_AFTER_BURSTS) the
    /// connection is closed with 1008 (after the answers already in `events`).
    pub(super) fn admit_control(&mut self, ctx: &Ctx, events: &mut Events) -> bool {
        let r = &ctx.cfg.rates;
        if r.control_frames_rate == 0 {
            return true;
        }
        let now = ctx.now;
        let v = self.limiter.get_or_insert_with(|| Box::new(Limiter::new(now, r))).control(now, r);
        let Verdict::Refuse { limit, close, .. } = v else { return true };
        ctx.stats.limit_refused(limit);
        if let Some(over) = close {
            self.queue_answered(ctx, events);
            self.close_for(ctx, over);
        }
        false
    }

    /// Drops the limiter when it holds nothing a fresh one would not (every bucket full, no
    /// refusal window open), so a connection that was busy once does not keep it; the free
    /// count starts again. Called at each heartbeat.
    pub(super) fn rest_limiter(&mut self, ctx: &Ctx) {
        if self.limiter.as_mut().is_some_and(|l| l.is_rested(ctx.now, &ctx.cfg.rates)) {
            self.limiter = None;
        }
        if self.limiter.is_none() {
            self.flags.set_free_ops(0);
        }
    }

    /// The `pub` buckets' verdict on `len` bytes of data.
    fn publish_verdict(&mut self, ctx: &Ctx, len: usize) -> Verdict {
        let r = &ctx.cfg.rates;
        if !r.limits_publish() {
            return Verdict::Allow;
        }
        let now = ctx.now;
        self.limiter.get_or_insert_with(|| Box::new(Limiter::new(now, r))).publish(now, r, len as u64)
    }

    /// The verdict of `op`'s bucket. The first [`Flags::MAX_FREE_OPS`] requests of a
    /// connection without a limiter are counted in its flags; the next one makes the limiter
    /// and charges them all.
    fn op_verdict(&mut self, ctx: &Ctx, op: Op) -> Verdict {
        let r = &ctx.cfg.rates;
        if op.rate(r).0 == 0 {
            return Verdict::Allow;
        }
        let now = ctx.now;
        let cost = match &self.limiter {
            Some(_) => 1,
            None => {
                let free = self.flags.free_ops();
                if free < Flags::MAX_FREE_OPS {
                    self.flags.set_free_ops(free + 1);
                    return Verdict::Allow;
                }
                u64::from(free) + 1
            }
        };
        self.limiter.get_or_insert_with(|| Box::new(Limiter::new(now, r))).op(now, r, op, cost)
    }

    /// The reason of an `error` `limit` for `limit`: its key and its value.
    fn limit_reason(&self, ctx: &Ctx, limit: Limit) -> String {
        let r = &ctx.cfg.rates;
        match limit {
            Limit::PublishBytesRate => {
                format!("publish_bytes_rate ({} data bytes per second) exceeded", r.publish_bytes_rate)
            }
            Limit::PublishRate => format!("publish_rate ({} per second) exceeded", r.publish_rate),
            Limit::SubscribeRate => format!(
                "subscribe_rate ({} sub and unsub per second, burst {}) exceeded",
                r.subscribe_rate, r.subscribe_burst
            ),
            Limit::RefreshRate => format!("refresh_rate ({} per second) exceeded", r.refresh_rate),
            Limit::BadRequestRate => {
                format!("bad_request_rate ({} malformed requests per second) exceeded", r.bad_request_rate)
            }
            Limit::PresenceRate => {
                format!("presence_rate ({} presence and presence_stats per second) exceeded", r.presence_rate)
            }
            other => format!("{} exceeded", other.key()),
        }
    }

    /// Closes with 1008 naming the limit `over` (docs/security.md).
    fn close_for(&mut self, ctx: &Ctx, over: Limit) {
        let reason = CloseReason::limit(over.key()).to_json();
        self.close(ctx, CloseCode::Policy, &reason, ReapReason::Limit);
    }
}

/// Counts a refusal of `limit` in `tether_limit_refusals_total`; its answer `json` (about
/// `ch`), to hand up, or to send before the close `close` says is due.
fn refused(ctx: &Ctx, limit: Limit, close: Option<Limit>, json: Vec<u8>, ch: Option<Box<str>>) -> Refusal {
    ctx.stats.limit_refused(limit);
    let frame: Bytes = codec::text_frame(&json);
    match close {
        None => Refusal::Answer(Inbound::Answered { ch, frame }),
        Some(over) => Refusal::Close(frame, over),
    }
}
