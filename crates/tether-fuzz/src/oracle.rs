//! tungstenite's own reader (`WebSocket` in server role over an in-memory stream) as the
//! oracle of the `frames` target: fed the same bytes, it must see the same messages and fail
//! in the same cases with the same close code.
//!
//! tungstenite errors carry no close code; they map as RFC 6455 §7.4.1 says: a protocol error
//! is 1002, invalid UTF-8 is 1007, a capacity error (message or frame over the limit) is 1009.
//!
//! Where tether is deliberately different, [`expected`] turns tether's outcome into what
//! tungstenite 0.30 reports for the same bytes, and nothing else is forgiven:
//! 1. **Earlier failure.** tether fails a frame as soon as its header (or, for text, the
//!    UTF-8 that has arrived) decides it; tungstenite waits for the whole frame. When tether
//!    failed on a frame that has not fully arrived, the oracle is fed that frame completed
//!    with zero bytes (only when its declared length is within the limit, which tungstenite
//!    checks at the header too).
//! 2. **Which of two violations.** A frame that breaks a framing rule (1002) and also declares
//!    a length over the limit: tether reports the framing rule, tungstenite the size (1009),
//!    which it checks before anything else. A close frame with a code not allowed on the wire
//!    and a reason that is not UTF-8: tether reports the code (1002), tungstenite the UTF-8
//!    (1007).
//! 3. **Close codes not allowed on the wire.** tungstenite does not fail the connection: it
//!    returns the close with code 1002 and reason "Protocol violation" (and answers 1002);
//!    tether fails it with 1002. Both end the connection with 1002.
//! 4. **1014.** tether accepts close code 1014 (IANA "Bad Gateway", RFC 6455 §7.4.2 registry);
//!    tungstenite 0.30 does not know it and treats it as in 3.

use std::io::{self, Cursor, Read, Write};

use tungstenite::protocol::frame::FrameHeader;
use tungstenite::protocol::{Role, WebSocket, WebSocketConfig};
use tungstenite::Error;

use super::frames::{Decoded, End};
use super::MAX_MESSAGE_BYTES;
use tether_proto::ws::codec::{CloseCode, Message, Violation};

/// A message as both readers can state it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Msg {
    Text(Vec<u8>),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    /// Close code and reason; `None` for an empty close payload.
    Close(Option<(u16, Vec<u8>)>),
}

/// How a reader's run over the input ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The input ran out with no violation.
    NeedMore,
    /// A close frame arrived; nothing after it is read.
    Closed,
    /// The connection must be failed with this close code.
    Failed(u16),
}

/// What a reader saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Outcome {
    pub(super) messages: Vec<Msg>,
    pub(super) verdict: Verdict,
}

/// Panics unless tungstenite, fed the same `data`, agrees with tether's `decoded` outcome
/// (modulo the documented differences of this module).
pub(super) fn check(data: &[u8], decoded: &Decoded) {
    let (want, input) = expected(data, decoded);
    let got = tungstenite(&input);
    if got != want {
        panic!(
            "frames: tungstenite disagrees\n tether (as tungstenite would say it): {want:?}\n tungstenite: {got:?}\n tether: {decoded:?}\n input: {}",
            super::hex_prefix(data, 512)
        );
    }
}

/// tether's outcome restated as tungstenite 0.30 reports it, and the bytes to feed
/// tungstenite (the input, with the failed frame completed when tether failed it early).
fn expected(data: &[u8], decoded: &Decoded) -> (Outcome, Vec<u8>) {
    let mut messages: Vec<Msg> = decoded.messages.iter().map(from_tether).collect();
    let mut input = data.to_vec();
    let verdict = match decoded.end {
        End::NeedMore { .. } => Verdict::NeedMore,
        End::Closed { .. } => {
            if let Some(Msg::Close(Some((1014, _)))) = messages.last() {
                messages.pop();
                messages.push(protocol_violation_close());
            }
            Verdict::Closed
        }
        End::Failed { at, violation, .. } => {
            let frame = Frame::at(&data[at..]);
            let code = u16::from(violation.code);
            match frame {
                Some(f) if violation == Violation::BAD_CLOSE_CODE => {
                    if std::str::from_utf8(f.payload(data, at).get(2..).unwrap_or_default()).is_err() {
                        Verdict::Failed(1007)
                    } else {
                        messages.push(protocol_violation_close());
                        Verdict::Closed
                    }
                }
                Some(f) if f.len > MAX_MESSAGE_BYTES as u64 => {
                    // tungstenite checks the frame size first, at the header.
                    Verdict::Failed(1009)
                }
                Some(f) => {
                    // Complete the frame so tungstenite can decide it.
                    let end = at + f.total();
                    input.truncate(end);
                    input.resize(end, 0);
                    Verdict::Failed(code)
                }
                None => Verdict::Failed(code),
            }
        }
    };
    (Outcome { messages, verdict }, input)
}

fn protocol_violation_close() -> Msg {
    Msg::Close(Some((u16::from(CloseCode::Protocol), b"Protocol violation".to_vec())))
}

fn from_tether(m: &Message) -> Msg {
    match m {
        Message::Text(p) => Msg::Text(p.to_vec()),
        Message::Binary(p) => Msg::Binary(p.to_vec()),
        Message::Ping(p) => Msg::Ping(p.to_vec()),
        Message::Pong(p) => Msg::Pong(p.to_vec()),
        Message::Close { code, reason } => Msg::Close(code.map(|c| (u16::from(c), reason.to_vec()))),
    }
}

/// The header of the frame at the front of some bytes (tungstenite's parser).
struct Frame {
    header_len: usize,
    len: u64,
    mask: Option<[u8; 4]>,
}

impl Frame {
    fn at(bytes: &[u8]) -> Option<Frame> {
        let mut cursor = Cursor::new(bytes);
        let (header, len) = FrameHeader::parse(&mut cursor).ok()??;
        Some(Frame { header_len: cursor.position() as usize, len, mask: header.mask })
    }

    /// Header plus payload; only called for a length within the limit.
    fn total(&self) -> usize {
        self.header_len + self.len as usize
    }

    /// The unmasked payload of this frame at `data[at..]` (as much as has arrived).
    fn payload(&self, data: &[u8], at: usize) -> Vec<u8> {
        let start = (at + self.header_len).min(data.len());
        let end = (start as u64).saturating_add(self.len).min(data.len() as u64) as usize;
        let mut p = data[start..end].to_vec();
        if let Some(mask) = self.mask {
            for (i, b) in p.iter_mut().enumerate() {
                *b ^= mask[i % 4];
            }
        }
        p
    }
}

/// The bytes a client sent, then "would block": a socket with nothing more to read.
struct Feed {
    data: Vec<u8>,
    pos: usize,
}

impl Read for Feed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let rest = &self.data[self.pos..];
        if rest.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.pos += n;
        Ok(n)
    }
}

impl Write for Feed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Pongs and the close answer are not compared: the session check covers answers.
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What tungstenite's server-side reader makes of `data`, with tether's message limit as both
/// its message and frame limit.
pub(super) fn tungstenite(data: &[u8]) -> Outcome {
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES));
    let mut ws = WebSocket::from_raw_socket(Feed { data: data.to_vec(), pos: 0 }, Role::Server, Some(config));
    let mut messages = Vec::new();
    loop {
        use tungstenite::Message as T;
        match ws.read() {
            Ok(T::Text(t)) => messages.push(Msg::Text(t.as_bytes().to_vec())),
            Ok(T::Binary(b)) => messages.push(Msg::Binary(b.to_vec())),
            Ok(T::Ping(p)) => messages.push(Msg::Ping(p.to_vec())),
            Ok(T::Pong(p)) => messages.push(Msg::Pong(p.to_vec())),
            Ok(T::Close(c)) => {
                messages.push(Msg::Close(c.map(|f| (u16::from(f.code), f.reason.as_bytes().to_vec()))));
                return Outcome { messages, verdict: Verdict::Closed };
            }
            Ok(T::Frame(_)) => unreachable!("tungstenite's reader returns messages, never raw frames"),
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                return Outcome { messages, verdict: Verdict::NeedMore }
            }
            Err(e) => {
                let code = match e {
                    Error::Protocol(_) => 1002,
                    Error::Utf8(_) => 1007,
                    Error::Capacity(_) => 1009,
                    other => panic!("frames: unexpected tungstenite error {other:?}"),
                };
                return Outcome { messages, verdict: Verdict::Failed(code) };
            }
        }
    }
}
