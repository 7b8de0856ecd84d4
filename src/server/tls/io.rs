//! A TLS connection's reads and writes (docs/architecture.md, "TLS"): the core's read scratch
//! buffer holds the received records while they are opened in place (by rustls during the
//! handshake, `tls::handshake`; by tether's record layer after it, [`super::record`]); the
//! session's queued frames are copied straight into records in a per-core ciphertext buffer,
//! sealed in place and written from there. What the socket does not take, and a record that
//! has not fully arrived, are the only bytes kept per connection.

use std::cell::RefCell;
use std::io::{self, IoSlice};

use super::handshake::failure_of;
use super::record::{self, Expanded, Inbound, Layer, APPLICATION_DATA, MAX_PLAIN};
use super::{Failure, Phase, TlsConn};
use crate::server::conn::{Conn, ConnId, IoFlags};
use crate::server::core::CoreState;
use crate::server::io as sock;
use crate::session::queue::MAX_IOV;
use crate::session::replay::Fetch;
use crate::session::{Ctx, ReapReason, Session};

/// Size of the per-core ciphertext buffer the session's frames are sealed into, record by
/// record in place: four records of up to 16 KiB of plaintext (RFC 8446 §5.1) and their
/// overhead, a little less for the last one.
const SEALED_BYTES: usize = 64 * 1024;

thread_local! {
    /// The core's ciphertext buffer (one per core thread; no connection holds it).
    static SEAL: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; SEALED_BYTES].into_boxed_slice());
}

/// What writing a connection's pending ciphertext came to.
pub(super) enum Wrote {
    /// All of it is written (nothing is kept any more).
    All,
    /// The socket is full; the rest waits for its output edge.
    Blocked,
    /// The socket failed (reset, broken pipe).
    Failed,
}

/// Writes what `t` keeps of its ciphertext; frees the buffer once written, then sends the FIN
/// that waited for it.
pub(super) fn write_output(t: &mut TlsConn, fd: i32) -> Wrote {
    while !t.output.is_empty() {
        match sock::send(fd, &[IoSlice::new(t.output.bytes())]) {
            Ok(n) => t.output.consume(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Wrote::Blocked,
            Err(_) => return Wrote::Failed,
        }
    }
    t.output.clear();
    if t.has(TlsConn::FIN_OWED) {
        t.flags &= !TlsConn::FIN_OWED;
        sock::shutdown_write(fd);
    }
    Wrote::All
}

/// The state of a connection's records after the received ones were processed.
pub(super) enum Records {
    /// Waiting for more input (the handshake, or the next record).
    More,
    /// The handshake is done and rustls has nothing left to encode: its keys can be taken.
    Traffic,
    /// The peer sent close_notify: no more input will come.
    PeerClosed,
    /// The connection failed (the alert, if any, was sent): why.
    Failed(String),
}

impl CoreState {
    /// Reads a TLS connection `id` on socket `fd` into `scratch` (the core's read buffer),
    /// after what the last read left of a partial record, and hands each decrypted record to
    /// the session; at most `reads` buffers (then it is listed for the reactor's next pass, as
    /// a plain connection is). Handshake records are answered as they come.
    pub(in crate::server) fn read_tls(&mut self, id: ConnId, fd: i32, scratch: &mut [u8], reads: usize) {
        let Some(mut t) = self.tls.take(id.key) else { return };
        let again = self.read_records(id, fd, &mut t, scratch, reads);
        if self.conn(id).is_none() {
            self.metrics().tls.connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        self.tls.put(id.key, t);
        self.flush(id);
        if again {
            if let Some(c) = self.conns.slab.get_mut(id.key as usize).filter(|c| c.gen == id.gen) {
                c.io.set(IoFlags::READ_PENDING);
                self.reactor.schedule(id, c);
            }
        }
    }

    /// [`CoreState::read_tls`] with the state `t` taken out; returns whether the read budget
    /// ran out with input left.
    fn read_records(&mut self, id: ConnId, fd: i32, t: &mut TlsConn, scratch: &mut [u8], reads: usize) -> bool {
        for _ in 0..reads {
            let held = t.input.len();
            if held >= scratch.len() / 2 {
                // No record is this long (RFC 8446 §5.2: 2^14 + 256; RFC 5246 §6.2.3: 2^14 +
                // 2048); the record layer refuses one first.
                self.tls_failed(id, fd, t, Failure::Protocol, "a record longer than any TLS record");
                return false;
            }
            scratch[..held].copy_from_slice(t.input.bytes());
            let n = match sock::recv(fd, &mut scratch[held..]) {
                Ok(0) => {
                    self.end(id, ReapReason::Eof);
                    return false;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(_) => {
                    self.end(id, ReapReason::Reset);
                    return false;
                }
            };
            t.input.clear();
            let first = (!t.has(TlsConn::ESTABLISHED)).then_some(scratch[0]);
            let (used, records) = self.process(id, fd, t, &mut scratch[..held + n]);
            match records {
                Records::More | Records::Traffic => {}
                Records::PeerClosed => {
                    self.end(id, ReapReason::Eof);
                    return false;
                }
                Records::Failed(e) => {
                    let why = if t.has(TlsConn::ESTABLISHED) { Failure::Protocol } else { failure_of(first) };
                    self.tls_failed(id, fd, t, why, &e);
                    return false;
                }
            }
            if used < held + n {
                t.input.set(&scratch[used..held + n]);
            }
            let Some(c) = self.conn(id).filter(|c| !c.session.is_closed()) else { return false };
            if c.io.has(IoFlags::READ_PENDING) {
                // The session's turn ended: the rest waits for the reactor's next pass.
                return true;
            }
            if n < scratch.len() - held {
                // As for a plain connection (`CoreState::on_readable`): a short read took
                // everything, unless the peer's FIN came with these bytes.
                if c.io.has(IoFlags::INPUT_ENDED) && !crate::server::reactor::read_held(self, id) {
                    continue;
                }
                if let Some(c) = self.conn(id).filter(|c| c.io.has(IoFlags::INPUT_ENDED)) {
                    c.io.set(IoFlags::READ_PENDING);
                }
                return false;
            }
        }
        true
    }

    /// Processes the records in `buf`: decrypted application data goes to the session,
    /// handshake records are answered. Returns how many bytes of `buf` are done with (the
    /// rest is a record still arriving) and the state reached. A handshake that completed on
    /// the way is counted, even when the peer's close_notify came right behind its Finished
    /// (as from a client that only connects), and its keys are handed over to tether's record
    /// layer, which goes on with the rest of `buf`.
    fn process(&mut self, id: ConnId, fd: i32, t: &mut TlsConn, buf: &mut [u8]) -> (usize, Records) {
        let mut used = 0;
        if let Phase::Handshake(_) = t.phase {
            let (n, r) = self.handshake(id, fd, t, buf);
            let done = match &t.phase {
                Phase::Handshake(c) => !c.is_handshaking(),
                _ => true,
            };
            if done && !t.has(TlsConn::ESTABLISHED) {
                t.flags |= TlsConn::ESTABLISHED;
                let v = usize::from(t.version() != Some(rustls::ProtocolVersion::TLSv1_3));
                self.metrics().tls.handshakes[v].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if !matches!(r, Records::Traffic) {
                return (n, r);
            }
            if let Err(why) = self.hand_over(t) {
                return (n, Records::Failed(why));
            }
            used = n;
        }
        let (n, r) = self.open_records(id, fd, t, &mut buf[used..]);
        (used + n, r)
    }

    /// Opens the whole records at the start of `buf` with tether's record layer: application
    /// data goes to the session; a KeyUpdate's answer is queued in `t.output` (written by the
    /// flush that follows the read); a fatal condition sends its alert. Returns how many bytes
    /// are done with and the state reached.
    fn open_records(&mut self, id: ConnId, fd: i32, t: &mut TlsConn, buf: &mut [u8]) -> (usize, Records) {
        let TlsConn { phase, output, .. } = t;
        let Phase::Traffic(layer) = phase else {
            return (0, Records::Failed("no record layer after the handshake".into()));
        };
        let mut x = Expanded::default();
        // Answers (a KeyUpdate, an alert): no allocation unless one is made.
        let mut reply = Vec::new();
        let mut used = 0;
        let state = loop {
            let len = match layer.record_len(&buf[used..]) {
                Ok(Some(len)) => len,
                Ok(None) => break Records::More,
                Err(f) => break fail(layer, &mut x, f, &mut reply),
            };
            let rec = &mut buf[used..used + len];
            used += len;
            match layer.open(&mut x, rec, &mut reply) {
                Ok(Inbound::Data(p)) => {
                    if !p.is_empty() && self.conn(id).is_some_and(|c| !c.session.is_closed()) {
                        self.on_bytes(id, p);
                    }
                }
                Ok(Inbound::Handled) => {}
                Ok(Inbound::Closed) => break Records::PeerClosed,
                Err(f) => break fail(layer, &mut x, f, &mut reply),
            }
        };
        if !reply.is_empty() {
            output.vec().extend_from_slice(&reply);
        }
        if let Records::Failed(_) = state {
            // No close_notify after a fatal alert.
            t.flags |= TlsConn::CLOSE_NOTIFY;
            let _ = write_output(t, fd);
        }
        (used, state)
    }

    /// Counts and logs a failed TLS connection and ends it (a protocol error: its alert, if any,
    /// was sent).
    fn tls_failed(&mut self, id: ConnId, fd: i32, t: &mut TlsConn, why: Failure, reason: &str) {
        if !t.has(TlsConn::ESTABLISHED) {
            t.flags |= TlsConn::FAILED;
            self.metrics().tls.failed(why);
        }
        crate::server::events::tls_failed(self.me, Some(fd), why.label(), reason);
        self.end(id, ReapReason::Protocol);
    }
}

/// Seals the alert of the fatal condition `f` (when it takes one) into `reply`; the state it
/// ends the connection in.
fn fail(layer: &mut Layer, x: &mut Expanded, f: record::Fatal, reply: &mut Vec<u8>) -> Records {
    if let Some(a) = f.alert {
        let _ = layer.alert(x, a, true, reply);
    }
    Records::Failed(f.why)
}

/// Why the send path stopped a connection.
enum Stop {
    /// The socket failed, or records could not be sealed (the handshake is not done).
    Reset,
    /// TLS 1.2 reached its key's confidentiality limit (it has no KeyUpdate): close_notify.
    Spent,
}

/// The send path of a TLS connection (called by `CoreState::flush_at` for a connection with
/// [`IoFlags::TLS`]): its kept ciphertext first, then what its session queued, sealed record
/// by record into the core's ciphertext buffer and written from there (a KeyUpdate first when
/// the key reached its limit); then, when the session is finishing and all is written,
/// close_notify and the FIN. The keys are expanded once for the whole call. A full socket sets
/// [`IoFlags::WANT_WRITE`]; an error kills the session (reset).
pub(in crate::server) fn transmit(t: &mut TlsConn, c: &mut Conn, ctx: &Ctx, fetch: &mut Option<Fetch>) {
    let fd = c.fd;
    let mut x = Expanded::default();
    loop {
        match write_output(t, fd) {
            Wrote::All => {}
            Wrote::Blocked => return c.io.set(IoFlags::WANT_WRITE),
            Wrote::Failed => return c.session.kill(ReapReason::Reset),
        }
        let sent = SEAL.with(|buf| {
            let out = &mut buf.borrow_mut()[..];
            let Phase::Traffic(layer) = &mut t.phase else {
                // Nothing but handshake records before the hand-over.
                let mut iov = [IoSlice::new(&[]); 1];
                return if c.session.poll_transmit(&mut iov) == 0 { Ok(false) } else { Err(Stop::Reset) };
            };
            let (taken, n) = seal_session(&c.session, layer, &mut x, out)?;
            if n == 0 {
                return Ok(false);
            }
            if taken > 0 {
                c.session.transmitted(taken, ctx.now);
            }
            match sock::send(fd, &[IoSlice::new(&out[..n])]) {
                Ok(w) if w < n => t.output.vec().extend_from_slice(&out[w..n]),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => t.output.vec().extend_from_slice(&out[..n]),
                Err(_) => return Err(Stop::Reset),
            }
            Ok(true)
        });
        match sent {
            Ok(true) => continue,
            Ok(false) => {
                // Everything is written: a resume replay refills the queue.
                let (queued, f) = c.session.pump_replay(ctx);
                *fetch = fetch.take().or(f);
                if queued {
                    continue;
                }
                break;
            }
            Err(Stop::Reset) => return c.session.kill(ReapReason::Reset),
            Err(Stop::Spent) => {
                tracing::info!(fd, "TLS 1.2 connection closed: its key reached the confidentiality limit");
                close_notify(t);
                let _ = write_output(t, fd);
                return c.session.kill(ReapReason::Close);
            }
        }
    }
    if t.output.is_empty() && c.session.poll_fin(ctx) {
        close_notify(t);
        t.flags |= TlsConn::FIN_OWED;
        if let Wrote::Blocked = write_output(t, fd) {
            c.io.set(IoFlags::WANT_WRITE);
        }
    }
}

/// Seals what `s` offers to send into `out` as application-data records of up to 2^14 bytes
/// of plaintext each, copied from the session's frames straight into place (no plaintext
/// buffer); a KeyUpdate goes first when the transmit key is due (TLS 1.3). Returns the
/// plaintext taken and the ciphertext's length. Errors: a TLS 1.2 key at its limit, or a
/// record that could not be sealed.
fn seal_session(s: &Session, layer: &mut Layer, x: &mut Expanded, out: &mut [u8]) -> Result<(usize, usize), Stop> {
    if !s.has_output() {
        // What the loop below returns for an empty queue, without filling 4 KiB of slots first
        // (`transmit` calls once more after the last record to find the queue empty).
        return Ok((0, 0));
    }
    let mut iov = [IoSlice::new(&[]); MAX_IOV];
    let count = s.poll_transmit(&mut iov);
    let mut frames = iov[..count].iter().map(|v| &v[..]);
    let mut cur: &[u8] = &[];
    let (mut taken, mut at) = (0, 0);
    loop {
        if cur.is_empty() {
            match frames.next() {
                Some(f) => {
                    cur = f;
                    continue;
                }
                None => break,
            }
        }
        if layer.exhausted() {
            if !layer.tls13() {
                // What is sealed goes first; the next call finds the key spent with nothing sealed.
                return if at > 0 { Ok((taken, at)) } else { Err(Stop::Spent) };
            }
            if out.len() - at < record::KEY_UPDATE_RECORD {
                break;
            }
            at += layer.update_tx(x, &mut out[at..]).map_err(|_| Stop::Reset)?;
            continue;
        }
        let room = (out.len() - at).saturating_sub(layer.overhead()).min(MAX_PLAIN);
        if room == 0 {
            break;
        }
        let p = at + layer.payload_at();
        let mut k = 0;
        while k < room {
            if cur.is_empty() {
                match frames.next() {
                    Some(f) => cur = f,
                    None => break,
                }
                continue;
            }
            let m = cur.len().min(room - k);
            out[p + k..p + k + m].copy_from_slice(&cur[..m]);
            cur = &cur[m..];
            k += m;
        }
        at += layer.seal(x, APPLICATION_DATA, &mut out[at..], k).map_err(|_| Stop::Reset)?;
        taken += k;
    }
    Ok((taken, at))
}

/// Encrypts close_notify (RFC 8446 §6.1) at the end of `t.output`, once, when the handshake
/// finished.
pub(in crate::server) fn close_notify(t: &mut TlsConn) {
    if t.has(TlsConn::CLOSE_NOTIFY) || !t.has(TlsConn::ESTABLISHED) {
        return;
    }
    t.flags |= TlsConn::CLOSE_NOTIFY;
    match &mut t.phase {
        Phase::Traffic(layer) => {
            let _ = layer.alert(&mut Expanded::default(), record::alert::CLOSE_NOTIFY, false, t.output.vec());
        }
        Phase::Handshake(_) => super::handshake::close_notify(t),
        Phase::Failed => {}
    }
}

/// The last words of a TLS connection being torn down: close_notify when it was not sent yet
/// and the handshake finished (one non-blocking write; the socket is closed right after).
pub(in crate::server) fn last_words(t: &mut TlsConn, fd: i32) {
    close_notify(t);
    let _ = write_output(t, fd);
}

impl CoreState {
    /// The TLS side of tearing connection `id` (socket `fd`) down for `why`: close_notify
    /// unless the connection was reset, the gauge, and a handshake that never finished
    /// counted as failed (a timeout, or the peer closing).
    pub(in crate::server) fn tls_teardown(&mut self, id: ConnId, fd: i32, why: ReapReason) {
        let Some(mut t) = self.tls.take(id.key) else { return };
        let m = &self.shared.metrics[self.me].tls;
        m.connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if !t.has(TlsConn::ESTABLISHED) && !t.has(TlsConn::FAILED) {
            m.failed(if why == ReapReason::HandshakeTimeout { Failure::Timeout } else { Failure::Closed });
        }
        // RFC 8446 §6.1: each side sends close_notify before closing its write side, also
        // after the peer's close_notify or FIN (it may still read). Not after a reset: the
        // peer is gone. `close_notify` is once, so a connection that already sent it skips.
        if why != ReapReason::Reset {
            last_words(&mut t, fd);
        }
        self.tls.shrink();
    }
}
