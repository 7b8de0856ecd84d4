//! [`Flags`]: the conditions of a connection orthogonal to its lifecycle ([`super::State`]),
//! one bit each, kept in 2 bytes of the session record.

/// Conditions orthogonal to the lifecycle, one bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags(pub(super) u16);

impl Flags {
    /// Queued frames wait for the socket to become writable.
    pub const WANT_WRITE: Flags = Flags(1);
    /// In the core's dirty list: frames were queued in this pass and await a flush.
    pub const DIRTY: Flags = Flags(2);
    /// `/echo`: data frames are echoed, not parsed as pub/sub requests.
    pub const ECHO: Flags = Flags(4);
    /// A ping is outstanding; the timer checks liveness at the pong deadline.
    pub const AWAIT_PONG: Flags = Flags(8);
    /// The drain scheduled this connection's close; its deadline means "close now".
    pub const DRAIN: Flags = Flags(16);
    /// Upgraded to WebSocket (counted in the connection gauge until reaped).
    pub const UPGRADED: Flags = Flags(32);
    /// The connection has published: its reads pause while the server is overloaded.
    pub const PUBLISHER: Flags = Flags(64);
    /// Reads paused for overload; listed in the core's held list until woken.
    pub const HELD: Flags = Flags(128);
    /// A heartbeat ping went out and no pong came since: the next pong answers it and is not
    /// counted against `control_frames_rate` (unlike [`Flags::AWAIT_PONG`], which any input
    /// clears).
    pub const PONG_DUE: Flags = Flags(256);
    /// The token reached its `exp`: `token_expired` was sent and the refresh grace runs
    /// (docs/security.md).
    pub const TOKEN_EXPIRED: Flags = Flags(512);
    /// The socket reported input that was not read yet (its reads were held, or its read
    /// budget ran out): read when the core's reactor revisits it unheld. Readiness is
    /// edge-triggered, so this bit is what remembers it.
    pub const READ_PENDING: Flags = Flags(1024);
    /// The session asks its I/O owner to look at it (it closed, or a hold on its reads
    /// cleared); the core hands this to its reactor after each session call.
    pub const WAKE: Flags = Flags(2048);
    /// Listed in the core reactor's ready list (listed once).
    pub const READY: Flags = Flags(4096);
    /// The socket reported the end of its input (`EPOLLRDHUP`/`EPOLLHUP`: the peer's FIN, or
    /// `EPOLLERR`). Sticky: the report that carries it may also carry the last bytes, and
    /// readiness is edge-triggered, so no later report comes; the read that drains those bytes
    /// must go on to the `recv` that returns 0 (or the error) instead of stopping at a short
    /// read (docs/architecture.md, "Readiness").
    pub const INPUT_ENDED: Flags = Flags(8192);

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
