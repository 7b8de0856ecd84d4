use super::*;

fn op(text: &str) -> Result<ClientOp, RequestError> {
    parse_client_op(text.as_bytes())
}

fn err(text: &str) -> RequestError {
    op(text).expect_err(text)
}

fn s(v: Vec<u8>) -> String {
    String::from_utf8(v).expect("UTF-8")
}

#[test]
fn sub_with_and_without_resume() {
    match op(r#"{"op":"sub","ch":"news"}"#).unwrap() {
        ClientOp::Sub { ch, from, epoch, join_leave } => {
            assert_eq!((ch.as_str(), from, epoch, join_leave), ("news", None, None, false));
        }
        other => panic!("{other:?}"),
    }
    match op(r#" {"ch":"prices.EUR-USD","from":0,"epoch":"e\"1","op":"sub","extra":[1]} "#).unwrap() {
        ClientOp::Sub { ch, from, epoch, .. } => {
            assert_eq!(ch, "prices.EUR-USD");
            assert_eq!(from, Some(0));
            assert_eq!(epoch.as_deref(), Some("e\"1"));
        }
        other => panic!("{other:?}"),
    }
    match op(r#"{"op":"sub","ch":"a","from":null,"epoch":null}"#).unwrap() {
        ClientOp::Sub { from, epoch, .. } => assert_eq!((from, epoch), (None, None)),
        other => panic!("{other:?}"),
    }
    match op(&format!(r#"{{"op":"sub","ch":"a","from":{}}}"#, u64::MAX)).unwrap() {
        ClientOp::Sub { from, .. } => assert_eq!(from, Some(u64::MAX)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn sub_with_join_leave_and_the_presence_ops() {
    match op(r#"{"op":"sub","ch":"room","join_leave":true}"#).unwrap() {
        ClientOp::Sub { join_leave, .. } => assert!(join_leave),
        other => panic!("{other:?}"),
    }
    match op(r#"{"op":"sub","ch":"room","join_leave":null}"#).unwrap() {
        ClientOp::Sub { join_leave, .. } => assert!(!join_leave),
        other => panic!("{other:?}"),
    }
    let e = op(r#"{"op":"sub","ch":"room","join_leave":"yes"}"#).unwrap_err();
    assert_eq!(
        (e.code, e.reason.as_str(), e.ch.as_deref()),
        (codes::BAD_REQUEST, "join_leave must be a boolean", Some("room"))
    );
    match op(r#"{"op":"presence","ch":"room"}"#).unwrap() {
        ClientOp::Presence { ch, cursor } => assert_eq!((ch.as_str(), cursor), ("room", None)),
        other => panic!("{other:?}"),
    }
    match op(r#"{"op":"presence","ch":"room","cursor":"0-12-3"}"#).unwrap() {
        ClientOp::Presence { cursor, .. } => assert_eq!(cursor.as_deref(), Some("0-12-3")),
        other => panic!("{other:?}"),
    }
    let long = "x".repeat(129);
    let e = op(&format!(r#"{{"op":"presence","ch":"room","cursor":"{long}"}}"#)).unwrap_err();
    assert_eq!(e.code, codes::BAD_REQUEST);
    let e = op(r#"{"op":"presence","ch":"room","cursor":7}"#).unwrap_err();
    assert_eq!(e.code, codes::BAD_REQUEST);
    match op(r#"{"op":"presence_stats","ch":"room"}"#).unwrap() {
        ClientOp::PresenceStats { ch } => assert_eq!(ch, "room"),
        other => panic!("{other:?}"),
    }
    assert_eq!(op(r#"{"op":"presence_stats"}"#).unwrap_err().code, codes::BAD_REQUEST, "ch is needed");
}

#[test]
fn unsub() {
    match op(r#"{"op":"unsub","ch":"a:b_c"}"#).unwrap() {
        ClientOp::Unsub { ch } => assert_eq!(ch, "a:b_c"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn pub_keeps_id_and_compacts_data() {
    match op(r#"{"op":"pub","ch":"news","id":"m-1","data":{ "a" : [1, 2.50, "x y"] }}"#).unwrap() {
        ClientOp::Pub { ch, id, data } => {
            assert_eq!((ch.as_str(), id.as_str()), ("news", "m-1"));
            assert_eq!(data.get(), r#"{"a":[1,2.50,"x y"]}"#);
        }
        other => panic!("{other:?}"),
    }
    for (data, want) in [("null", "null"), ("\"s\"", "\"s\""), ("-1e3", "-1e3"), ("[ ]", "[]")] {
        match op(&format!(r#"{{"op":"pub","ch":"c","id":"\u0041","data":{data}}}"#)).unwrap() {
            ClientOp::Pub { id, data, .. } => assert_eq!((id.as_str(), data.get()), ("A", want)),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn bad_json() {
    for text in ["", "{", "{\"op\":\"sub\",}", "nope", "{\"op\":\"sub\"} x", "\u{FEFF}{}"] {
        assert_eq!(err(text).code, codes::BAD_JSON, "{text:?}");
    }
    assert_eq!(parse_client_op(b"{\"op\":\"\xff\"}").unwrap_err().code, codes::BAD_JSON);
    // Found by the `protocol` fuzz target (crates/tether-fuzz/corpus/protocol/duplicate_then_garbage): a
    // repeated field read before the syntax error made text that is not JSON `bad_request`.
    let e = err(r#"{"op":"sub","op":"sub""#);
    assert_eq!(e.code, codes::BAD_JSON, "{e:?}");
    assert!(e.reason.starts_with("invalid JSON: EOF"), "{e:?}");
}

#[test]
fn bad_request_for_non_objects_and_fields() {
    let cases = [
        ("[\"sub\",\"news\"]", "message must be a JSON object"),
        ("\"sub\"", "message must be a JSON object"),
        ("null", "message must be a JSON object"),
        (r#"{"op":"sub"}"#, "missing ch"),
        (r#"{"op":"unsub","ch":7}"#, "ch must be a string"),
        (r#"{"op":"sub","ch":null}"#, "ch must be a string"),
        (r#"{"op":"sub","ch":"a","from":-1}"#, "from must be a non-negative integer"),
        (r#"{"op":"sub","ch":"a","from":1.5}"#, "from must be a non-negative integer"),
        (r#"{"op":"sub","ch":"a","from":"3"}"#, "from must be a non-negative integer"),
        (r#"{"op":"sub","ch":"a","from":18446744073709551616}"#, "from must be a non-negative integer"),
        (r#"{"op":"sub","ch":"a","epoch":1}"#, "epoch must be a string"),
        (r#"{"op":"pub","ch":"a","data":1}"#, "missing id"),
        (r#"{"op":"pub","ch":"a","id":1,"data":1}"#, "id must be a string"),
        (r#"{"op":"pub","ch":"a","id":null,"data":1}"#, "id must be a string"),
        (r#"{"op":"pub","ch":"a","id":"","data":1}"#, "id must be 1-128 bytes"),
        (r#"{"op":"pub","ch":"a","id":"x"}"#, "missing data"),
    ];
    for (text, reason) in cases {
        let e = err(text);
        assert_eq!((e.code, e.reason.as_str()), (codes::BAD_REQUEST, reason), "{text}");
    }
    let dup = err(r#"{"op":"sub","op":"pub","ch":"a"}"#);
    assert_eq!(dup.code, codes::BAD_REQUEST);
}

#[test]
fn bad_op() {
    for (text, reason) in [
        (r#"{"ch":"a"}"#, "missing op"),
        (r#"{"op":1,"ch":"a"}"#, "op must be a string"),
        (r#"{"op":null}"#, "op must be a string"),
        (
            r#"{"op":"publish","ch":"a"}"#,
            "unknown op \"publish\"; expected sub, unsub, pub, refresh, presence or presence_stats",
        ),
        (
            r#"{"op":"SUB","ch":"a"}"#,
            "unknown op \"SUB\"; expected sub, unsub, pub, refresh, presence or presence_stats",
        ),
    ] {
        let e = err(text);
        assert_eq!((e.code, e.reason.as_str()), (codes::BAD_OP, reason), "{text}");
    }
    let long = format!(r#"{{"op":"{}"}}"#, "x".repeat(33));
    assert_eq!(err(&long).reason, "unknown op; expected sub, unsub, pub, refresh, presence or presence_stats");
}

#[test]
fn refresh_takes_a_token_and_no_channel() {
    match parse_client_op(br#"{"op":"refresh","token":"a.b.c"}"#) {
        Ok(ClientOp::Refresh { token }) => assert_eq!(token, "a.b.c"),
        other => panic!("{other:?}"),
    }
    for text in [r#"{"op":"refresh"}"#, r#"{"op":"refresh","token":""}"#, r#"{"op":"refresh","token":7}"#] {
        let e = err(text);
        assert_eq!(
            (e.code, e.reason.as_str()),
            (codes::BAD_REQUEST, "refresh needs token: a non-empty string"),
            "{text}"
        );
    }
    assert_eq!(String::from_utf8(refreshed_json(1_893_456_000)).unwrap(), r#"{"op":"refreshed","exp":1893456000}"#);
}

#[test]
fn bad_channel() {
    for ch in ["", "a b", "news/1", "é", &"x".repeat(129)] {
        let text = serde_json::json!({"op": "sub", "ch": ch}).to_string();
        assert_eq!(err(&text).code, codes::BAD_CHANNEL, "{ch:?}");
    }
}

#[test]
fn errors_echo_a_readable_id() {
    let e = err(r#"{"op":"pub","ch":"bad ch","id":"m-7","data":1}"#);
    assert_eq!((e.code, e.id.as_deref()), (codes::BAD_CHANNEL, Some("m-7")));
    let e = err(r#"{"op":"nope","id":"m-8"}"#);
    assert_eq!((e.code, e.id.as_deref()), (codes::BAD_OP, Some("m-8")));
    let e = err(r#"{"op":"pub","ch":"a","id":"m-9"}"#);
    assert_eq!(e.id.as_deref(), Some("m-9"));
    let e = err(r#"{"op":"pub","ch":"a","id":"","data":1}"#);
    assert_eq!(e.id.as_deref(), Some(""));
    // Unreadable or oversized ids are not echoed.
    assert_eq!(err(r#"{"op":"pub","ch":"a","id":5,"data":1}"#).id, None);
    let long = format!(r#"{{"op":"pub","ch":"a","id":"{}","data":1}}"#, "i".repeat(129));
    let e = err(&long);
    assert_eq!((e.reason.as_str(), e.id), ("id must be 1-128 bytes", None));
    let max = format!(r#"{{"op":"pub","ch":"a","id":"{}","data":1}}"#, "i".repeat(128));
    assert!(op(&max).is_ok());
    assert_eq!(err("{").id, None);
}

#[test]
fn error_reply_round_trips() {
    let e = err(r#"{"op":"pub","ch":"a b","id":"q\"\\\n\u0001é","data":1}"#);
    let v: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
    assert_eq!(v["op"], "error");
    assert_eq!(v["code"], "bad_channel");
    assert_eq!(v["id"], "q\"\\\n\u{1}é");
}

#[test]
fn channel_name_boundaries() {
    assert!(!valid_channel(""));
    assert!(valid_channel("a"));
    assert!(valid_channel(&"a".repeat(128)));
    assert!(!valid_channel(&"a".repeat(129)));
    assert!(valid_channel("AZaz09._:-"));
    for bad in ["a b", "a/b", "a*", "a\"", "a\\", "ä", "a\n", "a\0", "#", "a,b", "a+b"] {
        assert!(!valid_channel(bad), "{bad:?}");
    }
}

#[test]
fn server_texts_are_exact() {
    assert_eq!(s(msg_json("news", 42, r#"{"a":1}"#)), r#"{"op":"msg","ch":"news","seq":42,"data":{"a":1}}"#);
    assert_eq!(s(subscribed_json("news", 0, "e1", None)), r#"{"op":"subscribed","ch":"news","seq":0,"epoch":"e1"}"#);
    assert_eq!(
        s(subscribed_json("news", 9, "e1", Some(true))),
        r#"{"op":"subscribed","ch":"news","seq":9,"epoch":"e1","recovered":true}"#
    );
    assert_eq!(
        s(subscribed_json("news", 9, "e1", Some(false))),
        r#"{"op":"subscribed","ch":"news","seq":9,"epoch":"e1","recovered":false}"#
    );
    assert_eq!(
        s(reset_json("news", 100, "e2", ResetReason::Evicted, 51)),
        r#"{"op":"reset","ch":"news","seq":100,"epoch":"e2","reason":"evicted","oldest":51}"#
    );
    assert_eq!(
        s(reset_json("n", 0, "e3", ResetReason::Epoch, 0)),
        r#"{"op":"reset","ch":"n","seq":0,"epoch":"e3","reason":"epoch","oldest":0}"#
    );
    assert_eq!(s(ack_json("m-1", "news", 7)), r#"{"op":"ack","id":"m-1","ch":"news","seq":7}"#);
    assert_eq!(s(error_json("bad_op", "unknown op", None)), r#"{"op":"error","code":"bad_op","reason":"unknown op"}"#);
    assert_eq!(s(error_json("bad_op", "x", Some("7"))), r#"{"op":"error","code":"bad_op","reason":"x","id":"7"}"#);
    assert_eq!(s(seq_json(u64::MAX)), r#"{"seq":18446744073709551615}"#);
}

#[test]
fn weird_strings_are_escaped() {
    let weird = "\"quote\" \\back\\ \n\r\t \u{0}\u{1f} \u{7f} é 😀 </script>";
    for text in [
        ack_json(weird, "c", 1),
        error_json("bad_request", weird, Some(weird)),
        subscribed_json("c", 1, weird, Some(true)),
        reset_json("c", 1, weird, ResetReason::Epoch, 1),
        // An unvalidated channel still yields valid JSON.
        msg_json(weird, 1, "1"),
        ack_json("i", weird, 1),
    ] {
        let v: serde_json::Value = serde_json::from_slice(&text).expect("valid JSON");
        let found = ["id", "reason", "epoch", "ch"].iter().any(|k| v[k] == weird);
        assert!(found, "{}", s(text));
        assert!(!text.contains(&b'\n'), "one line");
    }
}

#[test]
fn seq_digits() {
    for n in [0, 1, 9, 10, 99, 100, 12345, u64::MAX - 1, u64::MAX] {
        let mut out = Vec::new();
        push_u64(&mut out, n);
        assert_eq!(s(out), n.to_string());
    }
}

#[test]
fn msg_frame_headers_by_payload_length() {
    // Payload = msg_json length: the fixed text around `data` plus a string of x.
    let fixed = msg_json("c", 1, "").len();
    for payload in [fixed + 2, 125, 126, 127, 0xFFFF, 0x1_0000, 70_000] {
        let data = format!("\"{}\"", "x".repeat(payload - fixed - 2));
        let frame = msg_frame("c", 1, &data);
        let json = msg_json("c", 1, &data);
        assert_eq!(json.len(), payload);
        let mut cursor = std::io::Cursor::new(frame.as_ref());
        let (header, len) = tungstenite::protocol::frame::FrameHeader::parse(&mut cursor)
            .expect("valid header")
            .expect("complete header");
        assert!(header.is_final && header.mask.is_none());
        assert_eq!(
            header.opcode,
            tungstenite::protocol::frame::coding::OpCode::Data(tungstenite::protocol::frame::coding::Data::Text)
        );
        assert_eq!(len as usize, payload);
        let header_len = cursor.position() as usize;
        let want_header = match payload {
            0..=125 => 2,
            126..=0xFFFF => 4,
            _ => 10,
        };
        assert_eq!(header_len, want_header, "payload {payload}");
        assert_eq!(&frame[header_len..], &json[..]);
    }
}

#[test]
fn compaction() {
    assert!(matches!(compact_json(r#"{"a":[1,"b c"]}"#), Cow::Borrowed(_)));
    assert_eq!(compact_json(" { \"a b\" :\t[ 1 ,\r\n\"\\\" x\" ] } "), r#"{"a b":[1,"\" x"]}"#);
    assert_eq!(compact_json(r#"[ "\\", " " ]"#), r#"["\\"," "]"#);
    assert_eq!(compact_json("\"é 😀 \""), "\"é 😀 \"");
}

#[test]
fn publish_body() {
    assert_eq!(parse_publish_body(b" {\"hello\": 1}\n").unwrap().get(), r#"{"hello":1}"#);
    assert_eq!(parse_publish_body(b"42").unwrap().get(), "42");
    assert_eq!(parse_publish_body(b"null").unwrap().get(), "null");
    for bad in [&b""[..], b"hello", b"{\"a\":}", b"1 2", b"\xff"] {
        let e = parse_publish_body(bad).unwrap_err();
        assert_eq!(e.code, codes::BAD_JSON);
        assert!(e.reason.starts_with("body is not JSON: "), "{}", e.reason);
    }
}

#[test]
fn message_ids() {
    assert!(!valid_message_id(""));
    assert!(valid_message_id("x"));
    assert!(valid_message_id(&"x".repeat(128)));
    assert!(!valid_message_id(&"x".repeat(129)));
}

#[test]
fn msg_frame_overhead_is_the_worst_case() {
    let data = "\"x\"".repeat(30_000);
    let longest_ch = "c".repeat(MAX_CHANNEL_BYTES);
    let worst = msg_frame(&longest_ch, u64::MAX, &data);
    assert_eq!(worst.len() - data.len(), MSG_FRAME_OVERHEAD);
    for (ch, seq, data) in [("a", 1, "1"), ("news", 12_345, "{}"), (longest_ch.as_str(), u64::MAX, "\"\"")] {
        assert!(msg_frame(ch, seq, data).len() - data.len() <= MSG_FRAME_OVERHEAD, "{ch} {seq} {data}");
    }
}

#[test]
fn bad_channel_reason_is_the_documented_one() {
    let e = err(r#"{"op":"sub","ch":"a b"}"#);
    assert_eq!((e.code, e.reason.as_str()), (codes::BAD_CHANNEL, BAD_CHANNEL_REASON));
    let doc = include_str!("../../../../docs/protocol.md");
    let example = format!(r#"{{"op":"error","code":"bad_channel","reason":"{BAD_CHANNEL_REASON}","ch":"#);
    assert!(doc.contains(&example), "docs/protocol.md shows another bad_channel reason than {example}");
}
