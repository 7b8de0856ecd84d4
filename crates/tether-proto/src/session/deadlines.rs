//! The session's one deadline: handshake and idle timeouts, heartbeats (the ping, and the reap
//! of a peer that does not answer), the token's expiry and refresh grace (`token.rs`),
//! close-handshake deadlines and the staggered drain close.

use std::sync::atomic::Ordering::Relaxed;

use rand::Rng;

use super::{reached, Ctx, Flags, HandshakeFailure, ReapReason, Session, State, Tick, DRAIN_RETRY_SPREAD_MS, PING};
use crate::protocol::close::{CloseCode, CloseReason};

impl Session {
    /// The tick of this connection's next deadline. The caller files it in its timer wheel
    /// and calls [`Session::handle_timeout`] when it comes.
    pub fn poll_timeout(&self) -> Tick {
        self.deadline
    }

    /// Whether the deadline is a heartbeat's, which may come up to a grid step late
    /// ([`heartbeat_slack`](crate::tick::heartbeat_slack)): the next ping time or the
    /// pong deadline of an open connection (no drain close, not the token's expiry).
    /// Handshake and close timeouts, drain closes and token expiry stay exact to the tick.
    pub fn deadline_is_heartbeat(&self) -> bool {
        self.state == State::Open
            && !self.flags.has(Flags::DRAIN)
            && (self.grant().is_none() || self.deadline != self.token_due)
    }

    /// Schedules the drain close of this connection at `at` (an open connection only).
    pub fn start_drain(&mut self, at: Tick) {
        if self.state == State::Open {
            self.flags.set(Flags::DRAIN);
            self.deadline = at;
        }
    }

    /// Whether the deadline, reached at `now`, would end this connection for want of input
    /// from the peer: no request head yet (HTTP, never served), no frame since the last ping
    /// (the pong timeout) or no close frame or FIN after ours (the close timeout). The I/O
    /// owner reads what already waits in the socket before it calls
    /// [`Session::handle_timeout`] then: input its core was too busy to read is not a silent peer.
    pub fn timeout_awaits_input(&self, now: Tick) -> bool {
        if !reached(now, self.deadline) {
            return false;
        }
        match self.state {
            State::Http(p) => !p.served,
            State::Open => self.flags.has(Flags::AWAIT_PONG) && !self.flags.has(Flags::DRAIN),
            State::ClosingByUs | State::Finishing | State::Lingering => true,
            State::Closed => false,
        }
    }

    /// Input from the peer waits in the socket but is not read yet (its reads are held): like
    /// any input, it shows the peer is alive, so an open connection stops awaiting its pong
    /// (the next ping goes out at its time). Other states are left to their deadlines.
    pub fn input_waits(&mut self) {
        if self.state == State::Open {
            self.flags.clear(Flags::AWAIT_PONG);
        }
    }

    /// The deadline came (at `ctx.now`): the handshake or idle timeout of HTTP, the drain
    /// close (`drain`: the code of the drain in progress), the token's expiry (`error`
    /// `token_expired`) or the end of its refresh grace (close 4001), the heartbeat (ping, or
    /// the reap of a peer that did not answer within the pong timeout), or the close-handshake
    /// deadline. A call before the deadline does nothing.
    pub fn handle_timeout(&mut self, ctx: &Ctx, drain: Option<CloseCode>, rng: &mut impl Rng) {
        if !reached(ctx.now, self.deadline) {
            return;
        }
        match self.state {
            State::Http(p) => {
                if p.served {
                    // An idle keep-alive connection.
                    self.kill(ReapReason::Eof);
                } else {
                    ctx.stats.handshake_failure(HandshakeFailure::Timeout);
                    self.kill(ReapReason::HandshakeTimeout);
                }
            }
            State::Open if self.flags.has(Flags::DRAIN) => {
                // A per-connection random hint: clients take it as the floor of their next
                // wait, so a common value would line them all up again; a random one spreads
                // their return over DRAIN_RETRY_SPREAD_MS even when the drain window is short.
                let code = drain.unwrap_or(CloseCode::Restart);
                let reason = CloseReason::drain(code, rng.random_range(0..=DRAIN_RETRY_SPREAD_MS));
                ctx.stats.drain_remaining.fetch_sub(1, Relaxed);
                self.flags.clear(Flags::DRAIN);
                self.close(ctx, code, &reason.to_json(), ReapReason::Drain);
            }
            State::Open => {
                if self.token_timeout(ctx) {
                    return;
                }
                self.heartbeat(ctx);
                self.fold_token_deadline();
            }
            State::ClosingByUs | State::Finishing | State::Lingering => self.kill(ReapReason::CloseTimeout),
            State::Closed => {}
        }
    }

    /// Pings when the interval has passed since the last ping; reaps a peer that stayed
    /// silent for the pong timeout after one (any inbound byte clears the wait). An SSE
    /// stream sends a comment line instead, and the wait clears when its queue drains
    /// (`sse.rs`): a peer that takes no bytes for the pong timeout is reaped the same way.
    fn heartbeat(&mut self, ctx: &Ctx) {
        let (now, interval, pong) = (ctx.now, ctx.cfg.ping_interval, ctx.cfg.pong_timeout);
        let awaiting = self.flags.has(Flags::AWAIT_PONG);
        if awaiting && reached(now, self.ping_sent.wrapping_add(pong)) {
            self.kill(ReapReason::PongTimeout);
            return;
        }
        self.queue.shrink_idle();
        self.rest_limiter(ctx);
        if !awaiting && reached(now, self.ping_sent.wrapping_add(interval)) {
            self.ping_sent = now;
            self.flags.set(Flags::AWAIT_PONG);
            ctx.stats.pings_sent.fetch_add(1, Relaxed);
            if self.is_sse() {
                self.sse_heartbeat(ctx);
            } else {
                self.flags.set(Flags::PONG_DUE);
                self.reply(ctx, PING.clone());
            }
            if !self.state.can_write() {
                return;
            }
        }
        // Next look: the next ping time, or the pong deadline if that comes first. A pong
        // clears AWAIT_PONG without moving the deadline, so the ping time must be a candidate
        // even while a pong is awaited.
        let ping_due = self.ping_sent.wrapping_add(interval);
        let mut next = ping_due;
        if self.flags.has(Flags::AWAIT_PONG) {
            let pong_due = self.ping_sent.wrapping_add(pong);
            if !reached(now, ping_due) && !reached(ping_due, pong_due) {
                next = ping_due;
            } else {
                next = pong_due;
            }
        }
        self.deadline = if reached(now, next) { now.wrapping_add(1) } else { next };
    }

    /// Schedules the first heartbeat of a connection that just upgraded at a random point in
    /// `[interval/2, 3·interval/2)`: the phase is uniform over a whole interval, so connections
    /// opened together are pinged evenly rather than in lock-step (or in half-interval
    /// bursts), and a fresh connection is not pinged in its first moments (conformance suites
    /// count every frame).
    pub(super) fn first_ping(&mut self, ctx: &Ctx, rng: &mut impl Rng) {
        let interval = ctx.cfg.ping_interval;
        let offset = interval.div_ceil(2) + rng.random_range(0..interval);
        self.ping_sent = ctx.now.wrapping_add(offset).wrapping_sub(interval);
        self.deadline = ctx.now.wrapping_add(offset);
    }
}
