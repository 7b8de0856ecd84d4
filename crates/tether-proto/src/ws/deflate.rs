//! permessage-deflate (RFC 7692), sans-IO: the offer negotiation of the upgrade (§5, §7.1),
//! and a core's one compressor and one inflater ([`Deflate`]), shared by all its connections.
//!
//! tether always answers `server_no_context_takeover; client_no_context_takeover` (§7.1.1):
//! each message is compressed on its own, so one compressed frame serves every subscriber
//! that negotiated the extension (encoded once, shared, like the plain frame), and a client's
//! message is inflated with no state carried from its previous one, so neither side keeps a
//! sliding window per connection. An idle connection holds no zlib state at all.

use std::cell::RefCell;

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tungstenite::protocol::frame::coding::OpCode;

use super::codec::{deflated_frame, header_len, Violation};

/// The extension token (RFC 7692 §7).
pub const EXTENSION: &str = "permessage-deflate";

/// The tail a sender strips and a receiver appends (the empty stored block of a sync flush,
/// RFC 7692 §7.2.1, §7.2.2).
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// The LZ77 window tether compresses and inflates with, as a base-2 logarithm (32 KiB,
/// DEFLATE's largest, RFC 1951).
pub const WINDOW_BITS: u8 = 15;

/// The `Sec-WebSocket-Extensions` value of an accepted offer: RFC 7692 §7.1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreement {
    /// The response header's value, e.g. `permessage-deflate; server_no_context_takeover;
    /// client_no_context_takeover`.
    pub response: String,
}

/// Picks the first acceptable `permessage-deflate` offer of a `Sec-WebSocket-Extensions`
/// value (`offers`: every header's value joined with `, `, in order; RFC 7692 §5: the first
/// acceptable offer wins) and returns the answer, or `None` to decline the extension (no
/// response header, the connection goes on uncompressed: §5 "the server ... may decline",
/// never a 400).
///
/// An offer is acceptable when each of its parameters (§7.1) is known, appears once and has a
/// valid value:
/// - `server_no_context_takeover`, `client_no_context_takeover`: no value;
/// - `client_max_window_bits`: no value, or 8–15 (tether inflates with a 32 KiB window,
///   which reads any smaller one, so the answer does not name it);
/// - `server_max_window_bits`: 8–15; tether compresses every message once for all its
///   subscribers with a 15-bit window, so only 15 is accepted (answered
///   `server_max_window_bits=15`, §7.1.2.1); a smaller one declines that offer and the next
///   is tried.
///
/// Values may be tokens or quoted strings (§7.1's ABNF and RFC 6455 §9.1). Offers of other
/// extensions are skipped.
pub fn negotiate(offers: &str) -> Option<Agreement> {
    split_outside_quotes(offers, ',').into_iter().find_map(|offer| accept(offer.trim()))
}

/// The answer to one offer (`name; param; param=value`), if acceptable.
fn accept(offer: &str) -> Option<Agreement> {
    let mut parts = split_outside_quotes(offer, ';').into_iter();
    if !parts.next()?.trim().eq_ignore_ascii_case(EXTENSION) {
        return None;
    }
    let mut seen = [false; 4];
    let mut server_window = false;
    for param in parts {
        let (name, value) = match param.split_once('=') {
            Some((n, v)) => (n.trim(), Some(unquote(v.trim())?)),
            None => (param.trim(), None),
        };
        let which = match name.to_ascii_lowercase().as_str() {
            "server_no_context_takeover" => 0,
            "client_no_context_takeover" => 1,
            "server_max_window_bits" => 2,
            "client_max_window_bits" => 3,
            _ => return None,
        };
        if std::mem::replace(&mut seen[which], true) {
            return None;
        }
        match (which, value) {
            (0 | 1, None) => {}
            (2, Some(v)) => {
                if window_bits(v)? != WINDOW_BITS {
                    return None;
                }
                server_window = true;
            }
            (3, None) => {}
            (3, Some(v)) => {
                window_bits(v)?;
            }
            _ => return None,
        }
    }
    let mut response = format!("{EXTENSION}; server_no_context_takeover; client_no_context_takeover");
    if server_window {
        response.push_str("; server_max_window_bits=15");
    }
    Some(Agreement { response })
}

/// A window size parameter's value: 1*DIGIT in 8..=15 without leading zeros (RFC 7692
/// §7.1.2.1, §7.1.2.2).
fn window_bits(v: &str) -> Option<u8> {
    if v.is_empty() || v.len() > 2 || v.starts_with('0') || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok().filter(|n| (8..=15).contains(n))
}

/// A value as a token or a quoted string (its content); `None` when it is neither.
fn unquote(v: &str) -> Option<&str> {
    match v.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"').filter(|inner| !inner.contains(['"', '\\'])),
        None => (!v.is_empty() && v.bytes().all(is_tchar)).then_some(v),
    }
}

/// RFC 9110 §5.6.2 token characters.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Splits `s` at `sep` where it is not inside a quoted string.
fn split_outside_quotes(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in s.char_indices() {
        if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            out.push(&s[start..i]);
            start = i + 1;
        }
    }
    out.push(&s[start..]);
    out
}

/// What `[compression]` sets for a core's [`Deflate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeflateConfig {
    /// Messages whose payload is shorter than this many bytes go uncompressed (RSV1 clear).
    pub min_bytes: usize,
    /// zlib compression level, 1 (fastest) to 9 (smallest).
    pub level: u32,
}

/// A core's permessage-deflate state: one compressor and one inflater (RFC 7692 with no
/// context takeover), made the first time a connection of the core needs one and lent to
/// every session through `session::Ctx` ([`RefCell`]: a core is one thread).
#[derive(Debug, Default)]
pub struct Deflate {
    /// `None`: compression is off (`compression.enabled = false`), nothing is negotiated.
    cfg: Option<DeflateConfig>,
    compress: RefCell<Option<Box<Compress>>>,
    inflate: RefCell<Option<Box<Decompress>>>,
}

impl Deflate {
    /// A core's state under `cfg` (`None`: compression off). Allocates nothing until used.
    pub fn new(cfg: Option<DeflateConfig>) -> Deflate {
        Deflate { cfg, ..Deflate::default() }
    }

    /// Whether the extension is offered to clients at all.
    pub fn enabled(&self) -> bool {
        self.cfg.is_some()
    }

    /// The permessage-deflate form of a complete, unmasked, unfragmented server data frame
    /// `frame` (as `codec::text_frame` makes it): the payload compressed on its own, the
    /// trailing `00 00 ff ff` stripped, RSV1 set (RFC 7692 §7.2.1, §6). `None` when it should
    /// stay plain: compression off, a payload under `min_bytes`, or one that does not shrink.
    pub fn deflate_frame(&self, frame: &[u8]) -> Option<Bytes> {
        let (&first, rest) = frame.split_first()?;
        let len = match rest.first()? & 0x7f {
            126 => 4,
            127 => 10,
            _ => 2,
        };
        let opcode = OpCode::from(first & 0x0f);
        self.deflate_message(opcode, frame.get(len..)?)
    }

    /// A data message `payload` of type `opcode` as one compressed frame (RSV1 set), or `None`
    /// when it should stay plain (see [`Deflate::deflate_frame`]).
    pub fn deflate_message(&self, opcode: OpCode, payload: &[u8]) -> Option<Bytes> {
        let cfg = self.cfg?;
        if payload.len() < cfg.min_bytes.max(1) {
            return None;
        }
        let mut slot = self.compress.borrow_mut();
        let c = slot.get_or_insert_with(|| Box::new(Compress::new(Compression::new(cfg.level), false)));
        c.reset();
        // Worst case of DEFLATE: stored blocks, 5 bytes per 64 KiB, plus the flush's block.
        let mut out = Vec::with_capacity(payload.len() + payload.len() / 16_000 * 5 + 64);
        loop {
            let read = c.total_in() as usize;
            if c.compress_vec(&payload[read..], &mut out, FlushCompress::Sync).is_err() {
                return None;
            }
            if c.total_in() as usize == payload.len() && out.len() < out.capacity() {
                break;
            }
            out.reserve(out.capacity().max(64));
        }
        if !out.ends_with(&TAIL) {
            return None;
        }
        out.truncate(out.len() - TAIL.len());
        let plain = header_len(payload.len()) + payload.len();
        (header_len(out.len()) + out.len() < plain).then(|| deflated_frame(opcode, &out))
    }

    /// Inflates one compressed message `deflated` (the payloads of its frames, concatenated and
    /// unmasked; RFC 7692 §7.2.2: `00 00 ff ff` is appended here) with no context from earlier
    /// messages, into at most `limit` bytes. Never allocates more than `limit` + 1 bytes of
    /// output, however much the input expands.
    ///
    /// Errors: the output passes `limit` (1009, a deflate bomb or simply too big), the data is
    /// not valid DEFLATE (1007), compression is off (1002: RSV1 without the extension).
    pub fn inflate(&self, mut deflated: Vec<u8>, limit: usize) -> Result<Vec<u8>, Violation> {
        if self.cfg.is_none() {
            return Err(Violation::RSV_SET);
        }
        deflated.extend_from_slice(&TAIL);
        let mut slot = self.inflate.borrow_mut();
        let d = slot.get_or_insert_with(|| Box::new(Decompress::new(false)));
        d.reset(false);
        let cap = limit.saturating_add(1);
        let mut out: Vec<u8> = Vec::with_capacity(deflated.len().saturating_mul(4).clamp(64, cap));
        loop {
            let read = d.total_in() as usize;
            let status = d
                .decompress_vec(&deflated[read..], &mut out, FlushDecompress::Sync)
                .map_err(|_| Violation::BAD_DEFLATE)?;
            if out.len() > limit {
                return Err(Violation::MESSAGE_TOO_BIG);
            }
            let done = d.total_in() as usize == deflated.len() && out.len() < out.capacity();
            if done || status == Status::StreamEnd {
                return Ok(out);
            }
            if out.len() == out.capacity() {
                let grow = out.capacity().min(cap - out.capacity());
                out.reserve_exact(grow);
            } else if status == Status::BufError {
                // Input left, room left, no progress: the data is cut short of a block end.
                return Err(Violation::BAD_DEFLATE);
            }
        }
    }
}

#[cfg(test)]
mod tests;
