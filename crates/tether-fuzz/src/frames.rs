//! The `frames` target: a client's frame stream after the upgrade, fed to the codec's decoder
//! (whole, split, against tungstenite) and to an upgraded session.

use std::io::Cursor;

use tungstenite::protocol::frame::FrameHeader;

use super::sim::{server_frames, Sim, Transcript};
use super::{
    assert_same_split, bucket, hash_of, hex_prefix, oracle, pieces, split_schedules, Signature, MAX_MESSAGE_BYTES,
};
use tether_proto::protocol::{self, codes};
use tether_proto::ws::codec::{Decoder, Message, Violation};

/// What the decoder made of a stream, read the way the session reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Decoded {
    /// Complete messages and control frames, in order, up to the first close frame.
    pub(super) messages: Vec<Message>,
    /// How the stream ended.
    pub(super) end: End,
}

/// How a decoded stream ended. Offsets are in the whole input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// The input ran out: bytes from `at` on wait for more; `in_message` while a fragmented
    /// message is open.
    NeedMore { at: usize, in_message: bool },
    /// A close frame ended at `at`; the session reads nothing after it.
    Closed { at: usize },
    /// The frame starting at `at` violates RFC 6455 or the limits; `assembled` bytes of a
    /// fragmented message had been absorbed before it.
    Failed { at: usize, violation: Violation, assembled: usize },
}

/// Feeds `data` to [`Decoder`] as one read and as several split schedules (the way
/// `Session::handle_bytes` does: unconsumed bytes kept and fed again with the next read), to
/// tungstenite's reader, and to an upgraded session. Panics unless:
/// - every split yields the same messages and the same end (need more at the same offset, a
///   close, or the same violation for the same frame);
/// - tungstenite agrees (the oracle; its documented differences are in `oracle.rs`);
/// - the session, whole and split, writes exactly the answers the messages call for (a pong
///   per ping, an `error` per refused text or binary message, the close echo, or the close
///   frame of the violation with its code) and hands up exactly the requests that parse.
///
/// The decoder's limit is `MAX_MESSAGE_BYTES`; frames must be masked.
pub fn frames(data: &[u8]) -> Signature {
    let whole = decode(&[data]);
    let schedules = split_schedules(data);
    for cuts in &schedules {
        compare(data, cuts, &whole);
    }
    oracle::check(data, &whole);
    check_session(data, &schedules[1], &whole);
    signature(&whole)
}

/// [`frames`] with the given cut points only (positions in `data`; proptest chooses them).
pub fn frames_split(data: &[u8], cuts: &[usize]) -> Signature {
    let whole = decode(&[data]);
    compare(data, cuts, &whole);
    oracle::check(data, &whole);
    check_session(data, cuts, &whole);
    signature(&whole)
}

fn compare(data: &[u8], cuts: &[usize], whole: &Decoded) {
    assert_same_split("frames (decoder)", data, cuts, whole, &decode(&pieces(data, cuts)));
}

/// The decoder loop of `Session::decode`, over reads `pieces`.
fn decode(pieces: &[&[u8]]) -> Decoded {
    let mut decoder = Decoder::new();
    let mut pending: Vec<u8> = Vec::new();
    // Offset in the whole input of `pending[0]`.
    let mut base = 0;
    let mut messages = Vec::new();
    let mut assembled = 0;
    for piece in pieces {
        pending.extend_from_slice(piece);
        let mut pos = 0;
        while pos < pending.len() {
            match decoder.decode(&pending[pos..], MAX_MESSAGE_BYTES, true) {
                Ok((0, None)) => break,
                Ok((n, None)) => {
                    assembled += n - header_len(&pending[pos..]);
                    pos += n;
                }
                Ok((n, Some(m))) => {
                    pos += n;
                    match m {
                        Message::Close { .. } => {
                            messages.push(m);
                            return Decoded { messages, end: End::Closed { at: base + pos } };
                        }
                        Message::Text(_) | Message::Binary(_) => assembled = 0,
                        _ => {}
                    }
                    messages.push(m);
                }
                Err(violation) => {
                    return Decoded { messages, end: End::Failed { at: base + pos, violation, assembled } };
                }
            }
        }
        pending.drain(..pos);
        base += pos;
    }
    Decoded { messages, end: End::NeedMore { at: base, in_message: decoder.in_message() } }
}

/// Header length of the (complete) frame at the front of `bytes`.
fn header_len(bytes: &[u8]) -> usize {
    let mut cursor = Cursor::new(bytes);
    match FrameHeader::parse(&mut cursor) {
        Ok(Some(_)) => cursor.position() as usize,
        other => panic!("frames: the decoder consumed a frame whose header does not parse: {other:?}"),
    }
}

/// One answer the session must write.
#[derive(Debug)]
enum Answer {
    /// This frame exactly: (opcode, payload).
    Exact(u8, Vec<u8>),
    /// A text `error` reply with this code.
    Error(&'static str),
}

fn check_session(data: &[u8], cuts: &[usize], decoded: &Decoded) {
    let run = |pieces: &[&[u8]]| -> Transcript {
        let mut sim = Sim::new();
        let mut s = sim.open_session();
        sim.run(&mut s, pieces)
    };
    let whole = run(&[data]);
    assert_same_split("frames (session)", data, cuts, &whole, &run(&pieces(data, cuts)));
    let mut answers = Vec::new();
    let mut requests = Vec::new();
    for m in &decoded.messages {
        match m {
            Message::Text(p) => match protocol::parse_client_op(p) {
                Ok(op) => requests.push(format!("op {op:?}")),
                Err(e) => {
                    requests.push(format!("refused request {} {:?}", e.code, e.ch));
                    answers.push(Answer::Exact(0x1, e.to_json()))
                }
            },
            Message::Binary(_) => answers.push(Answer::Error(codes::BAD_REQUEST)),
            Message::Ping(p) => answers.push(Answer::Exact(0xA, p.to_vec())),
            Message::Pong(_) => {}
            Message::Close { code, reason } => {
                requests.push(format!("peer closed {code:?} {reason:?}"));
                answers.push(Answer::Exact(0x8, close_payload(code.map_or(1000, u16::from), "")))
            }
        }
    }
    if let End::Failed { violation, .. } = decoded.end {
        answers.push(Answer::Exact(0x8, close_payload(u16::from(violation.code), violation.reason)));
    }
    let written = server_frames(&whole.output);
    let matches = written.len() == answers.len()
        && written.iter().zip(&answers).all(|((op, payload), want)| match want {
            Answer::Exact(o, p) => op == o && payload[..] == p[..],
            Answer::Error(code) => *op == 0x1 && is_error_with_code(payload, code),
        });
    if !matches || whole.events != requests {
        panic!(
            "frames: the session's answers differ from what the decoded messages call for\nwant: {answers:?}\n      {requests:?}\nwrote: {written:?}\n       {:?}\ninput: {}",
            whole.events,
            hex_prefix(data, 512)
        );
    }
    let end_ok = match decoded.end {
        End::NeedMore { .. } => whole.end == "Open None",
        End::Closed { .. } => whole.end == "Finishing Some(Close)",
        End::Failed { .. } => whole.end == "Finishing Some(Protocol)",
    };
    assert!(end_ok, "frames: session ended {:?} after {:?}", whole.end, decoded.end);
}

fn close_payload(code: u16, reason: &str) -> Vec<u8> {
    let mut p = code.to_be_bytes().to_vec();
    p.extend_from_slice(reason.as_bytes());
    p
}

fn is_error_with_code(payload: &[u8], code: &str) -> bool {
    serde_json::from_slice::<serde_json::Value>(payload)
        .is_ok_and(|v| v["op"] == "error" && v["code"] == code && v["reason"].is_string())
}

/// Message kinds with their lengths rounded to a power of two, and how the stream ended.
fn signature(d: &Decoded) -> Signature {
    let kinds: Vec<(u8, u32)> = d
        .messages
        .iter()
        .map(|m| match m {
            Message::Text(p) => (1, bucket(p.len())),
            Message::Binary(p) => (2, bucket(p.len())),
            Message::Ping(p) => (9, bucket(p.len())),
            Message::Pong(p) => (10, bucket(p.len())),
            Message::Close { code, reason } => (8, u32::from(code.map_or(0, u16::from)) << 8 | bucket(reason.len())),
        })
        .collect();
    let end = match d.end {
        End::NeedMore { in_message, .. } => format!("more {in_message}"),
        End::Closed { .. } => "closed".to_owned(),
        End::Failed { violation, .. } => violation.reason.to_owned(),
    };
    hash_of((kinds, end))
}
