//! The Server-Sent Events transport of a session (`GET /sse`, docs/protocol.md): the same
//! record, queue, overflow policies, replay, token expiry and drain as a WebSocket, with the
//! stream's own wire form ([`crate::sse`]) where the two differ:
//!
//! - the stream starts with a `200` head instead of a `101`, and is counted like an upgraded
//!   connection ([`Flags::UPGRADED`] and [`Flags::SSE`], one bit in the flags, not a field);
//! - a heartbeat is a comment line; there is no pong, so the wait it starts
//!   ([`Flags::AWAIT_PONG`]) clears when the outbound queue drains (the comment reached the
//!   socket): a peer that takes no bytes for `pong_timeout` after it is reaped as a silent
//!   WebSocket peer is. A peer that vanished without a reset leaves its bytes unacknowledged in
//!   the kernel; the server sets `TCP_USER_TIMEOUT` on the socket for that, which the session
//!   cannot see;
//! - a close is `event: close` (the WebSocket close code and reason) and a `retry:`, then FIN:
//!   there is no close handshake to wait for;
//! - the client has nothing to send after its request: any byte from it ends the stream
//!   (closed at once, what it sent discarded), so its input costs no memory and no parsing.

use rand::Rng;

use super::{Ctx, Flags, Frame, ReapReason, Session, State, NO_CHAN};
use crate::protocol::close::{CloseCode, CloseReason};

impl Session {
    /// Starts the stream of a `GET /sse` request the server admitted: queues the `200` head
    /// ([`crate::sse::response_head`], naming `origin` for CORS when the request had one),
    /// becomes an open SSE stream (counted in the connection
    /// gauge until torn down) and schedules its first heartbeat as an upgrade does. Bytes the
    /// client sent behind its request head stay in the input: feed them with
    /// `handle_bytes(ctx, &[], …)`, which ends the stream.
    pub fn start_sse(&mut self, ctx: &Ctx, origin: Option<&str>, rng: &mut impl Rng) {
        self.state = State::Open;
        self.flags.set(Flags::UPGRADED);
        self.flags.set(Flags::SSE);
        self.queue.push(bytes::Bytes::from(crate::sse::response_head(origin)), NO_CHAN);
        self.first_ping(ctx, rng);
    }

    /// Input on an open stream (or input left behind its request head): the client may send
    /// nothing, so the stream ends now, the queued tail written, then FIN.
    pub(super) fn sse_input(&mut self, ctx: &Ctx, data: &[u8]) {
        if data.is_empty() && self.pending_in.is_empty() {
            return;
        }
        self.pending_in.clear();
        if self.state == State::Open {
            self.reap = Some(ReapReason::Protocol);
            self.finish(ctx);
        }
    }

    /// The heartbeat of a stream: a comment line, under the queue's limits like a ping.
    pub(super) fn sse_heartbeat(&mut self, ctx: &Ctx) {
        self.enqueue_frame(ctx, Frame::from(crate::sse::HEARTBEAT.clone()), NO_CHAN, None);
    }

    /// Ends the stream as a WebSocket close with `code` and `reason` would end the
    /// connection: `event: close` with both, `retry:` of the reason's `retry_after_ms` plus
    /// [`crate::sse::RETRY_FLOOR_MS`] when it has one (a drain's random hint spreads the
    /// browsers' reconnects as it spreads WebSocket clients'), then FIN once it is written.
    pub(super) fn end_stream(&mut self, ctx: &Ctx, code: CloseCode, reason: &str, why: ReapReason) {
        let retry = CloseReason::parse(reason).and_then(|r| r.retry_after_ms);
        let retry = retry.map(|ms| ms.saturating_add(crate::sse::RETRY_FLOOR_MS));
        self.queue.push(crate::sse::close_event(code, reason, retry), NO_CHAN);
        self.reap = Some(why);
        ctx.stats.close(code);
        self.finish(ctx);
    }
}
