//! RFC 6455 framing for the server side, sans-IO: bytes in, messages or a close code out.
//!
//! [`Decoder`] reads client frames from the front of a caller-owned buffer (the per-core scratch
//! buffer) and enforces §5 (masking, RSV bits, opcodes, control-frame rules, fragmentation), the
//! message size limit (1009) and UTF-8 in text messages and close reasons (§8.1, 1007). It holds
//! heap memory only while a fragmented message is being assembled; an idle connection's decoder
//! is a few inline words. The encoders build server frames once as shared `Bytes`.
//!
//! Header parsing and opcodes come from `tungstenite` (`FrameHeader::parse`, `OpCode`); payload
//! handling is ours because tungstenite's frame reader owns a 128 KiB buffer per connection.

mod encode;
mod mask;
#[cfg(test)]
mod tests;
mod utf8;

use std::io::Cursor;

use bytes::Bytes;
use tungstenite::protocol::frame::coding::{Control, Data};
use tungstenite::protocol::frame::FrameHeader;

pub use encode::{
    close_frame, decode_server_frame, decode_server_frame_rsv1, deflated_frame, encode_client_frame, encode_frame,
    encode_frame_into, header_len, ping_frame, pong_frame, text_frame, text_frame_with, text_payload, ServerFrame,
};
use mask::apply_mask;

use super::deflate::Deflate;
pub use tungstenite::protocol::frame::coding::{CloseCode, OpCode};
use utf8::Utf8Carry;

/// Largest control-frame payload (§5.5).
const MAX_CONTROL_PAYLOAD: usize = 125;

/// Why the connection must be failed: close code to send (RFC 6455 §7.4.1) and a short static reason.
///
/// Codes produced by this module: 1002 protocol error (§5 framing rules; RSV1 misused, RFC
/// 7692 §6.1), 1007 invalid UTF-8 (§8.1) or invalid DEFLATE data, 1009 message too big (the
/// configured `max_message_bytes`, also after inflating).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Violation {
    /// Close code for the close frame that fails the connection: 1002, 1007 or 1009.
    pub code: CloseCode,
    /// Human-readable cause, short enough for a close reason (≤ 123 bytes).
    pub reason: &'static str,
}

impl Violation {
    const fn protocol(reason: &'static str) -> Self {
        Violation { code: CloseCode::Protocol, reason }
    }

    const RESERVED_OPCODE: Self = Self::protocol("reserved opcode");
    pub(super) const RSV_SET: Self = Self::protocol("RSV bit set without a negotiated extension");
    const RSV1_MISPLACED: Self = Self::protocol("RSV1 on a control or continuation frame");
    pub(super) const BAD_DEFLATE: Self = Violation { code: CloseCode::Invalid, reason: "invalid compressed data" };
    const LENGTH_TOP_BIT: Self = Self::protocol("64-bit payload length has its top bit set");
    const UNMASKED: Self = Self::protocol("client frame is not masked");
    const FRAGMENTED_CONTROL: Self = Self::protocol("fragmented control frame");
    const CONTROL_TOO_LONG: Self = Self::protocol("control frame payload over 125 bytes");
    const STRAY_CONTINUATION: Self = Self::protocol("continuation frame without a message in progress");
    const INTERLEAVED_MESSAGE: Self = Self::protocol("new data frame while a fragmented message is in progress");
    const CLOSE_ONE_BYTE: Self = Self::protocol("close frame payload of 1 byte");
    /// A close frame whose code may not be sent on the wire (RFC 6455 §7.4: any code outside
    /// [`is_valid_close_code`]'s 1000–1003, 1007–1014, 3000–4999): closed with 1002. Public for
    /// the fuzz oracle, which tells it apart from other violations.
    pub const BAD_CLOSE_CODE: Self = Self::protocol("close code not allowed on the wire");
    const INVALID_UTF8: Self = Violation { code: CloseCode::Invalid, reason: "invalid UTF-8 in text" };
    pub(super) const MESSAGE_TOO_BIG: Self = Violation { code: CloseCode::Size, reason: "message too big" };
}

/// One complete client message or control frame, payload unmasked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A complete text message; its UTF-8 is already validated.
    Text(Bytes),
    /// A complete binary message.
    Binary(Bytes),
    /// A ping (§5.5.2); the caller answers with [`pong_frame`] of the same payload.
    Ping(Bytes),
    /// A pong (§5.5.3); counts as liveness.
    Pong(Bytes),
    /// A close frame (§5.5.1). `code` is `None` when the payload was empty (the peer sent no
    /// status, reported as 1005 in APIs); `reason` is valid UTF-8 and may be empty.
    Close {
        /// Status code (§7.4), already checked with [`is_valid_close_code`].
        code: Option<CloseCode>,
        /// Reason text after the code, UTF-8-checked.
        reason: Bytes,
    },
}

/// The largest bound [`Decoder::decode`] applies to a message (4 GiB − 1): the server's
/// `limits.max_message_bytes` is at most 1 GiB.
pub const MAX_MESSAGE_BYTES: usize = u32::MAX as usize;

/// A fragmented text or binary message being put together (§5.4).
#[derive(Debug)]
struct Assembly {
    text: bool,
    /// RSV1 was set on the first frame (RFC 7692 §6.1): `buf` holds DEFLATE data, inflated
    /// and UTF-8-checked when the final frame arrives.
    deflated: bool,
    buf: Vec<u8>,
}

/// Decoder of client frames for one connection (RFC 6455 §5), sans-IO.
///
/// 24 bytes inline. The only heap it owns is the assembly buffer of a fragmented message in
/// progress, freed as soon as that message completes or the connection is failed.
#[derive(Debug, Default)]
pub struct Decoder {
    /// `Some` only between the first and the final fragment of a message: an idle connection
    /// owns no buffer (the per-connection state stays compact, see `server::conn_state`).
    assembly: Option<Box<Assembly>>,
    /// Payload bytes of the frame at the front of the caller's buffer that were already
    /// UTF-8-checked while the frame was incomplete (fail-fast, §8.1). Reset when a frame is
    /// consumed. A `u32` (a data frame is at most [`MAX_MESSAGE_BYTES`]): the decoder sits in
    /// every connection's record, and these 4 bytes keep it at 16.
    checked: u32,
    /// Open code point at the end of the text checked so far (message-wide, across fragments).
    utf8: Utf8Carry,
}

impl Decoder {
    /// An idle decoder; allocates nothing.
    pub fn new() -> Self {
        Decoder::default()
    }

    /// True while a fragmented message is being assembled (after a non-final text or binary
    /// frame, until its final continuation frame).
    pub fn in_message(&self) -> bool {
        self.assembly.is_some()
    }

    /// Decodes from the front of `input`. Returns (bytes consumed, message).
    ///
    /// - `(0, None)`: `input` does not hold a complete frame yet. The caller keeps the bytes and
    ///   calls again with the same bytes plus more. A text payload is already UTF-8-checked as
    ///   far as it has arrived, so bad text fails before its frame is complete.
    /// - `(n > 0, None)`: a non-final data fragment was absorbed into the assembly buffer; call
    ///   again with `input[n..]`.
    /// - `(n, Some(msg))`: a complete message, or a control frame (control frames may arrive
    ///   between fragments and are returned at once, §5.4).
    /// - `Err(v)`: fail the connection with close code `v.code` (1002 framing, 1007 UTF-8, 1009
    ///   size). Oversize is reported as soon as the frame header is read, before its payload is
    ///   buffered. The decoder is reset (its buffer freed) on error.
    ///
    /// `max_message_bytes` bounds a whole message across its fragments (at most
    /// [`MAX_MESSAGE_BYTES`]; a larger bound counts as that). With `require_mask`, unmasked
    /// frames are refused (§5.1: client frames must be masked).
    pub fn decode(
        &mut self,
        input: &[u8],
        max_message_bytes: usize,
        require_mask: bool,
    ) -> Result<(usize, Option<Message>), Violation> {
        self.decode_with(input, max_message_bytes, require_mask, None)
    }

    /// [`Decoder::decode`] on a connection that negotiated permessage-deflate when `inflate`
    /// is given (RFC 7692 §6): RSV1 on the first frame of a data message marks it compressed;
    /// it is inflated (into at most `max_message_bytes`, else 1009) and UTF-8-checked once
    /// complete. RSV1 without the extension, or on a control or continuation frame, is 1002.
    pub fn decode_with(
        &mut self,
        input: &[u8],
        max_message_bytes: usize,
        require_mask: bool,
        inflate: Option<&Deflate>,
    ) -> Result<(usize, Option<Message>), Violation> {
        let rules = Rules { max_message_bytes: max_message_bytes.min(MAX_MESSAGE_BYTES), require_mask, inflate };
        let result = self.decode_frame(input, rules);
        if result.is_err() {
            *self = Decoder::default();
        }
        result
    }

    fn decode_frame(&mut self, input: &[u8], rules: Rules) -> Result<(usize, Option<Message>), Violation> {
        let Rules { max_message_bytes, require_mask, inflate } = rules;
        let mut cursor = Cursor::new(input);
        let (header, len) = match FrameHeader::parse(&mut cursor) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => return Ok((0, None)),
            // Reading from memory cannot fail, so the only error is a reserved opcode (§5.2).
            Err(_) => return Err(Violation::RESERVED_OPCODE),
        };
        let start = cursor.position() as usize;
        if (header.rsv1 && inflate.is_none()) || header.rsv2 || header.rsv3 {
            return Err(Violation::RSV_SET);
        }
        if len >> 63 != 0 {
            return Err(Violation::LENGTH_TOP_BIT);
        }
        if require_mask && header.mask.is_none() {
            return Err(Violation::UNMASKED);
        }
        let kind = match header.opcode {
            OpCode::Control(control @ (Control::Close | Control::Ping | Control::Pong)) => {
                if !header.is_final {
                    return Err(Violation::FRAGMENTED_CONTROL);
                }
                if len > MAX_CONTROL_PAYLOAD as u64 {
                    return Err(Violation::CONTROL_TOO_LONG);
                }
                if header.rsv1 {
                    return Err(Violation::RSV1_MISPLACED);
                }
                Kind::Control(control)
            }
            OpCode::Data(Data::Continue) => match &self.assembly {
                Some(_) if header.rsv1 => return Err(Violation::RSV1_MISPLACED),
                Some(assembly) => Kind::Data { text: assembly.text, deflated: assembly.deflated },
                None => return Err(Violation::STRAY_CONTINUATION),
            },
            OpCode::Data(data @ (Data::Text | Data::Binary)) => {
                if self.assembly.is_some() {
                    return Err(Violation::INTERLEAVED_MESSAGE);
                }
                Kind::Data { text: data == Data::Text, deflated: header.rsv1 }
            }
            OpCode::Data(Data::Reserved(_)) | OpCode::Control(Control::Reserved(_)) => {
                return Err(Violation::RESERVED_OPCODE)
            }
        };
        if let Kind::Data { .. } = kind {
            let assembled = self.assembly.as_ref().map_or(0, |a| a.buf.len());
            let room = max_message_bytes.saturating_sub(assembled);
            if len > room as u64 {
                return Err(Violation::MESSAGE_TOO_BIG);
            }
        }
        // `len` fits in usize: it is ≤ 125 or ≤ `room` above.
        let total = match start.checked_add(len as usize) {
            Some(total) => total,
            None => return Err(Violation::MESSAGE_TOO_BIG),
        };
        if input.len() < total {
            if let Kind::Data { text: true, deflated: false } = kind {
                self.check_partial_text(&input[start..], header.mask)?;
            }
            return Ok((0, None));
        }
        let payload = &input[start..total];
        let checked = (std::mem::take(&mut self.checked) as usize).min(payload.len());
        let message = match kind {
            Kind::Control(control) => Some(control_message(control, payload, header.mask)?),
            Kind::Data { text, deflated: false } => {
                self.absorb(text, header.is_final, payload, header.mask, checked)?
            }
            Kind::Data { text, deflated: true } => {
                let inflate = inflate.ok_or(Violation::RSV_SET)?;
                self.absorb_deflated(text, header.is_final, payload, header.mask, max_message_bytes, inflate)?
            }
        };
        Ok((total, message))
    }

    /// Adds a complete data frame's payload to the message in progress (or, for an unfragmented
    /// message, takes it alone) and returns the message when the frame is final.
    fn absorb(
        &mut self,
        text: bool,
        is_final: bool,
        payload: &[u8],
        mask: Option<[u8; 4]>,
        checked: usize,
    ) -> Result<Option<Message>, Violation> {
        if is_final && self.assembly.is_none() {
            // The common case: one frame, one message, no assembly buffer.
            let buf = unmasked_copy(payload, mask);
            if text {
                self.finish_text(&buf[checked..])?;
            }
            return Ok(Some(data_message(text, buf)));
        }
        let offset = self.gather(text, false, payload, mask);
        if let (true, Some(assembly)) = (text, &self.assembly) {
            self.utf8.feed(&assembly.buf[offset + checked..]).map_err(|_| Violation::INVALID_UTF8)?;
        }
        if !is_final {
            return Ok(None);
        }
        let Some(assembly) = self.assembly.take() else {
            return Ok(None);
        };
        if text {
            self.finish_text(&[])?;
        }
        Ok(Some(data_message(text, assembly.buf)))
    }

    /// Appends a fragment's payload, unmasked, to the message in progress (started here if
    /// none is); returns where it starts.
    fn gather(&mut self, text: bool, deflated: bool, payload: &[u8], mask: Option<[u8; 4]>) -> usize {
        let assembly = self.assembly.get_or_insert_with(|| Box::new(Assembly { text, deflated, buf: Vec::new() }));
        let offset = assembly.buf.len();
        assembly.buf.extend_from_slice(payload);
        if let Some(mask) = mask {
            apply_mask(&mut assembly.buf[offset..], mask, 0);
        }
        offset
    }

    /// [`Decoder::absorb`] for a compressed message: the DEFLATE data is gathered as it is
    /// (bounded by `max` like any message) and inflated, into at most `max` bytes, once the
    /// final frame is in; text is UTF-8-checked after inflating.
    fn absorb_deflated(
        &mut self,
        text: bool,
        is_final: bool,
        payload: &[u8],
        mask: Option<[u8; 4]>,
        max: usize,
        inflate: &Deflate,
    ) -> Result<Option<Message>, Violation> {
        let deflated = if is_final && self.assembly.is_none() {
            unmasked_copy(payload, mask)
        } else {
            self.gather(text, true, payload, mask);
            if !is_final {
                return Ok(None);
            }
            let Some(assembly) = self.assembly.take() else { return Ok(None) };
            assembly.buf
        };
        let buf = inflate.inflate(deflated, max)?;
        if text {
            self.finish_text(&buf)?;
        }
        Ok(Some(data_message(text, buf)))
    }

    /// Checks the last text bytes of a message and that no code point is left open.
    fn finish_text(&mut self, rest: &[u8]) -> Result<(), Violation> {
        let complete = self.utf8.feed(rest).is_ok() && self.utf8.is_complete();
        self.utf8 = Utf8Carry::default();
        if complete {
            Ok(())
        } else {
            Err(Violation::INVALID_UTF8)
        }
    }

    /// UTF-8-checks the part of an incomplete text frame that has arrived (`available` is the
    /// payload prefix), unmasking into a stack buffer since `input` is read-only. Only bytes not
    /// checked by an earlier call are looked at, so a frame trickling in costs O(length) overall.
    fn check_partial_text(&mut self, available: &[u8], mask: Option<[u8; 4]>) -> Result<(), Violation> {
        let from = (self.checked as usize).min(available.len());
        let mut scratch = [0u8; 512];
        let mut offset = from;
        for piece in available[from..].chunks(scratch.len()) {
            let plain = &mut scratch[..piece.len()];
            plain.copy_from_slice(piece);
            if let Some(mask) = mask {
                apply_mask(plain, mask, offset);
            }
            self.utf8.feed(plain).map_err(|_| Violation::INVALID_UTF8)?;
            offset += piece.len();
        }
        // `available` is a prefix of a data frame's payload, at most MAX_MESSAGE_BYTES.
        self.checked = self.checked.max(available.len() as u32);
        Ok(())
    }
}

/// What [`Decoder::decode_with`] was asked to enforce.
#[derive(Clone, Copy)]
struct Rules<'a> {
    max_message_bytes: usize,
    require_mask: bool,
    inflate: Option<&'a Deflate>,
}

/// What the frame at the front of the input is, once its header has passed the §5 checks.
#[derive(Clone, Copy)]
enum Kind {
    Control(Control),
    /// `deflated`: a permessage-deflate message (RSV1 on its first frame).
    Data {
        text: bool,
        deflated: bool,
    },
}

fn unmasked_copy(payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut buf = payload.to_vec();
    if let Some(mask) = mask {
        apply_mask(&mut buf, mask, 0);
    }
    buf
}

fn data_message(text: bool, buf: Vec<u8>) -> Message {
    let payload = Bytes::from(buf);
    if text {
        Message::Text(payload)
    } else {
        Message::Binary(payload)
    }
}

/// Builds a ping, pong or close message, applying the close-frame payload rules (§5.5.1, §7.4).
fn control_message(control: Control, payload: &[u8], mask: Option<[u8; 4]>) -> Result<Message, Violation> {
    let payload = Bytes::from(unmasked_copy(payload, mask));
    match control {
        Control::Ping => Ok(Message::Ping(payload)),
        Control::Pong => Ok(Message::Pong(payload)),
        _ => match payload.len() {
            0 => Ok(Message::Close { code: None, reason: Bytes::new() }),
            1 => Err(Violation::CLOSE_ONE_BYTE),
            _ => {
                let code = u16::from_be_bytes([payload[0], payload[1]]);
                if !is_valid_close_code(code) {
                    return Err(Violation::BAD_CLOSE_CODE);
                }
                let reason = payload.slice(2..);
                if std::str::from_utf8(&reason).is_err() {
                    return Err(Violation::INVALID_UTF8);
                }
                Ok(Message::Close { code: Some(CloseCode::from(code)), reason })
            }
        },
    }
}

/// Whether `code` may appear in a close frame on the wire (RFC 6455 §7.4.1/§7.4.2 + IANA registry): 1000–1003, 1007–1014, 3000–4999.
///
/// 1004 is reserved, 1005/1006/1015 are for APIs only and must never be sent, 1016–2999 are
/// reserved for future RFCs, and anything below 1000 or above 4999 is undefined.
pub fn is_valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}
