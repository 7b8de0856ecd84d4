//! Decoder and encoder tests, no sockets: every §5 rule, fragments, limits, split input.

use bytes::Bytes;

use super::*;

const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];
const MAX: usize = 65536;

fn client(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
    encode_client_frame(opcode, fin, payload, MASK)
}

/// Decodes every frame in `input`, returning the messages, or the first violation.
fn decode_all(decoder: &mut Decoder, mut input: &[u8], max: usize) -> Result<Vec<Message>, Violation> {
    let mut out = Vec::new();
    loop {
        let (used, msg) = decoder.decode(input, max, true)?;
        out.extend(msg);
        if used == 0 {
            return Ok(out);
        }
        input = &input[used..];
    }
}

fn err_code(input: &[u8]) -> u16 {
    match decode_all(&mut Decoder::new(), input, MAX) {
        Err(v) => u16::from(v.code),
        Ok(msgs) => panic!("expected a violation, got {msgs:?}"),
    }
}

#[test]
fn rsv_bits_are_a_protocol_error() {
    for rsv in [0x40u8, 0x20, 0x10] {
        let mut frame = client(0x1, true, b"hi");
        frame[0] |= rsv;
        assert_eq!(err_code(&frame), 1002, "rsv {rsv:#x}");
    }
}

#[test]
fn reserved_opcodes_are_a_protocol_error() {
    for opcode in (3..=7).chain(0xB..=0xF) {
        assert_eq!(err_code(&client(opcode, true, b"")), 1002, "opcode {opcode:#x}");
    }
}

#[test]
fn control_frames_must_be_short_and_final() {
    assert_eq!(err_code(&client(0x9, true, &[b'x'; 126])), 1002);
    assert_eq!(err_code(&client(0x9, false, b"p")), 1002);
    assert_eq!(err_code(&client(0x8, false, &1000u16.to_be_bytes())), 1002);
    let msgs = decode_all(&mut Decoder::new(), &client(0x9, true, &[b'x'; 125]), MAX).unwrap();
    assert_eq!(msgs, vec![Message::Ping(Bytes::from(vec![b'x'; 125]))]);
}

#[test]
fn continuation_without_message_is_a_protocol_error() {
    assert_eq!(err_code(&client(0x0, true, b"x")), 1002);
    assert_eq!(err_code(&client(0x0, false, b"x")), 1002);
}

#[test]
fn new_message_during_fragmented_message_is_a_protocol_error() {
    for opcode in [0x1, 0x2] {
        let mut input = client(0x1, false, b"a");
        input.extend(client(opcode, true, b"b"));
        assert_eq!(err_code(&input), 1002);
    }
}

#[test]
fn unmasked_client_frame_is_refused_only_when_masks_are_required() {
    let frame = encode_frame(OpCode::Data(Data::Text), b"hello");
    assert_eq!(Decoder::new().decode(&frame, MAX, true).map_err(|v| u16::from(v.code)).unwrap_err(), 1002);
    let (used, msg) = Decoder::new().decode(&frame, MAX, false).unwrap();
    assert_eq!((used, msg), (frame.len(), Some(Message::Text(Bytes::from_static(b"hello")))));
}

#[test]
fn length_with_top_bit_set_is_a_protocol_error() {
    let mut frame = vec![0x82, 0x80 | 127];
    frame.extend_from_slice(&(1u64 << 63).to_be_bytes());
    frame.extend_from_slice(&MASK);
    assert_eq!(err_code(&frame), 1002);
}

#[test]
fn oversize_frame_fails_on_its_header_alone() {
    // Only the header of a 70000-byte frame: 1009 before any payload arrives.
    let frame = client(0x2, true, &vec![0u8; 70_000]);
    let header = &frame[..14];
    let err = Decoder::new().decode(header, MAX, true).unwrap_err();
    assert_eq!(err, Violation { code: CloseCode::Size, reason: "message too big" });
    // The limit is inclusive.
    let exact = client(0x2, true, &vec![7u8; 1000]);
    let msgs = decode_all(&mut Decoder::new(), &exact, 1000).unwrap();
    assert_eq!(msgs, vec![Message::Binary(Bytes::from(vec![7u8; 1000]))]);
    assert_eq!(Decoder::new().decode(&exact, 999, true).map_err(|v| u16::from(v.code)).unwrap_err(), 1009);
}

#[test]
fn oversize_across_fragments_fails_on_the_header_that_crosses_the_limit() {
    let mut decoder = Decoder::new();
    let first = client(0x1, false, &[b'a'; 600]);
    assert_eq!(decoder.decode(&first, 1000, true).unwrap(), (first.len(), None));
    let second = client(0x0, false, &[b'b'; 400]);
    assert_eq!(decoder.decode(&second, 1000, true).unwrap(), (second.len(), None));
    let third = client(0x0, true, b"c");
    assert_eq!(decoder.decode(&third[..6], 1000, true).map_err(|v| u16::from(v.code)).unwrap_err(), 1009);
    assert!(!decoder.in_message(), "a failed decoder frees its buffer");
    // An empty final fragment still fits.
    let mut decoder = Decoder::new();
    let mut input = client(0x1, false, &[b'a'; 1000]);
    input.extend(client(0x0, true, b""));
    let msgs = decode_all(&mut decoder, &input, 1000).unwrap();
    assert_eq!(msgs, vec![Message::Text(Bytes::from(vec![b'a'; 1000]))]);
}

#[test]
fn invalid_utf8_text_is_1007() {
    assert_eq!(err_code(&client(0x1, true, &[b'a', 0xFF, b'b'])), 1007);
    // A code point left open at the end of the message.
    assert_eq!(err_code(&client(0x1, true, &[b'a', 0xE2, 0x82])), 1007);
    let mut input = client(0x1, false, b"ok");
    input.extend(client(0x0, true, &[0xE2, 0x82]));
    assert_eq!(err_code(&input), 1007);
    // Binary is not checked.
    let msgs = decode_all(&mut Decoder::new(), &client(0x2, true, &[0xFF]), MAX).unwrap();
    assert_eq!(msgs, vec![Message::Binary(Bytes::from_static(&[0xFF]))]);
}

#[test]
fn code_point_split_across_fragments_is_valid() {
    let euro = "€".as_bytes();
    let mut input = client(0x1, false, &[b'x', euro[0]]);
    input.extend(client(0x0, false, &euro[1..2]));
    input.extend(client(0x0, true, &euro[2..]));
    let msgs = decode_all(&mut Decoder::new(), &input, MAX).unwrap();
    assert_eq!(msgs, vec![Message::Text(Bytes::from("x€"))]);
}

#[test]
fn invalid_utf8_fails_on_the_fragment_that_carries_it() {
    // Autobahn 6.4.1/6.4.2: valid first fragment, invalid second, the final never sent.
    let mut decoder = Decoder::new();
    let first = client(0x1, false, "κόσμε".as_bytes());
    assert_eq!(decoder.decode(&first, MAX, true).unwrap(), (first.len(), None));
    let second = client(0x0, false, &[0xCE, 0xBA, 0xF4, 0x90, 0x80, 0x80]);
    assert_eq!(decoder.decode(&second, MAX, true).map_err(|v| u16::from(v.code)).unwrap_err(), 1007);
}

#[test]
fn invalid_utf8_fails_before_its_frame_is_complete() {
    // Autobahn 6.4.3/6.4.4: one frame sent in chunks; the bad byte is in the middle chunk.
    let mut payload = "κόσμε".as_bytes().to_vec();
    let bad_at = payload.len();
    payload.extend_from_slice(&[0xF4, 0x90, 0x80, 0x80]);
    payload.extend_from_slice(b"edited");
    let frame = client(0x1, true, &payload);
    let header = 6;
    let mut decoder = Decoder::new();
    assert_eq!(decoder.decode(&frame[..header + bad_at], MAX, true).unwrap(), (0, None));
    assert_eq!(decoder.decode(&frame[..header + bad_at + 1], MAX, true).unwrap(), (0, None));
    let err = decoder.decode(&frame[..header + bad_at + 2], MAX, true).unwrap_err();
    assert_eq!(u16::from(err.code), 1007);
}

#[test]
fn close_frame_rules() {
    let close = |payload: &[u8]| client(0x8, true, payload);
    let decode_one = |payload: &[u8]| decode_all(&mut Decoder::new(), &close(payload), MAX);
    assert_eq!(decode_one(b"").unwrap(), vec![Message::Close { code: None, reason: Bytes::new() }]);
    assert_eq!(decode_one(&[0x03]).map_err(|v| u16::from(v.code)).unwrap_err(), 1002);
    let mut with_reason = 1000u16.to_be_bytes().to_vec();
    with_reason.extend_from_slice("bye ✓".as_bytes());
    assert_eq!(
        decode_one(&with_reason).unwrap(),
        vec![Message::Close { code: Some(CloseCode::Normal), reason: Bytes::from("bye ✓") }]
    );
    for code in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535] {
        assert_eq!(decode_one(&code.to_be_bytes()).map_err(|v| u16::from(v.code)).unwrap_err(), 1002, "code {code}");
    }
    for code in [1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999] {
        let msgs = decode_one(&code.to_be_bytes()).unwrap();
        assert_eq!(msgs, vec![Message::Close { code: Some(code.into()), reason: Bytes::new() }]);
    }
    let mut bad_reason = 1000u16.to_be_bytes().to_vec();
    bad_reason.extend_from_slice(&[0xCE, 0xBA, 0xED, 0xA0, 0x80]);
    assert_eq!(decode_one(&bad_reason).map_err(|v| u16::from(v.code)).unwrap_err(), 1007);
}

#[test]
fn valid_close_codes_table() {
    let valid: Vec<u16> = (0..=u16::MAX).filter(|&c| is_valid_close_code(c)).collect();
    let expected: Vec<u16> = (1000..=1003).chain(1007..=1014).chain(3000..=4999).collect();
    assert_eq!(valid, expected);
}

#[test]
fn fragments_assemble_into_one_message() {
    let mut decoder = Decoder::new();
    let parts: [&[u8]; 3] = [b"Hello, ", b"", b"world"];
    let mut input = client(0x1, false, parts[0]);
    input.extend(client(0x0, false, parts[1]));
    input.extend(client(0x0, true, parts[2]));
    let mut rest = &input[..];
    let mut seen = Vec::new();
    while !rest.is_empty() {
        let (used, msg) = decoder.decode(rest, MAX, true).unwrap();
        assert!(used > 0);
        seen.push((decoder.in_message(), msg));
        rest = &rest[used..];
    }
    assert_eq!(
        seen,
        vec![(true, None), (true, None), (false, Some(Message::Text(Bytes::from_static(b"Hello, world")))),]
    );
    let mut input = client(0x2, false, &[1, 2]);
    input.extend(client(0x0, true, &[3]));
    let msgs = decode_all(&mut decoder, &input, MAX).unwrap();
    assert_eq!(msgs, vec![Message::Binary(Bytes::from_static(&[1, 2, 3]))]);
}

#[test]
fn control_frames_between_fragments_come_out_at_once() {
    let mut decoder = Decoder::new();
    let mut input = client(0x1, false, "fragment ".as_bytes());
    input.extend(client(0x9, true, b"ping!"));
    input.extend(client(0xA, true, b"pong"));
    input.extend(client(0x0, true, "€".as_bytes()));
    let first = client(0x1, false, "fragment ".as_bytes()).len();
    let (used, msg) = decoder.decode(&input, MAX, true).unwrap();
    assert_eq!((used, msg), (first, None));
    let (used2, msg) = decoder.decode(&input[used..], MAX, true).unwrap();
    assert_eq!(msg, Some(Message::Ping(Bytes::from_static(b"ping!"))));
    assert!(decoder.in_message(), "the message stays in progress across the ping");
    let msgs = decode_all(&mut decoder, &input[used + used2..], MAX).unwrap();
    assert_eq!(msgs, vec![Message::Pong(Bytes::from_static(b"pong")), Message::Text(Bytes::from("fragment €"))]);
}

#[test]
fn split_input_at_every_byte_boundary() {
    let text: String = "añb€c𝄞".repeat(40);
    let mut close = 1001u16.to_be_bytes().to_vec();
    close.extend_from_slice(b"going away");
    let cases: Vec<(Vec<u8>, Message)> = vec![
        (client(0x1, true, b"hi"), Message::Text(Bytes::from_static(b"hi"))),
        (client(0x1, true, text.as_bytes()), Message::Text(Bytes::from(text.clone()))),
        (client(0x2, true, &[9u8; 300]), Message::Binary(Bytes::from(vec![9u8; 300]))),
        (client(0x1, true, &[b'z'; 70_000]), Message::Text(Bytes::from(vec![b'z'; 70_000]))),
        (client(0x9, true, b""), Message::Ping(Bytes::new())),
        (client(0x8, true, &close), Message::Close { code: Some(CloseCode::Away), reason: Bytes::from("going away") }),
    ];
    for (frame, expected) in cases {
        let mut decoder = Decoder::new();
        for cut in 0..frame.len() {
            let got = decoder.decode(&frame[..cut], 100_000, true).unwrap();
            assert_eq!(got, (0, None), "cut {cut} of {}", frame.len());
        }
        assert_eq!(decoder.decode(&frame, 100_000, true).unwrap(), (frame.len(), Some(expected)));
        assert!(!decoder.in_message());
    }
}

#[test]
fn split_fragmented_text_at_every_byte_boundary() {
    let mut input = client(0x1, false, "ab€".as_bytes());
    input.extend(client(0x9, true, b"p"));
    input.extend(client(0x0, true, "𝄞cd".as_bytes()));
    // Feed growing prefixes, consuming what the decoder reports, as a server would.
    let mut decoder = Decoder::new();
    let (mut consumed, mut msgs) = (0, Vec::new());
    for end in 0..=input.len() {
        loop {
            let (used, msg) = decoder.decode(&input[consumed..end], MAX, true).unwrap();
            msgs.extend(msg);
            if used == 0 {
                break;
            }
            consumed += used;
        }
    }
    assert_eq!(consumed, input.len());
    assert_eq!(msgs, vec![Message::Ping(Bytes::from_static(b"p")), Message::Text(Bytes::from("ab€𝄞cd"))]);
}

#[test]
fn extended_lengths_round_trip() {
    for len in [0usize, 125, 126, 127, 65535, 65536, 200_000] {
        let payload: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let frame = client(0x2, true, &payload);
        assert_eq!(frame.len(), header_len(len) + 4 + len);
        let (used, msg) = Decoder::new().decode(&frame, 1 << 20, true).unwrap();
        assert_eq!((used, msg), (frame.len(), Some(Message::Binary(Bytes::from(payload.clone())))));
        let server = encode_frame(OpCode::Data(Data::Binary), &payload);
        assert_eq!(server.len(), header_len(len) + len);
        let decoded = decode_server_frame(&server).unwrap();
        assert_eq!(decoded, Some((server.len(), true, 0x2, Bytes::from(payload))));
    }
    assert_eq!((header_len(125), header_len(126), header_len(65535), header_len(65536)), (2, 4, 4, 10));
    assert_eq!(&encode_frame(OpCode::Data(Data::Text), &[0u8; 126])[..4], &[0x81, 126, 0, 126]);
    assert_eq!(&encode_frame(OpCode::Data(Data::Text), &[0u8; 65536])[..10], &[0x81, 127, 0, 0, 0, 0, 0, 1, 0, 0]);
}

#[test]
fn client_frames_round_trip_through_the_decoder() {
    for (opcode, payload) in [(0x1u8, "{\"op\":\"sub\",\"ch\":\"news\"}".as_bytes()), (0x2, &[0, 1, 2, 255][..])] {
        for mask in [[0, 0, 0, 0], MASK, [0xff; 4]] {
            let frame = encode_client_frame(opcode, true, payload, mask);
            assert_eq!(frame[1] & 0x80, 0x80, "mask bit set");
            assert_eq!(&frame[2..6], &mask);
            let (_, msg) = Decoder::new().decode(&frame, MAX, true).unwrap();
            let payload = Bytes::copy_from_slice(payload);
            let expected = if opcode == 1 { Message::Text(payload) } else { Message::Binary(payload) };
            assert_eq!(msg, Some(expected));
        }
    }
}

#[test]
fn text_frames_are_written_with_the_one_header_writer() {
    for len in [0usize, 125, 126, 65535, 65536] {
        let payload = vec![b'a'; len];
        let direct = encode_frame(OpCode::Data(Data::Text), &payload);
        assert_eq!(text_frame(&payload), direct, "len {len}");
        assert_eq!(text_frame_with(0, |out| out.extend_from_slice(&payload)), direct, "len {len}");
    }
}

#[test]
fn server_frames_are_final_and_unmasked() {
    let mut out = b"prefix".to_vec();
    encode_frame_into(&mut out, OpCode::Data(Data::Text), b"{}");
    assert_eq!(&out[6..], &[0x81, 2, b'{', b'}']);
    assert_eq!(&ping_frame(b"x")[..], &[0x89, 1, b'x']);
    assert_eq!(&pong_frame(b"x")[..], &[0x8A, 1, b'x']);
    assert_eq!(&close_frame(CloseCode::Normal, "")[..], &[0x88, 2, 0x03, 0xE8]);
    assert_eq!(decode_server_frame(&[0x81]).unwrap(), None);
    assert_eq!(decode_server_frame(&out[6..9]).unwrap(), None);
    assert_eq!(decode_server_frame(&client(0x1, true, b"x")).unwrap_err().code, CloseCode::Protocol);
}

#[test]
fn rsv1_is_read_on_data_frames_only() {
    let frame = deflated_frame(OpCode::Data(Data::Text), b"\x01\x02");
    assert_eq!(decode_server_frame_rsv1(&frame).unwrap(), Some((4, true, 0x1, true, Bytes::from_static(b"\x01\x02"))));
    assert_eq!(decode_server_frame(&frame).unwrap_err().code, CloseCode::Protocol);
    let plain = text_frame(b"{}");
    assert_eq!(decode_server_frame_rsv1(&plain).unwrap(), Some((4, true, 0x1, false, Bytes::from_static(b"{}"))));
    // RSV1 on a continuation or a control frame is an error (RFC 7692 §6.1).
    for first in [0xC0u8, 0xC9] {
        assert_eq!(decode_server_frame_rsv1(&[first, 0]).unwrap_err().code, CloseCode::Protocol, "{first:#x}");
    }
    assert_eq!(decode_server_frame_rsv1(&[0xC1]).unwrap(), None);
}

#[test]
fn close_reason_is_truncated_at_a_char_boundary() {
    // 200 two-byte chars: 123 bytes would split one, so 122 bytes (61 chars) are kept.
    let reason = "é".repeat(200);
    let frame = close_frame(CloseCode::Again, &reason);
    let (used, fin, opcode, payload) = decode_server_frame(&frame).unwrap().unwrap();
    assert_eq!((used, fin, opcode), (frame.len(), true, 0x8));
    assert_eq!(payload.len(), 2 + 122);
    assert_eq!(&payload[..2], &1013u16.to_be_bytes());
    assert_eq!(std::str::from_utf8(&payload[2..]).unwrap(), "é".repeat(61));
    let ascii = close_frame(CloseCode::Normal, &"a".repeat(300));
    assert_eq!(decode_server_frame(&ascii).unwrap().unwrap().3.len(), 125);
}

#[test]
fn idle_decoder_is_small_and_owns_no_heap() {
    assert!(std::mem::size_of::<Decoder>() <= 32, "{}", std::mem::size_of::<Decoder>());
    let mut decoder = Decoder::new();
    assert!(decoder.assembly.is_none());
    let mut input = client(0x1, false, b"a");
    input.extend(client(0x0, true, b"b"));
    decode_all(&mut decoder, &input, MAX).unwrap();
    assert!(decoder.assembly.is_none(), "assembly freed when the message completes");
    assert_eq!(decoder.checked, 0);
    assert!(decoder.utf8.is_complete());
}
