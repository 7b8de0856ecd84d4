//! The compact per-connection state kept in each core's slab, and its outbound queue.
//!
//! A connection is ids and counters: no read buffer while idle (reads go to the core's scratch
//! buffer; only the tail of a partial frame is kept), no write buffer (the queue holds shared
//! `Bytes` frames, each encoded once for every subscriber).

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::task::Waker;

use bytes::Bytes;
use smallvec::SmallVec;

use super::bus::HttpWait;
use super::metrics::ReapReason;
use crate::ws::codec::Decoder;

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

/// Lifecycle of a connection (RFC 6455 §7 close handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Plain HTTP: reading a request head (handshake or an API request).
    Http,
    /// Upgraded; frames flow both ways.
    Open,
    /// We sent a close frame and wait for the peer's (until the close deadline); inbound data
    /// frames are discarded, nothing but the queued tail and the close frame goes out.
    ClosingByUs,
    /// Close frames were exchanged (or the connection failed, RFC 6455 §7.1.7): once the queue
    /// is written we send FIN.
    Flushing,
    /// FIN sent: input is read and discarded until the peer's FIN (or the close deadline), so
    /// unread input never turns our close into a reset that could destroy the close frame.
    Lingering,
}

impl Phase {
    /// Whether new frames may be queued.
    pub fn can_write(self) -> bool {
        matches!(self, Phase::Open)
    }

}

/// The task must tear the connection down now (closing TCP without waiting).
pub const KILL: u16 = 1;
/// Queued frames wait for the socket to become writable (the task polls writability).
pub const WANT_WRITE: u16 = 2;
/// In the processor's dirty list: frames were queued in this pass and await a flush.
pub const DIRTY: u16 = 4;
/// `/echo` endpoint: data frames are echoed, not parsed as pub/sub requests.
pub const ECHO: u16 = 8;
/// A ping is outstanding; the timer checks liveness at the pong deadline.
pub const AWAIT_PONG: u16 = 16;
/// The drain scheduled this connection's close; the timer entry means "close now".
pub const DRAIN: u16 = 32;
/// The HTTP answer in `reply` is complete.
pub const REPLY_READY: u16 = 64;
/// At least one HTTP request was answered on this connection (its timeout is an idle one).
pub const HTTP_SERVED: u16 = 128;

/// The connection was upgraded to WebSocket (counted in the gauge until reaped).
pub const UPGRADED: u16 = 256;
/// An HTTP publish is waiting for its home core's answer; no further request is parsed.
pub const AWAITING: u16 = 512;
/// The HTTP request being answered asked for keep-alive.
pub const KEEP_ALIVE: u16 = 1024;

/// The connection has published: its reads pause while the server is overloaded.
pub const PUBLISHER: u16 = 2048;
/// Reads paused for overload; listed in the core's `held` until woken.
pub const HELD: u16 = 4096;
/// `100 Continue` was sent for the HTTP request being read (RFC 9110 §10.1.1: once).
pub const CONTINUED: u16 = 8192;
/// The HTTP request being answered is a `HEAD`: its answer goes without content.
pub const HEAD_ONLY: u16 = 16384;

/// Tag for queued frames that belong to no channel (replies, pongs, close frames).
pub const NO_CHAN: u32 = u32::MAX;

/// One queued outbound frame and the local channel it belongs to (for overflow policies).
#[derive(Debug)]
pub struct Out {
    /// The complete encoded frame, shared with every other subscriber.
    pub frame: Bytes,
    /// Local channel index, or [`NO_CHAN`].
    pub chan: u32,
}

/// One subscription of a connection: the local channel and the position of this connection in
/// that channel's subscriber list ([`PENDING`] until the home core confirms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubEntry {
    /// Index into the core's local channel table.
    pub chan: u32,
    /// Index into that channel's subscriber list, or [`PENDING`].
    pub pos: u32,
}

/// Position of a subscription still waiting for its `Subscribed` reply.
pub const PENDING: u32 = u32::MAX;
/// Position of a subscription unsubscribed while still pending: it stays in the list (in
/// request order) until its reply arrives, so each reply meets the request it answers.
pub const CANCELLED: u32 = u32::MAX - 1;

impl SubEntry {
    /// Whether the home core confirmed this subscription (it sits in a subscriber list).
    pub fn is_active(&self) -> bool {
        self.pos < CANCELLED
    }
}

/// A connection's state in its core's slab.
pub struct Conn {
    /// Generation (see [`ConnId`]).
    pub gen: u32,
    /// The socket; owned by the connection's task, which closes it after removing this entry.
    pub fd: RawFd,
    /// Lifecycle.
    pub phase: Phase,
    /// Bit set of [`KILL`], [`WANT_WRITE`], [`DIRTY`] ….
    pub flags: u16,
    /// Why the connection ends, once decided.
    pub reap: Option<ReapReason>,
    /// Outbound frames not yet fully written; the front may be partly written.
    pub out: VecDeque<Out>,
    /// Bytes in `out`, minus the written part of the front.
    pub out_bytes: usize,
    /// Bytes of the front frame already written.
    pub out_offset: usize,
    /// Channels this connection is subscribed to (usually one or two).
    pub subs: SmallVec<[SubEntry; 2]>,
    /// The connection task's waker, to hand it work (kill, wait for writability, a reply).
    pub waker: Option<Waker>,
    /// RFC 6455 frame decoder (fragment assembly only while a message is in progress).
    pub decoder: Decoder,
    /// Unconsumed input: a partial frame or request head. Empty (unallocated) when idle.
    pub pending_in: Vec<u8>,
    /// Tick of this connection's one timer entry.
    pub timer_due: u32,
    /// Tick of the last inbound bytes (liveness).
    pub last_rx: u32,
    /// Tick of the last ping sent.
    pub ping_sent: u32,
    /// Tick at which the outbound queue was last empty.
    pub last_drained: u32,
    /// What an HTTP request waits for (a publish result, inspection rows), filled in by the
    /// processor.
    pub reply: Option<Box<HttpWait>>,
    /// Resume replays in progress, in order (usually none).
    pub replays: Option<Box<Vec<super::replay::Replay>>>,
}

impl Conn {
    /// A connection accepted at tick `now`.
    pub fn new(gen: u32, fd: RawFd, now: u32) -> Conn {
        Conn {
            gen,
            fd,
            phase: Phase::Http,
            flags: 0,
            reap: None,
            out: VecDeque::new(),
            out_bytes: 0,
            out_offset: 0,
            subs: SmallVec::new(),
            waker: None,
            decoder: Decoder::new(),
            pending_in: Vec::new(),
            timer_due: 0,
            last_rx: now,
            ping_sent: now,
            last_drained: now,
            reply: None,
            replays: None,
        }
    }

    /// The peer's address, asked of the kernel (not stored: it would cost every connection
    /// 32 bytes for a debugging view).
    pub fn peer(&self) -> Option<SocketAddr> {
        // SAFETY: fd is open while the entry exists; the borrow does not outlive this call.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) };
        socket2::SockRef::from(&fd).peer_addr().ok()?.as_socket()
    }

    /// Wakes the connection's task.
    pub fn wake(&self) {
        if let Some(w) = &self.waker {
            w.wake_by_ref();
        }
    }

    /// Marks the connection for immediate teardown by its task.
    pub fn kill(&mut self, why: ReapReason) {
        self.reap.get_or_insert(why);
        self.flags |= KILL;
        self.wake();
    }

    /// Appends a frame without limit checks (callers apply the overflow policy first).
    pub fn push(&mut self, frame: Bytes, chan: u32) {
        self.out_bytes += frame.len();
        self.out.push_back(Out { frame, chan });
    }

    /// Drops every queued frame except the unwritten rest of a partly written front frame
    /// (cutting a frame in half would corrupt the stream).
    pub fn clear_queue(&mut self) {
        let keep = if self.out_offset > 0 { self.out.pop_front() } else { None };
        self.out.clear();
        self.out_bytes = 0;
        if let Some(f) = keep {
            self.out_bytes = f.frame.len() - self.out_offset;
            self.out.push_back(f);
        }
    }

    /// Writes queued frames with one `sendmsg` per up to 64 frames until the queue is empty
    /// (`Ok(true)`) or the socket is full (`Ok(false)`). Errors are the peer's (reset, broken
    /// pipe): the caller reaps.
    pub fn flush(&mut self) -> io::Result<bool> {
        const MAX_IOV: usize = 64;
        while !self.out.is_empty() {
            let mut iov: [libc::iovec; MAX_IOV] = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOV];
            let mut n_iov = 0;
            for (i, o) in self.out.iter().take(MAX_IOV).enumerate() {
                let skip = if i == 0 { self.out_offset } else { 0 };
                iov[i] = libc::iovec { iov_base: o.frame[skip..].as_ptr() as *mut _, iov_len: o.frame.len() - skip };
                n_iov += 1;
            }
            // SAFETY: msghdr is plain data; iov points into Bytes kept alive by self.out for the call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = n_iov as _;
            // SAFETY: fd is open while this entry exists (the task closes it after removal).
            let r = unsafe { libc::sendmsg(self.fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(false),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            let mut written = r as usize;
            self.out_bytes -= written;
            while written > 0 {
                let front_left = self.out[0].frame.len() - self.out_offset;
                if written >= front_left {
                    written -= front_left;
                    self.out.pop_front();
                    self.out_offset = 0;
                } else {
                    self.out_offset += written;
                    written = 0;
                }
            }
        }
        Ok(true)
    }
}

/// Non-blocking `recv` into `buf`: `Ok(0)` is EOF, `WouldBlock` means no data now.
pub fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a valid writable slice; fd is open (see Conn::fd).
        let r = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut _, buf.len(), libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_record_stays_compact() {
        // The per-connection cost at C1M: keep the slab entry small (see benches/density).
        let size = std::mem::size_of::<Conn>();
        eprintln!("Conn: {size} bytes");
        assert!(size <= 256, "Conn is {size} bytes");
    }
}
