//! A TLS connection's handshake, made by rustls' unbuffered API in the core's read scratch
//! buffer, and the hand-over to tether's record layer once it is done ([`super::record`]):
//! the traffic keys leave rustls and everything rustls kept for the handshake is freed.

use rustls::unbuffered::{ConnectionState, EncodeError, EncodeTlsData, UnbufferedStatus};

use super::io::{write_output, Records, Wrote};
use super::record::Layer;
use super::{Failure, Phase, TlsConn};
use crate::server::conn::{ConnId, IoFlags};
use crate::server::core::CoreState;
use crate::session::ReapReason;

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

/// Hands the peer a fatal alert rustls queued when it failed the handshake (best effort: one
/// non-blocking write).
fn send_alert(t: &mut TlsConn, fd: i32) {
    if let Phase::Handshake(conn) = &mut t.phase {
        for _ in 0..4 {
            let UnbufferedStatus { state, .. } = conn.process_tls_records(&mut []);
            match state {
                Ok(ConnectionState::EncodeTlsData(e)) => encode(e, t.output.vec()),
                Ok(ConnectionState::TransmitTlsData(x)) => {
                    x.done();
                    break;
                }
                _ => break,
            }
        }
    }
    // No close_notify after a fatal alert.
    t.flags |= TlsConn::CLOSE_NOTIFY;
    let _ = write_output(t, fd);
}

/// Why a TLS connection's handshake failed, from what the peer sent first.
pub(super) fn failure_of(first: Option<u8>) -> Failure {
    // A TLS record starts with its content type (20..=24, RFC 8446 §5.1); an HTTP request
    // starts with an upper-case method.
    match first {
        Some(b) if b.is_ascii_uppercase() => Failure::Plaintext,
        _ => Failure::Protocol,
    }
}

/// Encrypts close_notify with rustls: only for a connection whose handshake finished in the
/// read that also brought the peer's close_notify, so it was never handed over.
pub(super) fn close_notify(t: &mut TlsConn) {
    let Phase::Handshake(conn) = &mut t.phase else { return };
    let UnbufferedStatus { state, .. } = conn.process_tls_records(&mut []);
    if let Ok(ConnectionState::WriteTraffic(mut w)) = state {
        let mut alert = [0u8; 64];
        if let Ok(n) = w.queue_close_notify(&mut alert) {
            t.output.vec().extend_from_slice(&alert[..n]);
        }
    }
}

impl CoreState {
    /// Processes the handshake records in `buf` with rustls: answers are encoded and written;
    /// application data that came before the hand-over goes to the session. Returns how many
    /// bytes of `buf` are done with and the state reached: [`Records::Traffic`] once the
    /// handshake is done and every record rustls made is encoded, when the caller hands the
    /// keys over ([`CoreState::hand_over`]).
    pub(super) fn handshake(&mut self, id: ConnId, fd: i32, t: &mut TlsConn, buf: &mut [u8]) -> (usize, Records) {
        let mut used = 0;
        let used = loop {
            let Phase::Handshake(conn) = &mut t.phase else { return (used, Records::Traffic) };
            let UnbufferedStatus { discard, state } = conn.process_tls_records(&mut buf[used..]);
            let mut extra = 0;
            match state {
                Err(e) => {
                    send_alert(t, fd);
                    return (used + discard, Records::Failed(e.to_string()));
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
                            Err(e) => return (used + discard + extra, Records::Failed(e.to_string())),
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
                // Waiting for input: the handshake's next flight, or (done) application data.
                Ok(ConnectionState::WriteTraffic(_) | ConnectionState::BlockedHandshake) => break used + discard,
                Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                    return (used + discard, Records::PeerClosed)
                }
                // Early data is never accepted (`max_early_data_size` 0); a state of a later
                // rustls is refused rather than guessed at.
                Ok(other) => {
                    return (used + discard, Records::Failed(format!("unexpected TLS state {other:?}")));
                }
            }
            used += discard + extra;
        };
        match &t.phase {
            Phase::Handshake(conn) if conn.is_handshaking() => (used, Records::More),
            _ => (used, Records::Traffic),
        }
    }

    /// Moves `t` from rustls to tether's record layer: its traffic keys and sequence numbers
    /// are taken (`tls.records_per_key` applied) and rustls' connection is dropped. Errors:
    /// rustls refused (then `t` is [`Phase::Failed`]).
    pub(super) fn hand_over(&mut self, t: &mut TlsConn) -> Result<(), String> {
        let Phase::Handshake(conn) = std::mem::replace(&mut t.phase, Phase::Failed) else {
            return Ok(());
        };
        let limit = self.shared.config.tls.as_ref().and_then(|c| c.records_per_key);
        t.phase = Phase::Traffic(Layer::take(*conn, limit).map_err(|f| f.why)?);
        Ok(())
    }
}
