//! tether's own TLS record layer once the handshake is done (docs/architecture.md, "TLS"):
//! rustls makes the handshake, then hands over the traffic keys
//! (`UnbufferedServerConnection::dangerous_into_kernel_connection`) and tether protects the
//! records itself with *ring*'s AEADs, so an idle connection keeps only its raw keys, IVs and
//! sequence numbers ([`Layer`]), and for TLS 1.3 the `KernelConnection` that derives the next
//! keys at a KeyUpdate. Keys are expanded into *ring*'s key schedule on the core's stack for
//! one burst of reads or writes ([`Expanded`]) and dropped after it.
//!
//! Record protection: TLS 1.3 (RFC 8446 §5.2: inner plaintext = content ‖ content type ‖ zero
//! padding, nonce = IV xor sequence number, additional data = the record header), TLS 1.2
//! AES-GCM (RFC 5288 §3: a 4-byte implicit salt ‖ an 8-byte explicit nonce sent in the record,
//! additional data = sequence number ‖ type ‖ version ‖ length, RFC 5246 §6.2.3.3) and TLS 1.2
//! ChaCha20-Poly1305 (RFC 7905 §2: nonce = IV xor sequence number, nothing explicit).

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::{ConnectionTrafficSecrets, ProtocolVersion, SupportedCipherSuite};
use zeroize::Zeroize;

/// Content types (RFC 8446 §5.1, RFC 5246 §6.2.1).
pub const ALERT: u8 = 21;
/// The handshake content type.
pub const HANDSHAKE: u8 = 22;
/// The application data content type.
pub const APPLICATION_DATA: u8 = 23;

/// Alert descriptions sent or recognised (RFC 8446 §6, RFC 5246 §7.2).
pub mod alert {
    /// The sender will send no more records.
    pub const CLOSE_NOTIFY: u8 = 0;
    /// A record or message that is not allowed here.
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    /// A record failed authentication (its tag).
    pub const BAD_RECORD_MAC: u8 = 20;
    /// A record longer than the protocol allows.
    pub const RECORD_OVERFLOW: u8 = 22;
    /// A field out of range (a KeyUpdate's `request_update`).
    pub const ILLEGAL_PARAMETER: u8 = 47;
    /// A message that does not parse.
    pub const DECODE_ERROR: u8 = 50;
    /// Tether could not go on (no next key).
    pub const INTERNAL_ERROR: u8 = 80;
    /// The peer cancelled (a warning TLS 1.3 tolerates).
    pub const USER_CANCELED: u8 = 90;
    /// TLS 1.2: renegotiation refused (RFC 5246 §7.2.2, always a warning).
    pub const NO_RENEGOTIATION: u8 = 100;
}

/// Alert levels (RFC 5246 §7.2; TLS 1.3 keeps the byte, RFC 8446 §6).
const WARNING: u8 = 1;
const FATAL: u8 = 2;

/// Handshake message types seen after the handshake (RFC 8446 §4, RFC 5246 §7.4).
const CLIENT_HELLO: u8 = 1;
const KEY_UPDATE: u8 = 24;

/// Largest plaintext of a record, 2^14 bytes (RFC 8446 §5.1).
pub const MAX_PLAIN: usize = 1 << 14;
/// A record's header: type, legacy version, length.
pub const HEADER: usize = 5;
/// The AEAD tag of every suite here (AES-GCM and ChaCha20-Poly1305).
const TAG: usize = 16;
/// The largest protection overhead of any suite: header, TLS 1.2 AES-GCM's explicit nonce,
/// tag, TLS 1.3's content type byte.
pub const MAX_OVERHEAD: usize = HEADER + 8 + TAG + 1;
/// A sealed KeyUpdate record's length (TLS 1.3: header, 5-byte message, type, tag).
pub const KEY_UPDATE_RECORD: usize = HEADER + 5 + 1 + TAG;

/// Warning alerts tolerated over a connection's life (as rustls and BoringSSL: 4).
const WARNINGS: u8 = 4;
/// KeyUpdates with `update_requested` answered without application data in between (as
/// rustls and BoringSSL: 32): each costs us a record, so a peer cannot make us write forever.
const KEY_UPDATE_REQUESTS: u8 = 32;
/// The last sequence number tether seals under (rustls' soft limit): a 64-bit sequence number
/// must never wrap (RFC 8446 §5.3, RFC 5246 §6.1).
const SEQ_LIMIT: u64 = 0xffff_ffff_ffff_0000;

/// The AEAD of a connection's cipher suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aead {
    /// AES-128-GCM (RFC 5116 §5.1).
    Aes128Gcm,
    /// AES-256-GCM (RFC 5116 §5.2).
    Aes256Gcm,
    /// ChaCha20-Poly1305 (RFC 8439).
    Chacha20Poly1305,
}

impl Aead {
    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Aead::Aes128Gcm => &aead::AES_128_GCM,
            Aead::Aes256Gcm => &aead::AES_256_GCM,
            Aead::Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }
}

/// Why a connection's records cannot go on: the alert to send (none when the peer sent a fatal
/// alert itself) and a reason for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatal {
    /// The fatal alert description to send ([`alert`]), or none.
    pub alert: Option<u8>,
    /// What happened (for the log line).
    pub why: String,
}

fn fatal(alert: u8, why: &str) -> Fatal {
    Fatal { alert: Some(alert), why: why.into() }
}

/// One direction's traffic protection, unexpanded: the raw key (16 or 32 bytes), the IV and
/// the next record's sequence number. Zeroed when dropped.
struct Direction {
    key: [u8; 32],
    iv: [u8; 12],
    seq: u64,
}

impl Direction {
    /// The direction of `secrets`, whose next record is `seq`. Errors: an AEAD other than the
    /// three *ring* gives rustls.
    fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> Result<(Aead, Direction), Fatal> {
        let (aead, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Aead::Aes128Gcm, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Aead::Aes256Gcm, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (Aead::Chacha20Poly1305, key, iv),
            _ => return Err(fatal(alert::INTERNAL_ERROR, "a traffic key of an unknown AEAD")),
        };
        let mut d = Direction { key: [0; 32], iv: [0; 12], seq };
        d.key[..key.as_ref().len()].copy_from_slice(key.as_ref());
        d.iv.copy_from_slice(iv.as_ref());
        Ok((aead, d))
    }

    /// The per-record nonce: the IV xor the sequence number, left-padded to 12 bytes (RFC 8446
    /// §5.3; RFC 7905 §2; rustls' TLS 1.2 AES-GCM writer uses the same construction, its
    /// explicit part the last 8 bytes).
    fn nonce(&self) -> [u8; 12] {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        n
    }

    /// *ring*'s key schedule for this key (done once per burst, [`Expanded`]).
    fn expand(&self, aead: Aead) -> LessSafeKey {
        let len = aead.algorithm().key_len();
        // The length is the algorithm's own, so *ring* cannot refuse it.
        LessSafeKey::new(UnboundKey::new(aead.algorithm(), &self.key[..len]).expect("key of the AEAD's length"))
    }
}

impl Drop for Direction {
    fn drop(&mut self) {
        self.key.zeroize();
        self.iv.zeroize();
    }
}

/// The keys of one connection expanded for one burst of reads or writes (on the core's
/// stack, never kept): each direction is expanded when first used and dropped with this.
#[derive(Default)]
pub struct Expanded {
    tx: Option<LessSafeKey>,
    rx: Option<LessSafeKey>,
}

/// What an opened record is for the connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound<'b> {
    /// Application data for the session (possibly empty).
    Data(&'b [u8]),
    /// The peer's close_notify: no more input (RFC 8446 §6.1).
    Closed,
    /// Handled here: a tolerated warning, a KeyUpdate (its answer, if any, is in the reply).
    Handled,
}

/// A TLS connection's record layer after the handshake: both directions' raw keys and
/// sequence numbers, the suite, and (TLS 1.3) rustls' `KernelConnection` for KeyUpdate.
pub struct Layer {
    tx: Direction,
    rx: Direction,
    /// Records sealed under one key at most: the suite's confidentiality limit, or
    /// `tls.records_per_key` when lower (then the next key, TLS 1.3, or the end, TLS 1.2).
    records_per_key: u64,
    /// Derives the next traffic keys (TLS 1.3 only; TLS 1.2 has no KeyUpdate, so none is kept).
    kernel: Option<Box<KernelConnection<ServerConnectionData>>>,
    aead: Aead,
    tls13: bool,
    /// Warning alerts still tolerated.
    warnings: u8,
    /// KeyUpdate requests still answered before the next application data.
    key_updates: u8,
    /// TLS 1.2: a renegotiation was refused once already (a second ends the connection).
    refused_renegotiation: bool,
}

impl Layer {
    /// Takes the traffic keys of `conn`, whose handshake is done and whose records are all
    /// encoded (rustls reached `WriteTraffic`); `records_per_key` lowers the suite's
    /// confidentiality limit. Errors: rustls refused the hand-over (secret extraction off, the
    /// handshake not done, records still queued), or an AEAD this layer does not know.
    pub fn take(conn: UnbufferedServerConnection, records_per_key: Option<u64>) -> Result<Layer, Fatal> {
        let internal = |e: rustls::Error| fatal(alert::INTERNAL_ERROR, &format!("taking the traffic keys: {e}"));
        let (secrets, kernel) = conn.dangerous_into_kernel_connection().map_err(internal)?;
        let limit = match kernel.negotiated_cipher_suite() {
            SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
            SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
        };
        let tls13 = kernel.protocol_version() == ProtocolVersion::TLSv1_3;
        let (aead, tx) = Direction::new(secrets.tx.0, secrets.tx.1)?;
        let (_, rx) = Direction::new(secrets.rx.0, secrets.rx.1)?;
        Ok(Layer {
            tx,
            rx,
            records_per_key: limit.min(records_per_key.unwrap_or(u64::MAX)).clamp(2, SEQ_LIMIT),
            kernel: tls13.then(|| Box::new(kernel)),
            aead,
            tls13,
            warnings: WARNINGS,
            key_updates: KEY_UPDATE_REQUESTS,
            refused_renegotiation: false,
        })
    }

    /// Whether the connection speaks TLS 1.3 (else TLS 1.2).
    pub fn tls13(&self) -> bool {
        self.tls13
    }

    /// The suite's AEAD.
    pub fn aead(&self) -> Aead {
        self.aead
    }

    /// Where a record's payload starts in its sealed form: after the header and, TLS 1.2
    /// AES-GCM, the explicit nonce.
    pub fn payload_at(&self) -> usize {
        HEADER + if !self.tls13 && self.aead != Aead::Chacha20Poly1305 { 8 } else { 0 }
    }

    /// A sealed record's length beyond its payload.
    pub fn overhead(&self) -> usize {
        self.payload_at() + TAG + usize::from(self.tls13)
    }

    /// Whether the transmit key has one record left (its confidentiality limit): then TLS 1.3
    /// seals a KeyUpdate ([`Layer::update_tx`]) and TLS 1.2 only its close_notify.
    pub fn exhausted(&self) -> bool {
        self.tx.seq.saturating_add(1) >= self.records_per_key
    }

    /// Seals the record of type `typ` whose `n`-byte payload is in place at
    /// `out[self.payload_at()..]` (`out` has room for [`Layer::overhead`] more); returns the
    /// record's length. Errors: the sequence number is spent.
    pub fn seal(&mut self, x: &mut Expanded, typ: u8, out: &mut [u8], n: usize) -> Result<usize, Fatal> {
        if self.tx.seq >= SEQ_LIMIT {
            return Err(fatal(alert::INTERNAL_ERROR, "the sequence number is spent"));
        }
        let key = x.tx.get_or_insert_with(|| self.tx.expand(self.aead));
        let nonce = self.tx.nonce();
        let at = self.payload_at();
        let (sealed, header_type, aad13, aad12);
        if self.tls13 {
            // RFC 8446 §5.2: the true type inside, no padding; the outer type application_data.
            out[at + n] = typ;
            sealed = n + 1;
            header_type = APPLICATION_DATA;
        } else {
            sealed = n;
            header_type = typ;
            out[HEADER..at].copy_from_slice(&nonce[4..4 + (at - HEADER)]);
        }
        let len = at - HEADER + sealed + TAG;
        let header = [header_type, 3, 3, (len >> 8) as u8, len as u8];
        out[..HEADER].copy_from_slice(&header);
        let aad: &[u8] = if self.tls13 {
            aad13 = header;
            &aad13
        } else {
            aad12 = tls12_aad(self.tx.seq, typ, [3, 3], n);
            &aad12
        };
        let tag = key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut out[at..at + sealed])
            .map_err(|_| fatal(alert::INTERNAL_ERROR, "sealing failed"))?;
        out[at + sealed..at + sealed + TAG].copy_from_slice(tag.as_ref());
        self.tx.seq += 1;
        Ok(HEADER + len)
    }

    /// Seals `body` as one record of type `typ` at the end of `out`.
    pub fn seal_message(&mut self, x: &mut Expanded, typ: u8, body: &[u8], out: &mut Vec<u8>) -> Result<(), Fatal> {
        let start = out.len();
        out.resize(start + self.overhead() + body.len(), 0);
        let at = start + self.payload_at();
        out[at..at + body.len()].copy_from_slice(body);
        let n = self.seal(x, typ, &mut out[start..], body.len())?;
        out.truncate(start + n);
        Ok(())
    }

    /// Seals an alert (`fatal` or a warning) at the end of `out` (close_notify is a warning,
    /// RFC 8446 §6.1).
    pub fn alert(&mut self, x: &mut Expanded, description: u8, fatal: bool, out: &mut Vec<u8>) -> Result<(), Fatal> {
        self.seal_message(x, ALERT, &[if fatal { FATAL } else { WARNING }, description], out)
    }

    /// TLS 1.3: seals a KeyUpdate(update_not_requested) into `out` under the current key, then
    /// moves the transmit direction to the next key (RFC 8446 §4.6.3); returns the record's
    /// length ([`KEY_UPDATE_RECORD`]). Errors: TLS 1.2, or rustls could not derive the key.
    pub fn update_tx(&mut self, x: &mut Expanded, out: &mut [u8]) -> Result<usize, Fatal> {
        let Some(kernel) = self.kernel.as_mut() else {
            return Err(fatal(alert::INTERNAL_ERROR, "a key update on TLS 1.2"));
        };
        let (seq, secrets) = kernel
            .update_tx_secret()
            .map_err(|e| fatal(alert::INTERNAL_ERROR, &format!("the next transmit key: {e}")))?;
        let at = self.payload_at();
        out[at..at + 5].copy_from_slice(&[KEY_UPDATE, 0, 0, 1, 0]);
        let n = self.seal(x, HANDSHAKE, out, 5)?;
        self.tx = Direction::new(seq, secrets)?.1;
        x.tx = None;
        Ok(n)
    }

    /// The length of the whole record at the start of `buf`, once it is all there. Errors: a
    /// record longer than the protocol allows (RFC 8446 §5.2: 2^14 + 256; RFC 5246 §6.2.3:
    /// 2^14 + 2048), with record_overflow.
    pub fn record_len(&self, buf: &[u8]) -> Result<Option<usize>, Fatal> {
        if buf.len() < HEADER {
            return Ok(None);
        }
        let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
        if len > MAX_PLAIN + if self.tls13 { 256 } else { 2048 } {
            return Err(fatal(alert::RECORD_OVERFLOW, "a record longer than TLS allows"));
        }
        Ok((buf.len() >= HEADER + len).then_some(HEADER + len))
    }

    /// Opens the whole record `rec` in place ([`Layer::record_len`] long) and acts on what it
    /// holds: application data is returned, an alert or a post-handshake message is handled
    /// here (an answer, a KeyUpdate's or a refused renegotiation's, is sealed at the end of
    /// `reply`). Errors: a fatal condition and the alert it takes (bad_record_mac for a record
    /// that fails authentication; record_overflow, unexpected_message, decode_error,
    /// illegal_parameter; none after the peer's own fatal alert).
    pub fn open<'b>(&mut self, x: &mut Expanded, rec: &'b mut [u8], reply: &mut Vec<u8>) -> Result<Inbound<'b>, Fatal> {
        let (typ, body) = self.decrypt(x, rec)?;
        match typ {
            APPLICATION_DATA => {
                self.key_updates = KEY_UPDATE_REQUESTS;
                Ok(Inbound::Data(body))
            }
            ALERT => self.on_alert(body),
            HANDSHAKE => self.on_handshake(x, body, reply),
            _ => Err(fatal(alert::UNEXPECTED_MESSAGE, &format!("a record of content type {typ} after the handshake"))),
        }
    }

    /// Authenticates and decrypts `rec`; returns its content type and plaintext.
    fn decrypt<'b>(&mut self, x: &mut Expanded, rec: &'b mut [u8]) -> Result<(u8, &'b mut [u8]), Fatal> {
        let bad_mac = || fatal(alert::BAD_RECORD_MAC, "a record failed authentication");
        if self.rx.seq == u64::MAX {
            return Err(fatal(alert::INTERNAL_ERROR, "the peer's sequence number is spent"));
        }
        let (header, body) = rec.split_at_mut(HEADER);
        let outer = header[0];
        let key = x.rx.get_or_insert_with(|| self.rx.expand(self.aead));
        let (typ, plain) = if self.tls13 {
            if outer != APPLICATION_DATA {
                return Err(fatal(alert::UNEXPECTED_MESSAGE, "a TLS 1.3 record not of type application_data"));
            }
            let nonce = Nonce::assume_unique_for_key(self.rx.nonce());
            let inner = key.open_in_place(nonce, Aad::from(&header[..]), body).map_err(|_| bad_mac())?;
            // RFC 8446 §5.4: the content type is the last non-zero byte; all zeros is an error.
            let Some(end) = inner.iter().rposition(|&b| b != 0) else {
                return Err(fatal(alert::UNEXPECTED_MESSAGE, "a record with no content type"));
            };
            (inner[end], &mut inner[..end])
        } else {
            if !(ALERT..=APPLICATION_DATA).contains(&outer) {
                return Err(fatal(alert::UNEXPECTED_MESSAGE, &format!("a record of content type {outer}")));
            }
            let explicit = self.payload_at() - HEADER;
            let Some(n) = body.len().checked_sub(explicit + TAG) else { return Err(bad_mac()) };
            let nonce = if explicit > 0 {
                let mut nonce = [0u8; 12];
                nonce[..4].copy_from_slice(&self.rx.iv[..4]);
                nonce[4..].copy_from_slice(&body[..8]);
                nonce
            } else {
                self.rx.nonce()
            };
            let aad = tls12_aad(self.rx.seq, outer, [header[1], header[2]], n);
            let nonce = Nonce::assume_unique_for_key(nonce);
            (outer, key.open_within(nonce, Aad::from(aad), body, explicit..).map_err(|_| bad_mac())?)
        };
        if plain.len() > MAX_PLAIN {
            return Err(fatal(alert::RECORD_OVERFLOW, "a record with more than 2^14 bytes of plaintext"));
        }
        self.rx.seq += 1;
        Ok((typ, plain))
    }

    /// An alert from the peer (RFC 8446 §6, RFC 5246 §7.2).
    fn on_alert<'b>(&mut self, body: &[u8]) -> Result<Inbound<'b>, Fatal> {
        let &[level, description] = body else {
            return Err(fatal(alert::DECODE_ERROR, "an alert record that is not one alert"));
        };
        if description == alert::CLOSE_NOTIFY {
            return Ok(Inbound::Closed);
        }
        match level {
            WARNING => {
                if self.warnings == 0 {
                    return Err(fatal(alert::UNEXPECTED_MESSAGE, "too many warning alerts"));
                }
                self.warnings -= 1;
                // RFC 8446 §6: in TLS 1.3 every alert but close_notify and user_canceled is
                // fatal whatever its level (rustls answers decode_error, as here).
                if self.tls13 && description != alert::USER_CANCELED {
                    return Err(fatal(alert::DECODE_ERROR, &format!("warning alert {description} in TLS 1.3")));
                }
                Ok(Inbound::Handled)
            }
            FATAL => Err(Fatal { alert: None, why: format!("the peer sent fatal alert {description}") }),
            _ => Err(fatal(alert::ILLEGAL_PARAMETER, &format!("an alert of level {level}"))),
        }
    }

    /// A handshake record after the handshake: TLS 1.3 KeyUpdate (RFC 8446 §4.6.3), the only
    /// one a client may send unasked here (tether never asks for a post-handshake certificate);
    /// TLS 1.2 renegotiation is refused as rustls does: a no_renegotiation warning the first
    /// time, the end of the connection the second (RFC 5746 §4.2, RFC 5246 §7.2.2).
    fn on_handshake<'b>(&mut self, x: &mut Expanded, body: &[u8], reply: &mut Vec<u8>) -> Result<Inbound<'b>, Fatal> {
        if !self.tls13 {
            if body.first() == Some(&CLIENT_HELLO) && !self.refused_renegotiation {
                self.refused_renegotiation = true;
                self.alert(x, alert::NO_RENEGOTIATION, false, reply)?;
                return Ok(Inbound::Handled);
            }
            return Err(fatal(alert::UNEXPECTED_MESSAGE, "a handshake message after the TLS 1.2 handshake"));
        }
        // A KeyUpdate is 5 bytes: type, 24-bit length 1, request_update. It must end its
        // record (RFC 8446 §5.1: a key change at a record boundary); a message split across
        // records is not one tether accepts either.
        match body {
            [KEY_UPDATE, 0, 0, 1, request] => {
                let requested = match request {
                    0 => false,
                    1 => true,
                    _ => return Err(fatal(alert::ILLEGAL_PARAMETER, "a KeyUpdate request_update other than 0 or 1")),
                };
                let kernel = self.kernel.as_mut().ok_or_else(|| fatal(alert::INTERNAL_ERROR, "no key schedule"))?;
                let (seq, secrets) = kernel
                    .update_rx_secret()
                    .map_err(|e| fatal(alert::INTERNAL_ERROR, &format!("the next receive key: {e}")))?;
                self.rx = Direction::new(seq, secrets)?.1;
                x.rx = None;
                if requested {
                    if self.key_updates == 0 {
                        return Err(fatal(alert::UNEXPECTED_MESSAGE, "too many KeyUpdate requests"));
                    }
                    self.key_updates -= 1;
                    let start = reply.len();
                    reply.resize(start + KEY_UPDATE_RECORD, 0);
                    let n = self.update_tx(x, &mut reply[start..])?;
                    reply.truncate(start + n);
                }
                Ok(Inbound::Handled)
            }
            [KEY_UPDATE, ..] if body.len() > 5 => {
                Err(fatal(alert::UNEXPECTED_MESSAGE, "a KeyUpdate not at the end of its record"))
            }
            [KEY_UPDATE, ..] => Err(fatal(alert::DECODE_ERROR, "a malformed KeyUpdate")),
            _ => Err(fatal(alert::UNEXPECTED_MESSAGE, "a handshake message other than KeyUpdate after the handshake")),
        }
    }
}

/// TLS 1.2's additional data (RFC 5246 §6.2.3.3): sequence number, type, version, plaintext
/// length.
fn tls12_aad(seq: u64, typ: u8, version: [u8; 2], len: usize) -> [u8; 13] {
    let mut a = [0u8; 13];
    a[..8].copy_from_slice(&seq.to_be_bytes());
    a[8] = typ;
    a[9..11].copy_from_slice(&version);
    a[11..].copy_from_slice(&(len as u16).to_be_bytes());
    a
}

#[cfg(test)]
mod tests;
