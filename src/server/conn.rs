//! The core's record of one connection (`Conn`, one per slab entry): the sans-IO
//! [`Session`] (tether-proto) beside what only the I/O owner keeps — the socket, the slab
//! generation, the subscription list, the timer entry and the readiness conditions
//! ([`IoFlags`]). The peer's address is asked of the socket here, when a log line or a status
//! row needs it; the session never knows it.
//!
//! The record's size is the per-connection cost at C1M (168 bytes, checked by
//! `conn_record_stays_compact`; benches/density measures it with the kernel's share).

use std::net::SocketAddr;
use std::os::fd::RawFd;

use smallvec::SmallVec;

use crate::config::Config;
use crate::session::limits::Rates;
use crate::session::{Session, SessionConfig};
use crate::tick::{ticks, Tick};

/// A connection's address on its core: slab key plus a generation that changes whenever the
/// slot is reused, so a stale id (a message for a connection that already left) misses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId {
    /// Slab key.
    pub key: u32,
    /// Generation of the slot when the connection was accepted.
    pub gen: u32,
}

impl ConnId {
    /// A tombstone in a channel's subscriber list.
    pub const DEAD: ConnId = ConnId { key: u32::MAX, gen: u32::MAX };
}

/// One subscription of a connection: the local channel and the position of this connection in
/// that channel's subscriber list ([`PENDING`] until the home confirms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubEntry {
    /// Index into the core's local channel table.
    pub chan: u32,
    /// Index into that channel's subscriber list, or [`PENDING`] / [`CANCELLED`].
    pub pos: u32,
}

/// Position of a subscription still waiting for its `Subscribed` answer.
pub const PENDING: u32 = u32::MAX;
/// Position of a subscription unsubscribed while still pending: it stays in the list (in
/// request order) until its answer arrives, so each answer meets the request it answers.
pub const CANCELLED: u32 = u32::MAX - 1;

impl SubEntry {
    /// Whether the home confirmed this subscription (it sits in a subscriber list).
    pub fn is_active(&self) -> bool {
        self.pos < CANCELLED
    }
}

/// Conditions of a connection that only its I/O owner tracks (written, readable, listed), one
/// bit each; the session's own are `session::Flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoFlags(u8);

impl IoFlags {
    /// Queued frames wait for the socket to become writable.
    pub const WANT_WRITE: IoFlags = IoFlags(1);
    /// In the core's dirty list: frames were queued in this pass and await a flush.
    pub const DIRTY: IoFlags = IoFlags(2);
    /// The connection has published: its reads pause while the server is overloaded.
    pub const PUBLISHER: IoFlags = IoFlags(4);
    /// Reads paused for overload; listed in the core's held list until woken.
    pub const HELD: IoFlags = IoFlags(8);
    /// The socket reported input that was not read yet (its reads were held, or its read
    /// budget ran out, or its session stopped decoding for the turn): read when the core's
    /// reactor revisits it unheld. Readiness is edge-triggered, so this bit is what remembers
    /// it.
    pub const READ_PENDING: IoFlags = IoFlags(16);
    /// Listed in the core reactor's ready list (listed once).
    pub const READY: IoFlags = IoFlags(32);
    /// The socket reported the end of its input (`EPOLLRDHUP`/`EPOLLHUP`: the peer's FIN, or
    /// `EPOLLERR`). Sticky: the report that carries it may also carry the last bytes, and
    /// readiness is edge-triggered, so no later report comes; the read that drains those bytes
    /// must go on to the `recv` that returns 0 (or the error) instead of stopping at a short
    /// read (docs/architecture.md, "Readiness").
    pub const INPUT_ENDED: IoFlags = IoFlags(64);
    /// Accepted on a TLS listener: its bytes pass through its [`TlsConn`] in the core's side
    /// table (`server::tls`), which a plain connection does not have.
    ///
    /// [`TlsConn`]: super::tls::TlsConn
    pub const TLS: IoFlags = IoFlags(128);

    /// Whether every bit of `f` is set.
    pub fn has(self, f: IoFlags) -> bool {
        self.0 & f.0 == f.0
    }

    /// Sets the bits of `f`.
    pub fn set(&mut self, f: IoFlags) {
        self.0 |= f.0;
    }

    /// Clears the bits of `f`.
    pub fn clear(&mut self, f: IoFlags) {
        self.0 &= !f.0;
    }
}

/// One connection in its core's slab (see the module docs).
pub struct Conn {
    /// The protocol state: everything the connection decides.
    pub session: Session,
    /// Channels this connection is subscribed to (usually one or two).
    pub subs: SmallVec<[SubEntry; 2]>,
    /// Generation of the slab slot (see [`ConnId`]).
    pub gen: u32,
    /// The socket (owned: closed when the core tears the connection down).
    pub fd: RawFd,
    /// The deadline the core's timer wheel holds an entry for (the session's
    /// [`Session::poll_timeout`] when it was filed).
    pub armed: Tick,
    /// What the I/O owner tracks.
    pub io: IoFlags,
}

impl Conn {
    /// A connection accepted on socket `fd` at `now` into a slot of generation `gen`: its
    /// session speaks HTTP, and `armed` is its handshake deadline, which the caller files.
    pub fn new(gen: u32, fd: RawFd, now: Tick, cfg: &SessionConfig) -> Conn {
        let session = Session::new(now, cfg);
        let armed = session.poll_timeout();
        Conn { session, subs: SmallVec::new(), gen, fd, armed, io: IoFlags::default() }
    }

    /// The peer's address, asked of the kernel (`getpeername`; not stored: it would cost every
    /// connection 32 bytes for a log line).
    pub fn peer(&self) -> Option<SocketAddr> {
        super::io::peer_addr(self.fd)
    }

    /// The address the peer connected to (`getsockname`), if still known.
    pub fn local(&self) -> Option<SocketAddr> {
        super::io::local_addr(self.fd)
    }
}

/// The session limits of `cfg`, with durations in ticks.
pub fn session_config(cfg: &Config) -> SessionConfig {
    let l = &cfg.limits;
    let p = &l.per_connection;
    let rates = Rates {
        publish_rate: p.publish_rate as u64,
        publish_bytes_rate: p.publish_bytes_rate,
        control_frames_rate: p.control_frames_rate as u64,
        subscribe_rate: p.subscribe_rate as u64,
        refresh_rate: p.refresh_rate as u64,
        bad_request_rate: p.bad_request_rate as u64,
        presence_rate: p.presence_rate as u64,
        ..Rates::default()
    };
    SessionConfig {
        ping_interval: ticks(cfg.heartbeat.ping_interval_ms).max(1),
        pong_timeout: ticks(cfg.heartbeat.pong_timeout_ms).max(1),
        close_timeout: ticks(l.close_timeout_ms),
        handshake_timeout: ticks(l.handshake_timeout_ms),
        queue_max_bytes: l.queue_max_bytes,
        queue_max_messages: l.queue_max_messages,
        max_message_bytes: l.max_message_bytes,
        max_header_bytes: l.max_header_bytes,
        max_publish_bytes: l.max_publish_bytes,
        rates: rates.with_bursts(p.max_subscriptions, l.max_message_bytes),
        token_refresh_grace: cfg.auth.as_ref().map_or(0, |a| ticks(a.token_refresh_grace_ms)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_record_stays_compact() {
        // The per-connection cost at C1M: keep the slab entry at most 168 bytes (its size
        // before the session moved into tether-proto; see benches/density).
        let size = std::mem::size_of::<Conn>();
        eprintln!("Conn (the per-connection record): {size} bytes");
        assert!(size <= 168, "Conn is {size} bytes");
    }

    #[test]
    fn session_config_takes_every_limit_and_the_derived_bursts() {
        let mut cfg = Config::default();
        cfg.heartbeat.ping_interval_ms = 1000;
        cfg.limits.per_connection.publish_bytes_rate = 10;
        cfg.limits.per_connection.subscribe_rate = 5;
        let s = session_config(&cfg);
        assert_eq!(s.ping_interval, ticks(1000));
        assert_eq!(s.rates.publish_bytes_burst, cfg.limits.max_message_bytes as u64, "at least one message");
        assert_eq!(s.rates.subscribe_burst, 2 * cfg.limits.per_connection.max_subscriptions as u64);
        assert_eq!(s.max_message_bytes, cfg.limits.max_message_bytes);
    }
}
