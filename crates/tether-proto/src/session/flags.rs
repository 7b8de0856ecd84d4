//! [`Flags`]: the conditions of a session orthogonal to its lifecycle ([`super::State`]), one
//! bit each, kept in 2 bytes of the session record. What only the I/O owner tracks (written,
//! readable, listed) is the server's, in its own connection record.

/// Conditions orthogonal to the lifecycle, one bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags(pub(super) u16);

impl Flags {
    /// `/echo`: data frames are echoed, not parsed as pub/sub requests.
    pub const ECHO: Flags = Flags(1);
    /// A ping is outstanding; the timer checks liveness at the pong deadline.
    pub const AWAIT_PONG: Flags = Flags(2);
    /// The drain scheduled this connection's close; its deadline means "close now".
    pub const DRAIN: Flags = Flags(4);
    /// Upgraded to WebSocket (counted in the connection gauge until reaped).
    pub const UPGRADED: Flags = Flags(8);
    /// A heartbeat ping went out and no pong came since: the next pong answers it and is not
    /// counted against `control_frames_rate` (unlike [`Flags::AWAIT_PONG`], which any input
    /// clears).
    pub const PONG_DUE: Flags = Flags(16);
    /// The token reached its `exp`: `token_expired` was sent and the refresh grace runs
    /// (docs/security.md).
    pub const TOKEN_EXPIRED: Flags = Flags(32);
    /// The session asks its I/O owner to look at it (it closed, or a hold on its reads
    /// cleared): [`Session::poll_wake`](super::Session::poll_wake).
    pub const WAKE: Flags = Flags(64);
    /// Decoding stopped after [`MESSAGES_PER_TURN`](super::MESSAGES_PER_TURN) messages with
    /// input left: [`Session::poll_turn_ended`](super::Session::poll_turn_ended).
    pub const TURN_ENDED: Flags = Flags(128);
    /// permessage-deflate was negotiated at the upgrade (RFC 7692, no context takeover either
    /// way): fan-out frames are taken in [`Encoding::Deflate`](crate::published::Encoding),
    /// and data frames with RSV1 are inflated.
    pub const DEFLATE: Flags = Flags(256);
    /// A Server-Sent Events stream (`GET /sse`), not a WebSocket: deliveries are events,
    /// heartbeats are comment lines, the end is an `event: close` and FIN (`session/sse.rs`).
    pub const SSE: Flags = Flags(512);

    /// The top two bits: requests counted against the per-connection op rates while no
    /// [`super::limits::Limiter`] exists ([`Flags::free_ops`]).
    const FREE_OPS_SHIFT: u16 = 14;

    /// Requests (`sub`, `unsub`, `refresh`, malformed ones) counted since the connection last
    /// had no limiter, up to [`Flags::MAX_FREE_OPS`]: the first few cost no allocation.
    pub fn free_ops(self) -> u16 {
        self.0 >> Self::FREE_OPS_SHIFT
    }

    /// The most [`Flags::free_ops`] can count.
    pub const MAX_FREE_OPS: u16 = 3;

    /// Sets [`Flags::free_ops`] to `n` (at most [`Flags::MAX_FREE_OPS`]).
    pub fn set_free_ops(&mut self, n: u16) {
        let mask = Self::MAX_FREE_OPS << Self::FREE_OPS_SHIFT;
        self.0 = (self.0 & !mask) | ((n.min(Self::MAX_FREE_OPS)) << Self::FREE_OPS_SHIFT);
    }

    /// Whether every bit of `f` is set.
    pub fn has(self, f: Flags) -> bool {
        self.0 & f.0 == f.0
    }

    /// Sets the bits of `f`.
    pub fn set(&mut self, f: Flags) {
        self.0 |= f.0;
    }

    /// Clears the bits of `f`.
    pub fn clear(&mut self, f: Flags) {
        self.0 &= !f.0;
    }
}
