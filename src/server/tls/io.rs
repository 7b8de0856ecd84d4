//! A TLS connection's reads and writes (docs/architecture.md, "TLS"), with rustls' unbuffered
//! API: the core's read scratch buffer holds the received records while rustls decrypts them
//! in place; the session's queued frames are gathered into a per-core plaintext buffer and
//! encrypted into a per-core ciphertext buffer, written from there. What the socket does not
//! take, and a record that has not fully arrived, are the only bytes kept per connection.

use std::cell::RefCell;
use std::io::{self, IoSlice};

use rustls::unbuffered::{ConnectionState, EncodeError, EncodeTlsData, EncryptError, UnbufferedStatus};

use super::{Failure, TlsConn};
use crate::server::conn::{Conn, ConnId, IoFlags};
use crate::server::core::CoreState;
use crate::server::io as sock;
use crate::session::queue::MAX_IOV;
use crate::session::replay::Fetch;
use crate::session::{Ctx, ReapReason};

/// Plaintext encrypted per write: the largest TLS records (16 KiB of plaintext each, RFC 8446
/// §5.1) fill [`SEALED_BYTES`] with room for their headers and tags.
const PLAIN_BYTES: usize = 60 * 1024;

/// Size of the per-core ciphertext buffer: [`PLAIN_BYTES`] sealed in records of at most 16 KiB
/// grow by at most 4 × (5 header + 8 explicit nonce + 16 tag + 1 content type) bytes.
const SEALED_BYTES: usize = 64 * 1024;

/// A core's plaintext gathering buffer and ciphertext buffer.
type SealBuffers = (Box<[u8]>, Box<[u8]>);

thread_local! {
    /// The core's plaintext gathering buffer and ciphertext buffer (one pair per core thread;
    /// no connection holds either).
    static SEAL: RefCell<SealBuffers> =
        RefCell::new((vec![0u8; PLAIN_BYTES].into_boxed_slice(), vec![0u8; SEALED_BYTES].into_boxed_slice()));
}

/// What writing a connection's pending ciphertext came to.
enum Wrote {
    /// All of it is written (nothing is kept any more).
    All,
    /// The socket is full; the rest waits for its output edge.
    Blocked,
    /// The socket failed (reset, broken pipe).
    Failed,
}

/// Writes what `t` keeps of its ciphertext; frees the buffer once written, then sends the FIN
/// that waited for it.
fn write_output(t: &mut TlsConn, fd: i32) -> Wrote {
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

/// Encodes a handshake record rustls produced at the end of `output`.
fn encode(mut e: EncodeTlsData<'_, rustls::server::ServerConnectionData>, output: &mut Vec<u8>) {
    let at = output.len();
    let mut room = 4096;
    loop {
        output.resize(at + room, 0);
        match e.encode(&mut output[at..]) {
            Ok(n) => return output.truncate(at + n),
            Err(EncodeError::InsufficientSize(s)) => room = s.required_size,
            Err(EncodeError::AlreadyEncoded) => return output.truncate(at),
        }
    }
}

/// Hands the peer a fatal alert rustls queued when it failed the connection (best effort: one
/// non-blocking write).
fn send_alert(t: &mut TlsConn, fd: i32) {
    for _ in 0..4 {
        let UnbufferedStatus { state, .. } = t.conn.process_tls_records(&mut []);
        match state {
            Ok(ConnectionState::EncodeTlsData(e)) => encode(e, t.output.vec()),
            Ok(ConnectionState::TransmitTlsData(x)) => {
                x.done();
                break;
            }
            _ => break,
        }
    }
    let _ = write_output(t, fd);
}

/// Why a TLS connection's handshake failed, from what rustls said and what the peer sent first.
fn failure_of(first: Option<u8>) -> Failure {
    // A TLS record starts with its content type (20..=24, RFC 8446 §5.1); an HTTP request
    // starts with an upper-case method.
    match first {
        Some(b) if b.is_ascii_uppercase() => Failure::Plaintext,
        _ => Failure::Protocol,
    }
}

/// The state of a connection's records after the received ones were processed.
enum Records {
    /// Waiting for more input (the handshake, or the next record).
    More,
    /// The peer sent close_notify: no more input will come.
    PeerClosed,
    /// rustls failed the connection.
    Failed(rustls::Error),
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
                // No record is this long (RFC 8446 §5.2: 2^14 + 256); rustls refuses one first.
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
                Records::More => {}
                Records::PeerClosed => {
                    self.end(id, ReapReason::Eof);
                    return false;
                }
                Records::Failed(e) => {
                    let why = if t.has(TlsConn::ESTABLISHED) { Failure::Protocol } else { failure_of(first) };
                    self.tls_failed(id, fd, t, why, &e.to_string());
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
    /// handshake records are encoded and written. Returns how many bytes of `buf` are done
    /// with (the rest is a record still arriving) and the state reached. A handshake that
    /// completed on the way is counted, even when the peer's close_notify came right behind
    /// its Finished (as from a client that only connects).
    fn process(&mut self, id: ConnId, fd: i32, t: &mut TlsConn, buf: &mut [u8]) -> (usize, Records) {
        let r = self.process_records(id, fd, t, buf);
        if !t.has(TlsConn::ESTABLISHED) && !t.conn.is_handshaking() {
            t.flags |= TlsConn::ESTABLISHED;
            let v = usize::from(t.version() != Some(rustls::ProtocolVersion::TLSv1_3));
            self.metrics().tls.handshakes[v].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    /// [`CoreState::process`] without the count.
    fn process_records(&mut self, id: ConnId, fd: i32, t: &mut TlsConn, buf: &mut [u8]) -> (usize, Records) {
        let mut used = 0;
        loop {
            let UnbufferedStatus { discard, state } = t.conn.process_tls_records(&mut buf[used..]);
            let mut extra = 0;
            match state {
                Err(e) => {
                    send_alert(t, fd);
                    return (used + discard, Records::Failed(e));
                }
                Ok(ConnectionState::ReadTraffic(mut r)) => {
                    while let Some(rec) = r.next_record() {
                        match rec {
                            Ok(rec) => {
                                extra += rec.discard;
                                if self.conn(id).is_some_and(|c| !c.session.is_closed()) {
                                    self.on_bytes(id, rec.payload);
                                }
                            }
                            Err(e) => return (used + discard + extra, Records::Failed(e)),
                        }
                    }
                }
                Ok(ConnectionState::EncodeTlsData(e)) => encode(e, t.output.vec()),
                Ok(ConnectionState::TransmitTlsData(x)) => {
                    x.done();
                    match write_output(t, fd) {
                        Wrote::All => {}
                        Wrote::Blocked => {
                            if let Some(c) = self.conn(id) {
                                c.io.set(IoFlags::WANT_WRITE);
                            }
                        }
                        Wrote::Failed => {
                            self.end(id, ReapReason::Reset);
                            return (used + discard, Records::More);
                        }
                    }
                }
                Ok(ConnectionState::WriteTraffic(_) | ConnectionState::BlockedHandshake) => {
                    return (used + discard, Records::More)
                }
                Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                    return (used + discard, Records::PeerClosed)
                }
                // Early data is never accepted (`max_early_data_size` 0); a state of a later
                // rustls is refused rather than guessed at.
                Ok(other) => {
                    let e = rustls::Error::General(format!("unexpected TLS state {other:?}"));
                    return (used + discard, Records::Failed(e));
                }
            }
            used += discard + extra;
        }
    }

    /// Counts and logs a failed TLS connection and ends it (a protocol error: the alert rustls
    /// queued was sent).
    fn tls_failed(&mut self, id: ConnId, fd: i32, t: &mut TlsConn, why: Failure, reason: &str) {
        if !t.has(TlsConn::ESTABLISHED) {
            t.flags |= TlsConn::FAILED;
            self.metrics().tls.failed(why);
        }
        crate::server::events::tls_failed(self.me, Some(fd), why.label(), reason);
        self.end(id, ReapReason::Protocol);
    }
}

/// The send path of a TLS connection (called by `CoreState::flush_at` for a connection with
/// [`IoFlags::TLS`]): its kept ciphertext first, then what its session queued, encrypted a
/// [`PLAIN_BYTES`] chunk at a time and written; then, when the session is finishing and all is
/// written, close_notify and the FIN. A full socket sets [`IoFlags::WANT_WRITE`]; an error
/// kills the session (reset).
pub(in crate::server) fn transmit(t: &mut TlsConn, c: &mut Conn, ctx: &Ctx, fetch: &mut Option<Fetch>) {
    let fd = c.fd;
    loop {
        match write_output(t, fd) {
            Wrote::All => {}
            Wrote::Blocked => return c.io.set(IoFlags::WANT_WRITE),
            Wrote::Failed => return c.session.kill(ReapReason::Reset),
        }
        let sealed = SEAL.with(|bufs| {
            let (plain, sealed) = &mut *bufs.borrow_mut();
            let len = gather(&c.session, plain);
            if len == 0 {
                return Ok(None);
            }
            let n = seal(t, &plain[..len], sealed)?;
            c.session.transmitted(len, ctx.now);
            match sock::send(fd, &[IoSlice::new(&sealed[..n])]) {
                Ok(w) if w < n => t.output.vec().extend_from_slice(&sealed[w..n]),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => t.output.vec().extend_from_slice(&sealed[..n]),
                Err(e) => return Err(e),
            }
            Ok(Some(()))
        });
        match sealed {
            Ok(Some(())) => continue,
            Ok(None) => {
                // Everything is written: a resume replay refills the queue.
                let (queued, f) = c.session.pump_replay(ctx);
                *fetch = fetch.take().or(f);
                if queued {
                    continue;
                }
                break;
            }
            Err(_) => return c.session.kill(ReapReason::Reset),
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

/// Copies what `s` offers to send into `plain`, up to its length; returns the bytes copied.
fn gather(s: &crate::session::Session, plain: &mut [u8]) -> usize {
    let mut iov = [IoSlice::new(&[]); MAX_IOV];
    let n = s.poll_transmit(&mut iov);
    let mut len = 0;
    for v in &iov[..n] {
        let take = v.len().min(plain.len() - len);
        plain[len..len + take].copy_from_slice(&v[..take]);
        len += take;
        if len == plain.len() {
            break;
        }
    }
    len
}

/// Encrypts `plain` into `sealed` as application-data records; returns the ciphertext's
/// length. Errors: the connection cannot write (its handshake is not done, or it failed).
fn seal(t: &mut TlsConn, plain: &[u8], sealed: &mut [u8]) -> io::Result<usize> {
    for _ in 0..8 {
        let UnbufferedStatus { discard, state } = t.conn.process_tls_records(t.input.bytes_mut());
        let done = match state {
            Ok(ConnectionState::WriteTraffic(mut w)) => Some(w.encrypt(plain, sealed).map_err(encrypt_error)),
            Ok(ConnectionState::EncodeTlsData(e)) => {
                encode(e, t.output.vec());
                None
            }
            Ok(ConnectionState::TransmitTlsData(x)) => {
                // Written before the records sealed next: `transmit` writes `output` first.
                x.done();
                None
            }
            Ok(other) => Some(Err(io::Error::other(format!("TLS connection cannot write in state {other:?}")))),
            Err(e) => Some(Err(io::Error::other(e))),
        };
        t.input.consume(discard);
        if let Some(r) = done {
            if !t.output.is_empty() {
                // Handshake records (a key update) come before the application data.
                let mut out = std::mem::take(&mut t.output);
                let n = r?;
                out.vec().extend_from_slice(&sealed[..n]);
                t.output = out;
                return Ok(0);
            }
            return r;
        }
    }
    Err(io::Error::other("TLS connection did not become writable"))
}

fn encrypt_error(e: EncryptError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Encrypts close_notify (RFC 8446 §6.1) at the end of `t.output`, once.
pub(in crate::server) fn close_notify(t: &mut TlsConn) {
    if t.has(TlsConn::CLOSE_NOTIFY) || !t.has(TlsConn::ESTABLISHED) {
        return;
    }
    t.flags |= TlsConn::CLOSE_NOTIFY;
    let UnbufferedStatus { state, .. } = t.conn.process_tls_records(&mut []);
    if let Ok(ConnectionState::WriteTraffic(mut w)) = state {
        let mut alert = [0u8; 64];
        if let Ok(n) = w.queue_close_notify(&mut alert) {
            t.output.vec().extend_from_slice(&alert[..n]);
        }
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
    /// when the peer did not just leave, the gauge, and a handshake that never finished
    /// counted as failed (a timeout, or the peer closing).
    pub(in crate::server) fn tls_teardown(&mut self, id: ConnId, fd: i32, why: ReapReason) {
        let Some(mut t) = self.tls.take(id.key) else { return };
        let m = &self.shared.metrics[self.me].tls;
        m.connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if !t.has(TlsConn::ESTABLISHED) && !t.has(TlsConn::FAILED) {
            m.failed(if why == ReapReason::HandshakeTimeout { Failure::Timeout } else { Failure::Closed });
        }
        if !matches!(why, ReapReason::Reset | ReapReason::Eof) {
            last_words(&mut t, fd);
        }
        self.tls.shrink();
    }
}
