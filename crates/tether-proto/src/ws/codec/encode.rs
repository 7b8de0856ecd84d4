//! Frame encoding (RFC 6455 §5.2): unmasked server frames, masked client frames for tests and
//! the load generator, and a server-frame decoder for raw test clients.

use std::io::Cursor;

use bytes::Bytes;
use tungstenite::protocol::frame::coding::{CloseCode, Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

use super::mask::apply_mask;
use super::{Violation, MAX_CONTROL_PAYLOAD};

/// Longest close reason that fits a control frame next to the 2-byte code (§5.5: payload ≤ 125).
const MAX_CLOSE_REASON: usize = MAX_CONTROL_PAYLOAD - 2;

/// Number of header bytes of an unmasked frame carrying `payload_len` bytes: 2 (length < 126),
/// 4 (16-bit extended length, up to 65535) or 10 (64-bit extended length), RFC 6455 §5.2.
pub fn header_len(payload_len: usize) -> usize {
    if payload_len < 126 {
        2
    } else if payload_len <= 0xFFFF {
        4
    } else {
        10
    }
}

/// The base header and extended payload length (§5.2) in a stack buffer, and its length;
/// `mask_bit` is 0x80 or 0. The one place a frame header is written.
fn header(first: u8, mask_bit: u8, len: usize) -> ([u8; 10], usize) {
    let mut h = [0u8; 10];
    h[0] = first;
    if len < 126 {
        h[1] = mask_bit | len as u8;
        (h, 2)
    } else if len <= 0xFFFF {
        h[1] = mask_bit | 126;
        h[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        (h, 4)
    } else {
        h[1] = mask_bit | 127;
        h[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        (h, 10)
    }
}

fn put_header(out: &mut Vec<u8>, first: u8, mask_bit: u8, len: usize) {
    let (h, n) = header(first, mask_bit, len);
    out.extend_from_slice(&h[..n]);
}

/// One server data frame of a permessage-deflate message: FIN and RSV1 set ("Per-Message
/// Compressed", RFC 7692 §6), unmasked, carrying the `deflated` payload (already stripped of
/// its `00 00 ff ff` tail, §7.2.1).
pub fn deflated_frame(opcode: OpCode, deflated: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(header_len(deflated.len()) + deflated.len());
    put_header(&mut out, 0xC0 | u8::from(opcode), 0, deflated.len());
    out.extend_from_slice(deflated);
    Bytes::from(out)
}

/// Appends one server frame to `out`: FIN set, RSV clear, unmasked (servers never mask, §5.1).
///
/// Reserves the whole frame up front, so `out` grows at most once.
pub fn encode_frame_into(out: &mut Vec<u8>, opcode: OpCode, payload: &[u8]) {
    out.reserve(header_len(payload.len()) + payload.len());
    put_header(out, 0x80 | u8::from(opcode), 0, payload.len());
    out.extend_from_slice(payload);
}

/// One server frame (see [`encode_frame_into`]) as shared `Bytes`: the bytes are identical for
/// every subscriber, so a published message is encoded once and handed to all of them.
pub fn encode_frame(opcode: OpCode, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(header_len(payload.len()) + payload.len());
    encode_frame_into(&mut out, opcode, payload);
    Bytes::from(out)
}

/// A text frame (opcode 0x1): every reply of protocol v1 is one JSON text.
pub fn text_frame(json: &[u8]) -> Bytes {
    encode_frame(OpCode::Data(Data::Text), json)
}

/// A text frame whose payload `write` appends to the buffer it is given (at most `capacity`
/// bytes, a hint). One allocation for header and payload, and the payload is never moved: the
/// header is written into room reserved in front of it. For the `msg` frame of each publish.
pub fn text_frame_with(capacity: usize, write: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    const MAX_HEADER: usize = 10;
    let mut out = Vec::with_capacity(MAX_HEADER + capacity);
    out.resize(MAX_HEADER, 0);
    write(&mut out);
    let (h, n) = header(0x80 | u8::from(OpCode::Data(Data::Text)), 0, out.len() - MAX_HEADER);
    let start = MAX_HEADER - n;
    out[start..MAX_HEADER].copy_from_slice(&h[..n]);
    let mut frame = Bytes::from(out);
    bytes::Buf::advance(&mut frame, start);
    frame
}

/// A close frame (§5.5.1) carrying `code` and `reason`. The reason is cut at the last char
/// boundary at or before 123 bytes so the payload stays within the 125-byte control limit and
/// remains valid UTF-8.
pub fn close_frame(code: CloseCode, reason: &str) -> Bytes {
    let mut end = reason.len().min(MAX_CLOSE_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut payload = [0u8; MAX_CONTROL_PAYLOAD];
    payload[..2].copy_from_slice(&u16::from(code).to_be_bytes());
    payload[2..2 + end].copy_from_slice(&reason.as_bytes()[..end]);
    encode_frame(OpCode::Control(Control::Close), &payload[..2 + end])
}

/// A ping frame (§5.5.2). The caller keeps `payload` within 125 bytes (§5.5).
pub fn ping_frame(payload: &[u8]) -> Bytes {
    encode_frame(OpCode::Control(Control::Ping), payload)
}

/// A pong frame (§5.5.3), normally echoing the payload of the ping it answers.
pub fn pong_frame(payload: &[u8]) -> Bytes {
    encode_frame(OpCode::Control(Control::Pong), payload)
}

/// A client frame (§5.1: masked with `mask`), with FIN as given and `opcode` in the low 4 bits.
/// For unit tests, the load generator and raw test clients; the server never sends these.
pub fn encode_client_frame(opcode: u8, fin: bool, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut out = Vec::with_capacity(header_len(payload.len()) + 4 + payload.len());
    let first = if fin { 0x80 } else { 0 } | (opcode & 0x0F);
    put_header(&mut out, first, 0x80, payload.len());
    out.extend_from_slice(&mask);
    let start = out.len();
    out.extend_from_slice(payload);
    apply_mask(&mut out[start..], mask, 0);
    out
}

/// Decodes one server frame from the front of `input`, for raw test clients.
///
/// `Ok(None)`: `input` does not hold the whole frame yet (nothing is consumed).
/// `Ok(Some((consumed, fin, opcode, payload)))`: one frame, `opcode` as the raw 4-bit value.
/// `Err(v)` with code 1002: RSV bits set, a reserved opcode, a masked frame (servers must not
/// mask, §5.1), a 64-bit length with the top bit set, or a control frame that is fragmented or
/// longer than 125 bytes (§5.5). Message-level rules (UTF-8, fragment order) are not checked.
pub fn decode_server_frame(input: &[u8]) -> Result<Option<(usize, bool, u8, Bytes)>, Violation> {
    match decode_server_frame_rsv1(input)? {
        Some((_, _, _, true, _)) => Err(Violation::RSV_SET),
        Some((n, fin, opcode, _, payload)) => Ok(Some((n, fin, opcode, payload))),
        None => Ok(None),
    }
}

/// One decoded server frame: (bytes consumed, FIN, raw 4-bit opcode, RSV1, payload).
pub type ServerFrame = (usize, bool, u8, bool, Bytes);

/// [`decode_server_frame`] for a client that negotiated permessage-deflate (RFC 7692 §6): RSV1
/// is allowed on the first frame of a data message and returned as the fourth field (`true`:
/// the message is compressed). RSV1 on a continuation or control frame (§6.1), and RSV2/RSV3,
/// are errors with code 1002, as are the other violations [`decode_server_frame`] lists.
pub fn decode_server_frame_rsv1(input: &[u8]) -> Result<Option<ServerFrame>, Violation> {
    let mut cursor = Cursor::new(input);
    let (header, len) = match FrameHeader::parse(&mut cursor) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => return Ok(None),
        Err(_) => return Err(Violation::RESERVED_OPCODE),
    };
    if header.rsv2 || header.rsv3 || (header.rsv1 && !matches!(header.opcode, OpCode::Data(Data::Text | Data::Binary)))
    {
        return Err(Violation::RSV_SET);
    }
    if header.mask.is_some() {
        return Err(Violation::protocol("server frame is masked"));
    }
    if len >> 63 != 0 {
        return Err(Violation::LENGTH_TOP_BIT);
    }
    if let OpCode::Control(_) = header.opcode {
        if !header.is_final {
            return Err(Violation::FRAGMENTED_CONTROL);
        }
        if len > MAX_CONTROL_PAYLOAD as u64 {
            return Err(Violation::CONTROL_TOO_LONG);
        }
    }
    let start = cursor.position() as usize;
    let total = match usize::try_from(len).ok().and_then(|len| start.checked_add(len)) {
        Some(total) => total,
        None => return Err(Violation::MESSAGE_TOO_BIG),
    };
    if input.len() < total {
        return Ok(None);
    }
    let payload = Bytes::copy_from_slice(&input[start..total]);
    Ok(Some((total, header.is_final, u8::from(header.opcode), header.rsv1, payload)))
}

/// The payload of an unmasked, unfragmented server text frame (RFC 6455 §5.2), as the
/// server's `msg` frames, replies and history are, without copying; `None` for anything else
/// (another opcode, a fragment, RSV bits, a mask, a short or truncated frame).
pub fn text_payload(frame: &[u8]) -> Option<&[u8]> {
    let mut cursor = Cursor::new(frame);
    let (header, len) = FrameHeader::parse(&mut cursor).ok().flatten()?;
    let plain = header.is_final && !header.rsv1 && !header.rsv2 && !header.rsv3 && header.mask.is_none();
    if !plain || header.opcode != OpCode::Data(Data::Text) {
        return None;
    }
    let start = cursor.position() as usize;
    frame.get(start..start.checked_add(usize::try_from(len).ok()?)?)
}
