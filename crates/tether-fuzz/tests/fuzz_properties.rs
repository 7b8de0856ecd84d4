//! Property tests (proptest) for the parsers that read client bytes, on generated inputs
//! with generated split points (docs/security.md, "Fuzzing"): the invariants of the
//! `tether_fuzz` targets (same outcome whatever the split, tungstenite's reader as the frames
//! oracle, no panic), plus what each parser must make of well-formed input built here by an
//! independent encoder: the request that was written, the messages that were framed, the
//! fields that were sent, the body that was chunked.

use base64::Engine as _;
use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{json, Value};
use tether_proto::http::parse_request;
use tether_proto::protocol::{parse_client_op, ClientOp};
use tether_proto::ws::codec::{Decoder, Message};
use tether_proto::ws::handshake::check_upgrade;

// ---- HTTP requests ----

/// A header name in random letter case.
fn any_case(name: &'static str) -> impl Strategy<Value = String> {
    vec(any::<bool>(), name.len()).prop_map(move |upper| {
        name.chars().zip(upper).map(|(c, u)| if u { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() }).collect()
    })
}

/// Extra header fields tether does not read (browser noise), 0–4 of them.
fn noise() -> impl Strategy<Value = Vec<(String, String)>> {
    vec(("X-[A-Za-z]{1,12}", "[ -~]{0,40}"), 0..4)
        .prop_map(|v| v.into_iter().map(|(n, val)| (n, val.trim().to_owned())).collect())
}

fn head(line: &str, fields: &[(String, String)]) -> Vec<u8> {
    let mut out = format!("{line}\r\n");
    for (n, v) in fields {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// A well-formed upgrade request and its key.
fn upgrade_request() -> impl Strategy<Value = (Vec<u8>, String)> {
    (
        any::<[u8; 16]>(),
        any_case("upgrade"),
        any_case("connection"),
        any_case("sec-websocket-key"),
        noise(),
        any::<bool>(),
    )
        .prop_map(|(nonce, upgrade, connection, key_name, noise, keep_alive)| {
            let key = base64::engine::general_purpose::STANDARD.encode(nonce);
            let mut fields = vec![
                ("Host".to_owned(), "tether.example:8080".to_owned()),
                (upgrade, "websocket".to_owned()),
                (connection, if keep_alive { "keep-alive, Upgrade" } else { "Upgrade" }.to_owned()),
                (key_name, key.clone()),
                ("Sec-WebSocket-Version".to_owned(), "13".to_owned()),
            ];
            fields.extend(noise);
            (head("GET /ws?token=t HTTP/1.1", &fields), key)
        })
}

/// `body` chunked at `sizes` (cycled), with an extension on some chunk lines and a trailer.
fn chunked(body: &[u8], sizes: &[usize], ext: bool, trailer: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].clamp(1, rest.len());
        out.extend_from_slice(format!("{n:X}").as_bytes());
        if ext && i % 2 == 0 {
            out.extend_from_slice(b";name=\"v\"");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
        i += 1;
    }
    out.extend_from_slice(b"0\r\n");
    if trailer {
        out.extend_from_slice(b"X-Checksum: 1\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A publish request with a `Content-Length` or chunked body, and the body.
fn publish_request() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (vec(any::<u8>(), 0..300), vec(1usize..64, 1..5), any::<bool>(), any::<bool>(), any::<bool>(), noise()).prop_map(
        |(body, sizes, is_chunked, ext, trailer, noise)| {
            let mut fields = vec![("Host".to_owned(), "h".to_owned())];
            fields.extend(noise);
            let mut req = if is_chunked {
                fields.push(("Transfer-Encoding".to_owned(), "chunked".to_owned()));
                let mut r = head("POST /publish/news HTTP/1.1", &fields);
                r.extend(chunked(&body, &sizes, ext, trailer));
                r
            } else {
                fields.push(("Content-Length".to_owned(), body.len().to_string()));
                let mut r = head("POST /publish/news HTTP/1.1", &fields);
                r.extend_from_slice(&body);
                r
            };
            req.shrink_to_fit();
            (req, body)
        },
    )
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    vec(0usize..2048, 0..12)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn upgrade_requests_parse_whatever_the_split((req, key) in upgrade_request(), cuts in cuts()) {
        let parsed = parse_request(&req, 8192).unwrap().expect("complete head");
        prop_assert_eq!(parsed.head_len, req.len());
        let accept = check_upgrade(&parsed).unwrap();
        prop_assert_eq!(accept, tungstenite::handshake::derive_accept_key(key.as_bytes()));
        prop_assert_eq!(parsed.query.as_deref(), Some("token=t"));
        tether_fuzz::handshake_split(&req, &cuts);
    }

    #[test]
    fn publish_bodies_decode_whatever_the_split((req, body) in publish_request(), cuts in cuts()) {
        let parsed = parse_request(&req, 8192).unwrap().expect("complete head");
        let rest = &req[parsed.head_len..];
        let decoded = if parsed.chunked {
            let (b, n) = tether_proto::http::decode_chunked(rest, 1 << 20).unwrap().expect("complete body");
            prop_assert_eq!(n, rest.len());
            tether_fuzz::http_body_split(rest, &cuts);
            b
        } else {
            prop_assert_eq!(parsed.content_length, Some(body.len()));
            rest.to_vec()
        };
        prop_assert_eq!(decoded, body);
        tether_fuzz::handshake_split(&req, &cuts);
    }

    #[test]
    fn pipelined_and_mutated_requests_agree_whatever_the_split(
        reqs in vec(prop_oneof![upgrade_request().prop_map(|r| r.0), publish_request().prop_map(|r| r.0)], 1..4),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        cuts in cuts(),
    ) {
        let mut bytes = reqs.concat();
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        tether_fuzz::handshake_split(&bytes, &cuts);
    }
}

// ---- frames ----

/// One message a client sends, before framing.
#[derive(Debug, Clone)]
enum Sent {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
}

fn sent() -> impl Strategy<Value = Sent> {
    prop_oneof![
        "\\PC{0,80}".prop_map(Sent::Text),
        vec(any::<u8>(), 0..300).prop_map(Sent::Binary),
        vec(any::<u8>(), 0..126).prop_map(Sent::Ping),
        vec(any::<u8>(), 0..126).prop_map(Sent::Pong),
    ]
}

/// One masked client frame, written here (not by tether's encoder): FIN, opcode, the
/// shortest length form, the masking key, the masked payload (RFC 6455 §5.2, §5.3).
fn frame(out: &mut Vec<u8>, fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) {
    out.push(if fin { 0x80 } else { 0 } | opcode);
    match payload.len() {
        n @ 0..=125 => out.push(0x80 | n as u8),
        n @ 126..=0xffff => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
}

/// Frames `msgs`, data messages cut into up to `parts` fragments with a ping between the
/// first two, then a close with `close` (code, reason) if given; returns the stream and the
/// messages the decoder must return.
fn encode(msgs: &[Sent], parts: usize, mask: [u8; 4], close: Option<(u16, String)>) -> (Vec<u8>, Vec<Message>) {
    let mut out = Vec::new();
    let mut want = Vec::new();
    for m in msgs {
        match m {
            Sent::Text(_) | Sent::Binary(_) if parts > 1 => {
                let (op, bytes) = match m {
                    Sent::Text(t) => (1, t.as_bytes().to_vec()),
                    Sent::Binary(b) => (2, b.clone()),
                    _ => unreachable!(),
                };
                let step = bytes.len().div_ceil(parts).max(1);
                let chunks: Vec<&[u8]> = if bytes.is_empty() { vec![&[][..]] } else { bytes.chunks(step).collect() };
                for (i, c) in chunks.iter().enumerate() {
                    frame(&mut out, i + 1 == chunks.len(), if i == 0 { op } else { 0 }, c, mask);
                    if i == 0 && chunks.len() > 1 {
                        frame(&mut out, true, 0x9, b"between", mask);
                        want.push(Message::Ping(b"between".to_vec().into()));
                    }
                }
                want.push(if op == 1 { Message::Text(bytes.into()) } else { Message::Binary(bytes.into()) });
            }
            Sent::Text(t) => {
                frame(&mut out, true, 1, t.as_bytes(), mask);
                want.push(Message::Text(t.clone().into_bytes().into()));
            }
            Sent::Binary(b) => {
                frame(&mut out, true, 2, b, mask);
                want.push(Message::Binary(b.clone().into()));
            }
            Sent::Ping(p) => {
                frame(&mut out, true, 9, p, mask);
                want.push(Message::Ping(p.clone().into()));
            }
            Sent::Pong(p) => {
                frame(&mut out, true, 10, p, mask);
                want.push(Message::Pong(p.clone().into()));
            }
        }
    }
    if let Some((code, reason)) = close {
        let mut payload = code.to_be_bytes().to_vec();
        payload.extend_from_slice(reason.as_bytes());
        frame(&mut out, true, 8, &payload, mask);
        want.push(Message::Close { code: Some(code.into()), reason: reason.into_bytes().into() });
    }
    (out, want)
}

fn close() -> impl Strategy<Value = Option<(u16, String)>> {
    // A reason of at most 30 characters (120 bytes) fits a control frame next to the code.
    proptest::option::of((prop_oneof![1000u16..=1003, 1007u16..=1014, 3000u16..=4999], "\\PC{0,30}"))
}

/// Decodes `stream` (whole) with tether's decoder: every message, up to the first close.
fn decode_all(stream: &[u8]) -> Vec<Message> {
    let mut d = Decoder::new();
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < stream.len() {
        match d.decode(&stream[pos..], tether_fuzz::MAX_MESSAGE_BYTES, true) {
            Ok((0, None)) => break,
            Ok((n, m)) => {
                pos += n;
                out.extend(m);
            }
            Err(v) => panic!("valid stream refused: {v:?}"),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn framed_messages_decode_as_sent_whatever_the_split(
        msgs in vec(sent(), 0..6),
        parts in 1usize..4,
        mask in any::<[u8; 4]>(),
        close in close(),
        cuts in cuts(),
    ) {
        let (stream, want) = encode(&msgs, parts, mask, close);
        prop_assert_eq!(decode_all(&stream), want);
        // Split invariance, tungstenite's agreement and the session's answers.
        tether_fuzz::frames_split(&stream, &cuts);
    }

    #[test]
    fn damaged_frame_streams_agree_with_tungstenite_whatever_the_split(
        msgs in vec(sent(), 1..5),
        parts in 1usize..4,
        mask in any::<[u8; 4]>(),
        close in close(),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut_at in any::<prop::sample::Index>(),
        cuts in cuts(),
    ) {
        let (mut stream, _) = encode(&msgs, parts, mask, close);
        for (at, x) in flips {
            let i = at.index(stream.len());
            stream[i] ^= x;
        }
        stream.truncate(cut_at.index(stream.len() + 1));
        tether_fuzz::frames_split(&stream, &cuts);
    }
}

// ---- protocol JSON ----

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        "\\PC{0,20}|[\\x00-\\x1f\"\\\\]{0,4}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec(("[a-z]{0,6}", inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn channel() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[A-Za-z0-9._:-]{1,128}",
        1 => "[A-Za-z0-9._:\\-\n\x1b/ ]{0,130}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn sub_and_pub_fields_come_back_as_sent(
        ch in channel(),
        from in proptest::option::of(any::<u64>()),
        epoch in proptest::option::of("\\PC{0,12}"),
        id in "[ -~]{1,128}",
        data in json_value(),
        pretty in any::<bool>(),
    ) {
        let valid = tether_proto::protocol::valid_channel(&ch);
        let sub = json!({"op": "sub", "ch": ch, "from": from, "epoch": epoch});
        let publish = json!({"op": "pub", "ch": ch, "id": id, "data": data});
        for msg in [&sub, &publish] {
            let text = if pretty { serde_json::to_vec_pretty(msg) } else { serde_json::to_vec(msg) }.unwrap();
            tether_fuzz::protocol(&text);
            match parse_client_op(&text) {
                Ok(ClientOp::Sub { ch: c, from: f, epoch: e, join_leave: false }) => {
                    prop_assert!(valid);
                    prop_assert_eq!((c.as_str(), f, e.as_deref()), (ch.as_str(), from, epoch.as_deref()));
                }
                Ok(ClientOp::Pub { ch: c, id: i, data: d }) => {
                    prop_assert!(valid);
                    prop_assert_eq!((c.as_str(), i.as_str()), (ch.as_str(), id.as_str()));
                    // Byte for byte: tether only removes whitespace, and serde_json's compact
                    // output has none.
                    prop_assert_eq!(d.get(), serde_json::to_string(&data).unwrap());
                }
                Ok(other) => prop_assert!(false, "parsed as {other:?}"),
                Err(e) => {
                    prop_assert!(!valid, "refused {e:?}");
                    prop_assert_eq!(e.code, tether_proto::protocol::codes::BAD_CHANNEL);
                }
            }
        }
    }

    #[test]
    fn random_json_and_bytes_never_break_the_protocol_parser(
        v in json_value(),
        bytes in vec(any::<u8>(), 0..200),
    ) {
        tether_fuzz::protocol(serde_json::to_string(&v).unwrap().as_bytes());
        tether_fuzz::protocol(&bytes);
    }

    #[test]
    fn chunked_bodies_decode_as_sent_whatever_the_split(
        body in vec(any::<u8>(), 0..600),
        sizes in vec(1usize..100, 1..6),
        ext in any::<bool>(),
        trailer in any::<bool>(),
        tail in vec(any::<u8>(), 0..20),
        cuts in cuts(),
    ) {
        let mut encoded = chunked(&body, &sizes, ext, trailer);
        let len = encoded.len();
        encoded.extend_from_slice(&tail);
        prop_assert_eq!(tether_proto::http::decode_chunked(&encoded, 1 << 20).unwrap(), Some((body, len)));
        tether_fuzz::http_body_split(&encoded, &cuts);
    }
}
