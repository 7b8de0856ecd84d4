//! One connection's decisions, sans-IO (the quinn-proto shape: `handle_*` in, `poll_*` out).
//!
//! A [`Session`] is the compact record a core keeps per connection in its slab. It takes bytes
//! read from the socket ([`Session::handle_bytes`]) and deadlines ([`Session::handle_timeout`]),
//! and decides: RFC 6455 frames in, control frames answered, the close handshake and the fail
//! path (§7), pub/sub requests handed up to the core, replies, heartbeats, the overflow
//! policies of its outbound queue and the pacing of a resume replay. What it wants written
//! comes out of [`Session::poll_transmit`], its next deadline out of [`Session::poll_timeout`],
//! and whether TCP should be half-closed out of [`Session::poll_fin`].
//!
//! It never touches a socket, a clock or a random source, and it does not know its peer: the
//! caller passes `now` (a [`Tick`]), the random source and the per-core context ([`Ctx`]),
//! owns the socket and the peer's address (the server's `Conn` record, which holds this one),
//! does the I/O itself and writes the log lines about what the session hands up
//! ([`Events::poll_event`]). This crate cannot name a runtime or a socket (its `Cargo.toml`
//! has no IO crate; the workspace's `tests/layers.rs` checks it), so that is a build failure to
//! break. Heartbeats, overflow, close and replay are unit-tested on a simulated clock
//! (`session/tests/`).
//!
//! # Layout
//! - this file: the record, its lifecycle ([`State`]), WebSocket input, output, closes;
//! - `flags.rs`: [`Flags`], the conditions orthogonal to the lifecycle, one bit each;
//! - [`event`]: what a call hands up ([`Event`]: requests, and what the core logs), in the
//!   queue the core lends ([`Events`]);
//! - [`stats`]: what the sessions of a core count ([`SessionStats`]: closes by code,
//!   overflows, limit refusals, pings), rendered by the server's `/metrics`;
//! - `http.rs`: plain HTTP requests in, answers and the upgrade out;
//! - `sse.rs`: the Server-Sent Events transport: the stream's start, its heartbeat, its end
//!   and the bytes a client may not send;
//! - `input.rs`: the unconsumed input (a partial frame or request head), boxed;
//! - `deadlines.rs`: the one deadline (handshake, heartbeat, token expiry, close, drain);
//! - `token.rs`: the connection's grant (JWT auth) and its expiry, refresh and grace;
//! - [`queue`]: the outbound queue of shared frames and the overflow policies;
//! - [`reap`]: why a connection ended;
//! - [`replay`]: resume replay paced by the queue, and live frames held behind it;
//! - [`limits`]: the per-connection abuse limits (publish and control-frame rates).

mod admit;
mod deadlines;
pub mod event;
mod flags;
mod http;
mod inbound;
mod input;
pub mod limits;
pub mod queue;
pub mod reap;
pub mod replay;
mod sse;
pub mod stats;
#[cfg(test)]
mod tests;
mod token;

use bytes::Bytes;

pub use self::event::{Event, Events, Inbound};
pub use self::flags::Flags;
use self::limits::{Limiter, Rates};
pub use self::queue::Overflow;
use self::queue::{Frame, OutQueue};
pub use self::reap::ReapReason;
use self::replay::Replay;
pub use self::stats::{HandshakeFailure, Limit, SessionStats};
pub use self::token::{token_due, MAX_TOKEN_TICKS, NO_GRANT};
use crate::protocol::close::{CloseCode, CloseReason};
use crate::published::Encoding;
use crate::tick::{reached, Tick};
use crate::ws::codec::{self, Decoder, Violation};
use crate::ws::deflate::Deflate;

/// Drain closes carry `retry_after_ms` drawn uniformly from 0 to this, in milliseconds.
pub const DRAIN_RETRY_SPREAD_MS: u64 = 3000;

/// Tag for queued frames that belong to no channel (replies, pongs, close frames).
pub const NO_CHAN: u32 = u32::MAX;

/// A ping with an empty payload (RFC 6455 §5.5.2), shared by every heartbeat.
pub static PING: Bytes = Bytes::from_static(&[0x89, 0x00]);

/// Messages one connection's input may hand up per call of [`Session::handle_bytes`]: the
/// rest stays in its input, [`Session::poll_turn_ended`] says so, and the core decodes it on
/// the reactor's next pass, after the other connections ready in this one (about 100 µs of
/// requests per turn: a neighbour on the same core waits at most that for one pipeline).
pub const MESSAGES_PER_TURN: usize = 64;

impl Session {
    /// Whether input is kept undecoded (a partial frame or request head, or what
    /// [`MESSAGES_PER_TURN`] left for the next turn).
    pub fn has_input(&self) -> bool {
        !self.pending_in.is_empty()
    }
}

/// Where a plain HTTP connection stands between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HttpPhase {
    /// At least one request was answered: the deadline is an idle timeout, not a handshake
    /// timeout.
    pub served: bool,
    /// The request being answered waits for another core (a publish, `/connections`): no
    /// further pipelined request is parsed until it is answered.
    pub awaiting: bool,
    /// The request being answered asked for keep-alive (RFC 9112 §9.3).
    pub keep_alive: bool,
    /// `100 Continue` was sent for the request being read (RFC 9110 §10.1.1: once).
    pub continued: bool,
    /// The request being answered is a `HEAD`: its answer goes without content.
    pub head: bool,
}

/// Lifecycle of a connection (RFC 6455 §7, the close handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Plain HTTP/1.1: reading request heads (the upgrade or an API request).
    Http(HttpPhase),
    /// Upgraded; frames flow both ways.
    Open,
    /// We sent a close frame and wait for the peer's until the close deadline; inbound data
    /// frames are discarded, nothing but the queued tail and the close frame goes out.
    ClosingByUs,
    /// The last bytes are being written (our answer to the peer's close frame, the close frame
    /// of a failed connection, RFC 6455 §7.1.7, or a final HTTP answer); FIN follows.
    Finishing,
    /// FIN sent: input is read and discarded until the peer's FIN or the close deadline, so
    /// unread input never turns our close into a reset that could destroy the close frame.
    Lingering,
    /// Over: the connection's I/O owner tears it down now (no waiting on the peer).
    Closed,
}

impl State {
    /// Whether inbound bytes are parsed (HTTP requests or frames).
    pub fn can_read(self) -> bool {
        matches!(self, State::Http(_) | State::Open | State::ClosingByUs)
    }

    /// Whether new frames may be queued (replies, deliveries, pings).
    pub fn can_write(self) -> bool {
        self == State::Open
    }
}

/// The limits a session applies, from the config, with durations in ticks.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// `heartbeat.ping_interval_ms` in ticks.
    pub ping_interval: Tick,
    /// `heartbeat.pong_timeout_ms` in ticks.
    pub pong_timeout: Tick,
    /// `limits.close_timeout_ms` in ticks: how long we wait for the peer's close frame or FIN.
    pub close_timeout: Tick,
    /// `limits.handshake_timeout_ms` in ticks: a request head must arrive within it (also the
    /// idle timeout of keep-alive HTTP connections).
    pub handshake_timeout: Tick,
    /// `limits.queue_max_bytes`: outbound queue bound in bytes.
    pub queue_max_bytes: usize,
    /// `limits.queue_max_messages`: outbound queue bound in frames.
    pub queue_max_messages: usize,
    /// `limits.max_message_bytes`: largest client message (1009 beyond).
    pub max_message_bytes: usize,
    /// `limits.max_header_bytes`: largest HTTP request head (431 beyond).
    pub max_header_bytes: usize,
    /// `limits.max_publish_bytes`: largest HTTP publish body (413 beyond).
    pub max_publish_bytes: usize,
    /// `[limits.per_connection]` rates (publish messages and bytes, control frames).
    pub rates: Rates,
    /// `auth.token_refresh_grace_ms` in ticks: how long a connection whose token expired may
    /// still send `refresh` before it is closed with 4001 (0 without `[auth]`).
    pub token_refresh_grace: Tick,
}

/// What every session call needs from its core: the time, the limits and the counters.
pub struct Ctx<'a> {
    /// Now, in ticks.
    pub now: Tick,
    /// The limits.
    pub cfg: &'a SessionConfig,
    /// The core's session counters (relaxed atomics; counting is not I/O).
    pub stats: &'a SessionStats,
    /// The core's permessage-deflate compressor and inflater (RFC 7692), lent to the sessions
    /// that negotiated it; none is held per connection.
    pub deflate: &'a Deflate,
}

/// One connection's protocol state: its lifecycle, counters, deadline and a queue of shared
/// frames. The server keeps it in its core's slab inside the connection's `Conn` record, beside
/// what only the I/O owner needs (the socket, the slab generation, the subscription list, the
/// timer entry).
///
/// An idle connection owns no read buffer (reads go to the core's scratch buffer; only the
/// tail of a partial frame or request is kept in `pending_in`) and no write buffer (`queue`
/// holds `Bytes` shared with every other subscriber). Its size is a product figure: see the
/// `session_record_stays_compact` test here and the server's `conn_record_stays_compact`.
pub struct Session {
    state: State,
    /// Orthogonal conditions.
    flags: Flags,
    reap: Option<ReapReason>,
    /// Frames not yet written.
    queue: OutQueue,
    decoder: Decoder,
    /// Unconsumed input: a partial frame or request head. Empty (unallocated) when idle.
    pending_in: input::Input,
    /// The one deadline of this connection ([`Session::poll_timeout`]).
    deadline: Tick,
    /// Tick of the last ping sent.
    ping_sent: Tick,
    /// Tick at which the outbound queue was last empty.
    last_drained: Tick,
    /// Resume replays in progress, in order (usually none). Boxed: an idle connection pays
    /// 8 bytes here instead of the 24 of an empty `Vec`.
    #[allow(clippy::box_collection)]
    replays: Option<Box<Vec<Replay>>>,
    /// Token buckets of the per-connection rates ([`limits`]), made the first time one has
    /// something to count: a connection that neither publishes under a rate nor pings pays
    /// 8 bytes here.
    limiter: Option<Box<Limiter>>,
    /// What the connection's token allows: an index into the core's interned grants
    /// (`auth::grants::Grants`), or [`NO_GRANT`] without JWT auth. An index, not the claims:
    /// connections with the same claims share one entry.
    grant: u32,
    /// When the token expires, or once it has ([`Flags::TOKEN_EXPIRED`]) when the refresh
    /// grace ends; folded into `deadline`, so auth adds no timer.
    token_due: Tick,
}

impl Session {
    /// A connection accepted at `now`: speaking HTTP, with the handshake deadline set
    /// ([`Session::poll_timeout`]).
    pub fn new(now: Tick, cfg: &SessionConfig) -> Session {
        Session {
            state: State::Http(HttpPhase::default()),
            flags: Flags::default(),
            reap: None,
            queue: OutQueue::default(),
            decoder: Decoder::new(),
            pending_in: input::Input::default(),
            deadline: now.wrapping_add(cfg.handshake_timeout),
            ping_sent: now,
            last_drained: now,
            replays: None,
            limiter: None,
            grant: NO_GRANT,
            token_due: now,
        }
    }

    /// The lifecycle state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Why the connection ends, once decided.
    pub fn reap_reason(&self) -> Option<ReapReason> {
        self.reap
    }

    /// Whether the connection is over and must be torn down.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Whether the connection upgraded to WebSocket (and counts in the connection gauge until
    /// it is torn down).
    pub fn is_upgraded(&self) -> bool {
        self.flags.has(Flags::UPGRADED)
    }

    /// Whether it is a Server-Sent Events stream (`GET /sse`) rather than a WebSocket.
    pub fn is_sse(&self) -> bool {
        self.flags.has(Flags::SSE)
    }

    /// Whether it is an `/echo` connection (data frames echoed, not parsed as requests).
    pub fn is_echo(&self) -> bool {
        self.flags.has(Flags::ECHO)
    }

    /// The encoding this connection takes fan-out messages in: [`Encoding::Sse`] for an SSE
    /// stream, [`Encoding::Deflate`] when permessage-deflate was negotiated at the upgrade
    /// (RFC 7692), else [`Encoding::Plain`].
    pub fn encoding(&self) -> Encoding {
        if self.flags.has(Flags::SSE) {
            Encoding::Sse
        } else if self.flags.has(Flags::DEFLATE) {
            Encoding::Deflate
        } else {
            Encoding::Plain
        }
    }

    /// Whether the drain scheduled this connection's close and it has not gone out yet.
    pub fn drain_scheduled(&self) -> bool {
        self.flags.has(Flags::DRAIN)
    }

    /// Asks the connection's I/O owner to look at it ([`Session::poll_wake`]).
    pub fn wake(&mut self) {
        self.flags.set(Flags::WAKE);
    }

    /// Whether the session asked its I/O owner to look at it since the last call (it closed,
    /// or the hold on its reads cleared); clears the request.
    pub fn poll_wake(&mut self) -> bool {
        let wake = self.flags.has(Flags::WAKE);
        self.flags.clear(Flags::WAKE);
        wake
    }

    /// Whether the last [`Session::handle_bytes`] stopped after [`MESSAGES_PER_TURN`]
    /// messages with input left undecoded (the I/O owner feeds it again on a later turn, with
    /// `handle_bytes(ctx, &[], …)`); clears it.
    pub fn poll_turn_ended(&mut self) -> bool {
        let ended = self.flags.has(Flags::TURN_ENDED);
        self.flags.clear(Flags::TURN_ENDED);
        ended
    }

    /// Bytes queued and not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.queue.bytes()
    }

    /// Where the next queued frame's entry will be stored: an address to prefetch before
    /// queueing to many sessions in a row (a fan-out), never read through. See
    /// [`OutQueue::next_slot`].
    #[inline]
    pub fn next_slot(&self) -> *const u8 {
        self.queue.next_slot()
    }

    /// Frames queued and not yet written (the front one may be partly written).
    pub fn queued_frames(&self) -> usize {
        self.queue.len()
    }

    /// Whether anything waits to be written.
    pub fn has_output(&self) -> bool {
        !self.queue.is_empty()
    }

    /// The tick at which the outbound queue was last empty (how long a backlog has lasted).
    pub fn last_drained(&self) -> Tick {
        self.last_drained
    }

    /// Drops what is queued of local channel `chan` and frees its conflation slot: the
    /// connection left the channel (`unsub`).
    pub fn release_channel(&mut self, chan: u32) {
        self.queue.release_channel(chan);
    }

    /// Ends the connection now, without waiting on the peer (its TCP connection is closed by
    /// the I/O owner): pong timeout, reset, EOF, deadlines.
    pub fn kill(&mut self, why: ReapReason) {
        self.reap.get_or_insert(why);
        self.state = State::Closed;
        self.wake();
    }

    // ---- input ----

    /// Bytes read from the socket at `ctx.now`. Any input counts as liveness.
    ///
    /// - HTTP: kept until the core takes complete requests with [`Session::next_request`].
    /// - WebSocket: frames are decoded; pings are answered, a close frame is answered and the
    ///   connection finishes, a violation fails it with the violation's close code (1002, 1007,
    ///   1009); pub/sub requests are appended to `requests` for the core, and a malformed one
    ///   is answered with an `error` (the connection stays). `/echo` echoes data frames.
    /// - Finishing, lingering or closed: discarded.
    ///
    /// What it hands up (requests, close frames and refusals to log) goes to `events`, in
    /// order, for the caller to take with [`Events::poll_event`].
    pub fn handle_bytes(&mut self, ctx: &Ctx, data: &[u8], events: &mut Events) {
        self.flags.clear(Flags::AWAIT_PONG);
        if !self.state.can_read() {
            return;
        }
        match self.state {
            State::Http(_) => self.pending_in.extend(data),
            _ if self.is_sse() => self.sse_input(ctx, data),
            _ => self.decode(ctx, data, events),
        }
    }

    // ---- output ----

    /// Queues `frame` under the overflow policy `policy` (`None` for replies, which overflow
    /// like `disconnect`). Returns whether it was queued. With `disconnect`, an overflow
    /// closes the connection with 1013 (the queued data dropped, the close frame first).
    ///
    /// On an SSE stream a reply (`chan` is [`NO_CHAN`]) is a WebSocket frame turned into its
    /// event here ([`crate::sse::from_reply`]: `reset`, `error`), or dropped (an answer to a
    /// request an SSE client cannot send); a channel's frames come as events already.
    pub fn enqueue(&mut self, ctx: &Ctx, frame: impl Into<Frame>, chan: u32, policy: Option<Overflow>) -> bool {
        let mut frame = frame.into();
        if chan == NO_CHAN && self.is_sse() {
            match crate::sse::from_reply(&frame) {
                Some(ev) => frame = Frame::from(ev),
                None => return false,
            }
        }
        self.enqueue_frame(ctx, frame, chan, policy)
    }

    /// [`Session::enqueue`] of a frame already in the connection's wire form.
    fn enqueue_frame(&mut self, ctx: &Ctx, frame: Frame, chan: u32, policy: Option<Overflow>) -> bool {
        if !self.state.can_write() {
            return false;
        }
        if chan != NO_CHAN && self.replaying() {
            match self.hold_for_replay(ctx, chan, &frame, policy) {
                replay::Held::Queued => return true,
                replay::Held::Overflow => {
                    ctx.stats.overflow(0, self.queue.bytes() as u64);
                    self.close_slow(ctx, "replay backlog".into());
                    return false;
                }
                replay::Held::NotReplaying => {}
            }
        }
        match self.queue.offer(ctx, frame, chan, policy) {
            queue::Offer::Queued => true,
            queue::Offer::Dropped => false,
            queue::Offer::Overflow => {
                let limit = format!(
                    "queue_max_bytes={},queue_max_messages={}",
                    ctx.cfg.queue_max_bytes, ctx.cfg.queue_max_messages
                );
                self.close_slow(ctx, limit.into());
                false
            }
        }
    }

    /// Closes a slow subscriber: 1013 with the [`CloseReason::slow`] naming `limit`, the queued
    /// data dropped and the close frame first.
    fn close_slow(&mut self, ctx: &Ctx, limit: std::borrow::Cow<'static, str>) {
        self.close(ctx, CloseCode::Again, &CloseReason::slow(limit).to_json(), ReapReason::Overflow);
    }

    /// Queues a reply (ack, error, pong, subscribed …); it overflows like `disconnect`.
    pub fn reply(&mut self, ctx: &Ctx, frame: Bytes) -> bool {
        self.enqueue(ctx, frame, NO_CHAN, None)
    }

    /// Fills `iov` with the queued bytes, front first; returns how many slices it filled (0
    /// when nothing is queued). The caller writes them and reports with
    /// [`Session::transmitted`].
    pub fn poll_transmit<'a>(&'a self, iov: &mut [std::io::IoSlice<'a>]) -> usize {
        self.queue.fill(iov)
    }

    /// `n` bytes of what [`Session::poll_transmit`] offered were written at `now`. A drained
    /// queue gives its memory back at once, so an idle connection owns no queue buffer (a
    /// busy subscriber pays one small allocation per burst instead, next to its `sendmsg`).
    pub fn transmitted(&mut self, n: usize, now: Tick) {
        self.queue.advance(n);
        if self.queue.is_empty() {
            self.last_drained = now;
            self.queue.shrink_idle();
            if self.is_sse() {
                // The heartbeat left with the rest: the stream's answer to it (`sse.rs`).
                self.flags.clear(Flags::AWAIT_PONG);
            }
        }
    }

    /// Whether TCP should be half-closed now: everything is written while finishing. Moves to
    /// lingering (input read and dropped until the peer's FIN or the close deadline).
    pub fn poll_fin(&mut self, ctx: &Ctx) -> bool {
        if self.state != State::Finishing || !self.queue.is_empty() {
            return false;
        }
        self.state = State::Lingering;
        self.reap.get_or_insert(ReapReason::Close);
        self.deadline = ctx.now.wrapping_add(ctx.cfg.close_timeout);
        true
    }

    // ---- closes ----

    /// Starts the close handshake from our side (RFC 6455 §7.1.2): the close frame goes out
    /// (ahead of the queued data, which is dropped, when `why` is an overflow), then we wait for
    /// the peer's close until `limits.close_timeout_ms`.
    pub fn close(&mut self, ctx: &Ctx, code: CloseCode, reason: &str, why: ReapReason) {
        if !self.state.can_write() {
            return;
        }
        if why == ReapReason::Overflow {
            self.queue.clear();
        }
        if self.is_sse() {
            return self.end_stream(ctx, code, reason, why);
        }
        self.queue.push(codec::close_frame(code, reason), NO_CHAN);
        self.state = State::ClosingByUs;
        self.reap = Some(why);
        ctx.stats.close(code);
        self.deadline = ctx.now.wrapping_add(ctx.cfg.close_timeout);
    }

    /// Fails the connection (RFC 6455 §7.1.7): a close frame with the violation's code, then
    /// FIN once it is written, without waiting for the peer's close.
    pub fn fail(&mut self, ctx: &Ctx, v: Violation) {
        if !self.state.can_write() {
            self.kill(ReapReason::Protocol);
            return;
        }
        self.queue.push(codec::close_frame(v.code, v.reason), NO_CHAN);
        self.reap = Some(ReapReason::Protocol);
        ctx.stats.close(v.code);
        self.finish(ctx);
    }

    pub(super) fn finish(&mut self, ctx: &Ctx) {
        self.state = State::Finishing;
        self.deadline = ctx.now.wrapping_add(ctx.cfg.close_timeout);
    }
}

#[cfg(test)]
mod size {
    #[test]
    fn session_record_stays_compact() {
        // The per-connection cost at C1M: the server's slab record (`Conn`) is this plus its
        // socket, generation, subscription list and timer entry, 168 bytes in all (its own
        // test); keep this part small (see benches/density).
        let size = std::mem::size_of::<super::Session>();
        eprintln!("Session (the protocol part of a connection's record): {size} bytes");
        assert!(size <= 120, "Session is {size} bytes");
    }

    #[test]
    fn queue_entry_is_a_pointer_and_a_channel() {
        // Written once per delivery and read back once per send: 16 bytes, not 40.
        assert_eq!(std::mem::size_of::<super::queue::Out>(), 16);
    }
}
