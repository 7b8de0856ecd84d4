use super::*;
use crate::ws::codec::{encode_client_frame, text_frame, Decoder, Message};

const ANSWER: &str = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// RFC 7692 §5 and §7.1: the offer matrix, one row per `Sec-WebSocket-Extensions` value (all
/// headers joined with `, `), and the answer (`None`: the extension is declined).
#[test]
fn negotiation_matrix() {
    let with_window = format!("{ANSWER}; server_max_window_bits=15");
    let rows: &[(&str, Option<&str>)] = &[
        // Offered, alone or with each parameter.
        ("permessage-deflate", Some(ANSWER)),
        ("Permessage-Deflate", Some(ANSWER)),
        ("permessage-deflate; client_no_context_takeover", Some(ANSWER)),
        ("permessage-deflate; server_no_context_takeover", Some(ANSWER)),
        ("permessage-deflate; server_no_context_takeover; client_no_context_takeover", Some(ANSWER)),
        ("permessage-deflate; client_max_window_bits", Some(ANSWER)),
        ("permessage-deflate; client_max_window_bits=10", Some(ANSWER)),
        ("permessage-deflate; client_max_window_bits=\"9\"", Some(ANSWER)),
        ("permessage-deflate;client_max_window_bits;server_no_context_takeover", Some(ANSWER)),
        ("permessage-deflate; server_max_window_bits=15", Some(with_window.as_str())),
        // What Chromium and Firefox send.
        ("permessage-deflate; client_max_window_bits", Some(ANSWER)),
        // Not offered, or something else offered.
        ("", None),
        ("x-webkit-deflate-frame", None),
        ("permessage-deflate-x", None),
        // A window tether does not compress with: that offer declined.
        ("permessage-deflate; server_max_window_bits=10", None),
        ("permessage-deflate; server_max_window_bits=8", None),
        // Malformed parameters: unknown, duplicate, bad value → that offer is not acceptable.
        ("permessage-deflate; foo", None),
        ("permessage-deflate; client_no_context_takeover; client_no_context_takeover", None),
        ("permessage-deflate; client_no_context_takeover=1", None),
        ("permessage-deflate; server_max_window_bits", None),
        ("permessage-deflate; server_max_window_bits=16", None),
        ("permessage-deflate; client_max_window_bits=7", None),
        ("permessage-deflate; client_max_window_bits=010", None),
        ("permessage-deflate; client_max_window_bits=1a", None),
        ("permessage-deflate; client_max_window_bits=\"9", None),
        ("permessage-deflate; client_max_window_bits=", None),
        // Several offers (one header or several joined): the first acceptable one wins.
        ("permessage-deflate; server_max_window_bits=10, permessage-deflate", Some(ANSWER)),
        ("permessage-deflate; foo, permessage-deflate; client_max_window_bits", Some(ANSWER)),
        ("x-webkit-deflate-frame, permessage-deflate; server_max_window_bits=15", Some(with_window.as_str())),
        ("permessage-deflate; server_max_window_bits=15, permessage-deflate", Some(with_window.as_str())),
        ("permessage-deflate; bad, permessage-deflate; worse", None),
    ];
    for (offer, want) in rows {
        let got = negotiate(offer).map(|a| a.response);
        assert_eq!(got.as_deref(), *want, "offer {offer:?}");
    }
}

fn deflate() -> Deflate {
    Deflate::new(Some(DeflateConfig { min_bytes: 16, level: 6 }))
}

fn book() -> Vec<u8> {
    let mut s = String::from("{\"ch\":\"book\",\"seq\":1,\"data\":{\"bids\":[");
    for i in 0..30 {
        s += &format!("[\"{}.{:02}\",\"{}.{:04}\"],", 97000 - i, (i * 37) % 100, 1 + i % 3, (i * 7919) % 10000);
    }
    s.pop();
    s += "]}}";
    s.into_bytes()
}

/// A client frame of a compressed message: `payload` compressed on its own, tail stripped.
fn client_deflated(d: &Deflate, payload: &[u8], fin: bool) -> Vec<u8> {
    let frame = d.deflate_message(OpCode::from(1), payload).expect("shrinks");
    let hl = match frame[1] & 0x7f {
        126 => 4,
        127 => 10,
        _ => 2,
    };
    let mut out = encode_client_frame(0x1, fin, &frame[hl..], [1, 2, 3, 4]);
    out[0] |= 0x40;
    out
}

#[test]
fn a_frame_compresses_on_its_own_and_inflates_back() {
    let d = deflate();
    let payload = book();
    let frame = d.deflate_frame(&text_frame(&payload)).expect("a JSON book shrinks");
    assert_eq!(frame[0], 0xC1, "FIN, RSV1, text");
    assert!(frame.len() * 2 < payload.len(), "{} of {}", frame.len(), payload.len());
    let hl = if frame[1] & 0x7f == 126 { 4 } else { 2 };
    assert_eq!(d.inflate(frame[hl..].to_vec(), 1 << 20).unwrap(), payload);
    // The same bytes every time: no context is carried between messages.
    assert_eq!(d.deflate_frame(&text_frame(&payload)).unwrap(), frame);
    // Under min_bytes, or not shrinking: plain.
    assert!(d.deflate_frame(&text_frame(b"{\"a\":1}")).is_none());
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let noise: Vec<u8> = (0..300)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    assert!(d.deflate_message(OpCode::from(2), &noise).is_none());
    assert!(Deflate::new(None).deflate_frame(&text_frame(&payload)).is_none(), "off: never");
}

#[test]
fn the_decoder_inflates_single_and_fragmented_messages() {
    let d = deflate();
    let payload = book();
    let mut dec = Decoder::new();
    let wire = client_deflated(&d, &payload, true);
    let (n, m) = dec.decode_with(&wire, 1 << 20, true, Some(&d)).unwrap();
    assert_eq!((n, m), (wire.len(), Some(Message::Text(payload.clone().into()))));
    // Fragmented: RSV1 on the first frame only.
    let whole = client_deflated(&d, &payload, true);
    let body = whole[8..].to_vec(); // 2 + 2 (length 126 form) + 4 mask
    let mut plain = body.clone();
    for (i, b) in plain.iter_mut().enumerate() {
        *b ^= [1, 2, 3, 4][i % 4];
    }
    let (a, b) = plain.split_at(plain.len() / 2);
    let mut first = encode_client_frame(0x1, false, a, [9, 9, 9, 9]);
    first[0] |= 0x40;
    let second = encode_client_frame(0x0, true, b, [7, 7, 7, 7]);
    assert_eq!(dec.decode_with(&first, 1 << 20, true, Some(&d)).unwrap(), (first.len(), None));
    let (_, m) = dec.decode_with(&second, 1 << 20, true, Some(&d)).unwrap();
    assert_eq!(m, Some(Message::Text(payload.into())));
}

#[test]
fn rsv1_misuse_is_1002_and_a_bomb_is_1009() {
    let d = deflate();
    let payload = book();
    let wire = client_deflated(&d, &payload, true);
    // Not negotiated.
    let err = Decoder::new().decode(&wire, 1 << 20, true).unwrap_err();
    assert_eq!(u16::from(err.code), 1002);
    // On a control frame.
    let mut ping = encode_client_frame(0x9, true, b"x", [1, 2, 3, 4]);
    ping[0] |= 0x40;
    assert_eq!(u16::from(Decoder::new().decode_with(&ping, 1 << 20, true, Some(&d)).unwrap_err().code), 1002);
    // On a continuation frame.
    let mut dec = Decoder::new();
    let first = encode_client_frame(0x1, false, b"{\"op\":", [1, 2, 3, 4]);
    dec.decode_with(&first, 1 << 20, true, Some(&d)).unwrap();
    let mut cont = encode_client_frame(0x0, true, b"1}", [1, 2, 3, 4]);
    cont[0] |= 0x40;
    assert_eq!(u16::from(dec.decode_with(&cont, 1 << 20, true, Some(&d)).unwrap_err().code), 1002);
    // A bomb: 16 MiB of zeros in a few KiB, against a 64 KiB bound.
    let zeros = vec![0u8; 16 << 20];
    let big = Deflate::new(Some(DeflateConfig { min_bytes: 0, level: 9 }));
    let bomb = client_deflated(&big, &zeros, true);
    assert!(bomb.len() < 64 << 10, "{}", bomb.len());
    let err = Decoder::new().decode_with(&bomb, 64 << 10, true, Some(&d)).unwrap_err();
    assert_eq!(u16::from(err.code), 1009);
    // Not DEFLATE at all.
    let mut junk = encode_client_frame(0x1, true, &[0xff; 40], [1, 2, 3, 4]);
    junk[0] |= 0x40;
    assert_eq!(u16::from(Decoder::new().decode_with(&junk, 1 << 20, true, Some(&d)).unwrap_err().code), 1007);
    // Invalid UTF-8 after inflating.
    let bad = client_deflated(&d, &[0xC3u8; 64], true);
    assert_eq!(u16::from(Decoder::new().decode_with(&bad, 1 << 20, true, Some(&d)).unwrap_err().code), 1007);
}
