//! Mutations of the engine: byte-level (bit flips, interesting values, insertions, deletions,
//! chunk duplication, splicing, dictionary tokens), line-level (HTTP heads) and frame-level
//! (re-framing a WebSocket stream so lengths stay consistent while opcodes, flags, masks and
//! fragmentation change).

use rand::rngs::SmallRng;
use rand::Rng;

/// Tokens of HTTP/1.1 request heads and of the headers tether reads.
pub(super) const HTTP_TOKENS: &[&[u8]] = &[
    b"\r\n",
    b"\r\n\r\n",
    b"\n",
    b"GET ",
    b"POST ",
    b"HEAD ",
    b"PUT ",
    b" HTTP/1.1\r\n",
    b" HTTP/1.0\r\n",
    b"/ws",
    b"/publish/news",
    b"/healthz",
    b"?top=3&token=a%20b",
    b"http://h.example",
    b"Host: h.example:8080\r\n",
    b"Host: [::1]\r\n",
    b"Upgrade: websocket\r\n",
    b"Connection: Upgrade\r\n",
    b"Connection: keep-alive, Upgrade\r\n",
    b"Connection: close\r\n",
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
    b"Sec-WebSocket-Version: 13\r\n",
    b"Content-Length: 5\r\n",
    b"Content-Length: 18446744073709551616\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip, chunked\r\n",
    b"Expect: 100-continue\r\n",
    b"Origin: http://a.example\r\n",
    b"Authorization: Bearer abc.def\r\n",
    b"Idempotency-Key: \"k1\"\r\n",
    b"5\r\nhello\r\n0\r\n\r\n",
    b"ffffffffffffffff\r\n",
    b"%",
    b"%zz",
    b"%00",
    b":",
    b",",
    b";",
    b"\t",
    b" ",
    b"\x81\x85\x00\x00\x00\x00hello",
];

/// The header of an empty frame masked with a zero key, whose first byte (FIN, RSV, opcode)
/// is `first`.
const fn empty_frame(first: u8) -> [u8; 6] {
    [first, 0x80, 0, 0, 0, 0]
}

/// Frame header bytes, lengths, close codes and UTF-8 edge cases (for zero-mask payloads).
pub(super) const FRAME_TOKENS: &[&[u8]] = &[
    // Text, non-final text, final and non-final continuation, binary, close, ping, pong, the
    // reserved opcodes 3 and 0xB, text with RSV1, a non-final ping.
    &empty_frame(0x81),
    &empty_frame(0x01),
    &empty_frame(0x80),
    &empty_frame(0x00),
    &empty_frame(0x82),
    &empty_frame(0x88),
    &empty_frame(0x89),
    &empty_frame(0x8a),
    &empty_frame(0x83),
    &empty_frame(0x8b),
    &empty_frame(0xc1),
    &empty_frame(0x09),
    &[0x81, 0x01],
    &[0xfe, 0x00, 0x7e],
    &[0xfe, 0x10, 0x01],
    &[0xff, 0, 0, 0, 0, 0, 0, 0x10, 0x01],
    &[0xff, 0x80, 0, 0, 0, 0, 0, 0, 0],
    &[0x03, 0xe8],
    &[0x03, 0xf6],
    &[0x03, 0xed],
    &[0x03, 0xf7],
    &[0x0b, 0xb8],
    &[0x13, 0x87],
    &[0x13, 0x88],
    &[0xce, 0xba],
    &[0xe2, 0x82, 0xac],
    &[0xf0, 0x9d, 0x84, 0x9e],
    &[0xed, 0xa0, 0x80],
    &[0xf4, 0x90, 0x80, 0x80],
    &[0xc0, 0x80],
    &[0xe2, 0x82],
    &[0xff],
    b"{\"op\":\"sub\",\"ch\":\"a\"}",
];

/// JSON fragments and the fields and values of the pub/sub protocol.
pub(super) const JSON_TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b",",
    b":",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"\\udc00\\ud800",
    b"\"op\":\"sub\"",
    b"\"op\":\"unsub\"",
    b"\"op\":\"pub\"",
    b"\"op\":\"refresh\"",
    b"\"ch\":\"news\"",
    b"\"ch\":\"a\\nb\"",
    b"\"id\":\"m1\"",
    b"\"from\":0",
    b"\"from\":-1",
    b"\"from\":18446744073709551616",
    b"\"epoch\":\"e\"",
    b"\"data\":",
    b"null",
    b"true",
    b"1e400",
    b"-0.0e-0",
    b"123456789012345678901234567890",
    b" \t\r\n",
    b"\xce\xba",
    b"\xed\xa0\x80",
    b"\xff",
];

/// Chunk-size lines, extensions and trailers.
pub(super) const CHUNK_TOKENS: &[&[u8]] = &[
    b"\r\n",
    b"0\r\n\r\n",
    b"5\r\nhello\r\n",
    b"1;ext=\"v\"\r\nx\r\n",
    b" ;e\r\n",
    b"\t",
    b"ffffffffffffffffff\r\n",
    b"1000\r\n",
    b"Trailer: x\r\n",
    b"%41",
    b"%",
    b"+",
    b"&",
    b"=",
    b"top=10&token=a",
];

const INTERESTING_BYTES: &[u8] = &[0, 1, 0x7d, 0x7e, 0x7f, 0x80, 0xfe, 0xff, b'\r', b'\n', b' ', b'"', b'\\', b'%'];

/// Applies 1, 2, 4 or 8 random mutations to `input`, keeping it at most `max_len` bytes.
/// `pool` is the working corpus (for splicing), `dictionary` the target's tokens, `reframe`
/// whether frame-level mutations apply.
pub(super) fn mutate(
    input: &mut Vec<u8>,
    pool: &[Vec<u8>],
    dictionary: &[&[u8]],
    reframe: bool,
    rng: &mut SmallRng,
    max_len: usize,
) {
    let rounds = 1 << rng.random_range(0..4);
    for _ in 0..rounds {
        match rng.random_range(0..12) {
            0 if !input.is_empty() => {
                let i = rng.random_range(0..input.len());
                input[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !input.is_empty() => {
                let i = rng.random_range(0..input.len());
                input[i] = rng.random();
            }
            2 if !input.is_empty() => {
                let i = rng.random_range(0..input.len());
                input[i] = INTERESTING_BYTES[rng.random_range(0..INTERESTING_BYTES.len())];
            }
            3 => {
                let at = rng.random_range(0..=input.len());
                let n = rng.random_range(1..=8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                input.splice(at..at, bytes);
            }
            4 if !input.is_empty() => {
                let (from, to) = range(rng, input.len());
                input.drain(from..to);
            }
            5 if !input.is_empty() => {
                let (from, to) = range(rng, input.len());
                let chunk = input[from..to].to_vec();
                let at = rng.random_range(0..=input.len());
                input.splice(at..at, chunk);
            }
            6 if !pool.is_empty() => {
                let other = &pool[rng.random_range(0..pool.len())];
                let keep = rng.random_range(0..=input.len());
                let from = rng.random_range(0..=other.len());
                input.truncate(keep);
                input.extend_from_slice(&other[from..]);
            }
            7 if !dictionary.is_empty() => {
                let token = dictionary[rng.random_range(0..dictionary.len())];
                let at = rng.random_range(0..=input.len());
                input.splice(at..at, token.iter().copied());
            }
            8 if !dictionary.is_empty() && !input.is_empty() => {
                let token = dictionary[rng.random_range(0..dictionary.len())];
                let at = rng.random_range(0..input.len());
                let end = (at + token.len()).min(input.len());
                input.splice(at..end, token.iter().copied());
            }
            9 if !input.is_empty() => {
                let value: u64 = match rng.random_range(0..6) {
                    0 => 125,
                    1 => 126,
                    2 => 127,
                    3 => 65535,
                    4 => 65536,
                    _ => 1 << 63,
                };
                let width = [2, 4, 8][rng.random_range(0..3)];
                let bytes = &value.to_be_bytes()[8 - width..];
                let at = rng.random_range(0..input.len());
                let end = (at + width).min(input.len());
                input.splice(at..end, bytes.iter().copied());
            }
            10 => lines(input, rng),
            _ if reframe => {
                if let Some(out) = reframe_stream(input, rng) {
                    *input = out;
                }
            }
            _ => {}
        }
    }
    input.truncate(max_len);
}

/// A random non-empty range of `0..len` (len > 0), biased to short ones.
fn range(rng: &mut SmallRng, len: usize) -> (usize, usize) {
    let from = rng.random_range(0..len);
    let max = (len - from).min(if rng.random_bool(0.8) { 16 } else { len });
    (from, from + rng.random_range(1..=max))
}

/// Duplicates, deletes or swaps CRLF-terminated lines (HTTP header fields, chunk lines).
fn lines(input: &mut Vec<u8>, rng: &mut SmallRng) {
    let mut parts: Vec<Vec<u8>> = input.split_inclusive(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    if parts.is_empty() {
        return;
    }
    let i = rng.random_range(0..parts.len());
    match rng.random_range(0..3) {
        0 => {
            let line = parts[i].clone();
            parts.insert(rng.random_range(0..=parts.len()), line);
        }
        1 => {
            parts.remove(i);
        }
        _ => {
            let j = rng.random_range(0..parts.len());
            parts.swap(i, j);
        }
    }
    *input = parts.concat();
}

/// One frame of a stream as the re-framer sees it: first header byte, mask, plain payload.
struct RawFrame {
    first: u8,
    mask: Option<[u8; 4]>,
    payload: Vec<u8>,
}

/// Splits `input` into frames (any header, lengths up to 64 KiB), changes one thing about one
/// of them (FIN, RSV, opcode, mask, payload length or content, fragmentation, an interleaved
/// ping, a copy), and encodes the stream again with consistent lengths. `None` when `input`
/// does not start with a whole frame.
fn reframe_stream(input: &[u8], rng: &mut SmallRng) -> Option<Vec<u8>> {
    let (mut frames, rest) = split_frames(input);
    if frames.is_empty() {
        return None;
    }
    let i = rng.random_range(0..frames.len());
    match rng.random_range(0..8) {
        0 => frames[i].first ^= 0x80,
        1 => frames[i].first ^= 0x10 << rng.random_range(0..3),
        2 => frames[i].first = (frames[i].first & 0xf0) | rng.random_range(0..16),
        3 => frames[i].mask = if frames[i].mask.is_some() { None } else { Some(rng.random()) },
        4 => {
            let n = rng.random_range(0..=frames[i].payload.len() * 2 + 4);
            let fill: u8 = rng.random();
            frames[i].payload.resize(n, fill);
        }
        5 if frames[i].payload.len() >= 2 => {
            // Fragment: the first part keeps the opcode without FIN, the rest continues.
            let cut = rng.random_range(1..frames[i].payload.len());
            let tail = frames[i].payload.split_off(cut);
            let fin = frames[i].first & 0x80;
            frames[i].first &= 0x7f;
            let next = RawFrame { first: fin | (frames[i].first & 0x70), mask: frames[i].mask, payload: tail };
            frames.insert(i + 1, next);
        }
        6 => {
            let ping = RawFrame { first: 0x89, mask: Some(rng.random()), payload: b"p".to_vec() };
            frames.insert(rng.random_range(0..=frames.len()), ping);
        }
        _ => {
            let copy = RawFrame { first: frames[i].first, mask: frames[i].mask, payload: frames[i].payload.clone() };
            frames.insert(i, copy);
        }
    }
    let mut out = Vec::with_capacity(input.len() + 16);
    for f in &frames {
        encode(&mut out, f, rng.random_bool(0.1));
    }
    out.extend_from_slice(rest);
    Some(out)
}

fn split_frames(mut input: &[u8]) -> (Vec<RawFrame>, &[u8]) {
    let mut frames = Vec::new();
    while input.len() >= 2 && frames.len() < 256 {
        let (first, second) = (input[0], input[1]);
        let (len, mut at) = match second & 0x7f {
            126 if input.len() >= 4 => (u64::from(u16::from_be_bytes([input[2], input[3]])), 4),
            127 if input.len() >= 10 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&input[2..10]);
                (u64::from_be_bytes(b), 10)
            }
            126 | 127 => break,
            n => (u64::from(n), 2),
        };
        let mask = if second & 0x80 != 0 {
            let Some(m) = input.get(at..at + 4) else { break };
            at += 4;
            Some([m[0], m[1], m[2], m[3]])
        } else {
            None
        };
        if len > 65536 || input.len() < at + len as usize {
            break;
        }
        let mut payload = input[at..at + len as usize].to_vec();
        if let Some(m) = mask {
            unmask(&mut payload, m);
        }
        frames.push(RawFrame { first, mask, payload });
        input = &input[at + len as usize..];
    }
    (frames, input)
}

/// Appends `f` with a minimal length encoding, or with the longest one when `wide` (RFC 6455
/// asks for minimal, parsers accept both).
fn encode(out: &mut Vec<u8>, f: &RawFrame, wide: bool) {
    let mask_bit = if f.mask.is_some() { 0x80 } else { 0 };
    let len = f.payload.len();
    out.push(f.first);
    if len < 126 && !wide {
        out.push(mask_bit | len as u8);
    } else if len <= 0xffff && !wide {
        out.push(mask_bit | 126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(mask_bit | 127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    if let Some(m) = f.mask {
        out.extend_from_slice(&m);
    }
    let body = out.len();
    out.extend_from_slice(&f.payload);
    if let Some(m) = f.mask {
        unmask(&mut out[body..], m);
    }
}

fn unmask(buf: &mut [u8], mask: [u8; 4]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
}
