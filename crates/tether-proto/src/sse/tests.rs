use super::*;
use crate::protocol::msg_frame;
use crate::ws::codec::text_frame;

#[test]
fn message_event_carries_the_ws_msg_object_and_a_position() {
    let frame = msg_frame("news:eu", 7, "{\"a\":1}");
    let ev = msg_from_frame(&frame, "00ff").expect("a msg frame");
    assert_eq!(
        &ev[..],
        b"event: msg\nid: news:eu:00ff:7\ndata: {\"op\":\"msg\",\"ch\":\"news:eu\",\"seq\":7,\"data\":{\"a\":1}}\n\n"
    );
}

#[test]
fn long_frames_convert_with_their_extended_lengths() {
    for n in [10usize, 200, 70_000] {
        let data = format!("\"{}\"", "x".repeat(n));
        let frame = msg_frame("c", u64::MAX, &data);
        let ev = msg_from_frame(&frame, "e").expect("a msg frame");
        let text = std::str::from_utf8(&ev).unwrap();
        assert!(text.starts_with(&format!("event: msg\nid: c:e:{}\ndata: {{", u64::MAX)), "{n}");
        assert!(text.ends_with(&format!("{data}}}\n\n")), "{n}");
    }
}

#[test]
fn line_breaks_in_json_whitespace_become_data_lines() {
    let frame = msg_frame("c", 1, "{\r\n\"a\":\r1,\n\"b\":2}");
    let ev = msg_from_frame(&frame, "e").unwrap();
    let text = std::str::from_utf8(&ev).unwrap();
    // What EventSource hands over: the data lines joined with LF.
    let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    let joined = data.join("\n");
    let v: serde_json::Value = serde_json::from_str(&joined).expect("still JSON");
    assert_eq!(v["data"]["b"], 2);
    assert!(!text.contains('\r'));
}

#[test]
fn replies_become_typed_events_or_nothing() {
    let reset = crate::protocol::reset_json("c", 9, "e", crate::protocol::ResetReason::Evicted, 3);
    let ev = from_reply(&text_frame(&reset)).unwrap();
    assert!(ev.starts_with(b"event: reset\nid: c:e:9\ndata: {\"op\":\"reset\""));
    let err = crate::protocol::error_json("forbidden", "no", None);
    assert!(from_reply(&text_frame(&err)).unwrap().starts_with(b"event: error\ndata: {\"op\":\"error\""));
    let sub = crate::protocol::subscribed_json("c", 0, "e", None);
    assert!(from_reply(&text_frame(&sub)).unwrap().starts_with(b"event: subscribed\ndata: {\"op\":\"subscribed\""));
    let ack = crate::protocol::ack_json("i", "c", 1);
    assert_eq!(from_reply(&text_frame(&ack)), None);
    assert_eq!(from_reply(&crate::ws::codec::ping_frame(b"")), None);
    assert_eq!(from_reply(b"\x81"), None);
    assert_eq!(msg_from_frame(&text_frame(&err), "e"), None);
}

#[test]
fn close_event_names_the_code_and_sets_a_floor_on_retry() {
    let ev = close_event(CloseCode::Restart, "{\"reason\":\"restart\"}", Some(10));
    let text = std::str::from_utf8(&ev).unwrap();
    assert!(text.starts_with("event: close\ndata: {\"op\":\"close\",\"code\":1012,\"reason\":"), "{text}");
    assert!(text.ends_with(&format!("retry: {RETRY_FLOOR_MS}\n\n")), "{text}");
    let ev = close_event(CloseCode::Again, "x", None);
    assert!(!std::str::from_utf8(&ev).unwrap().contains("retry:"));
}

#[test]
fn positions_parse_from_the_right() {
    let p = Position::parse("a:b:c:0123abcd:42").unwrap();
    assert_eq!((p.ch.as_str(), p.epoch.as_str(), p.seq), ("a:b:c", "0123abcd", 42));
    for bad in ["", "c", "c:e", "c:e:", ":e:1", "c:e:-1", "c:e:1x", "c:e:99999999999999999999999", "c d:e:1"] {
        assert!(Position::parse(bad).is_err(), "{bad:?}");
    }
    assert_eq!(Position::parse("c::1").unwrap().epoch, "", "a position without an epoch");
    let huge = format!("c:e:{}", "1".repeat(10_000));
    assert_eq!(Position::parse(&huge), Err("longer than 256 bytes"));
    let long_epoch = format!("c:{}:1", "e".repeat(MAX_EPOCH_BYTES + 1));
    assert_eq!(Position::parse(&long_epoch), Err("invalid epoch"));
}

#[test]
fn the_head_has_no_length_and_closes() {
    let head = String::from_utf8(response_head(None)).unwrap();
    assert!(!head.contains("Access-Control"));
    let cors = String::from_utf8(response_head(Some("https://app.example"))).unwrap();
    assert!(cors.contains("Access-Control-Allow-Origin: https://app.example\r\nVary: Origin\r\n"), "{cors}");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"));
    for h in [
        "Content-Type: text/event-stream\r\n",
        "Cache-Control: no-cache\r\n",
        "Connection: close\r\n",
        "X-Accel-Buffering: no\r\n",
    ] {
        assert!(head.contains(h), "{h}");
    }
    assert!(!head.to_ascii_lowercase().contains("content-length"));
    assert!(!head.to_ascii_lowercase().contains("transfer-encoding"));
    assert!(head.ends_with("\r\n\r\n"));
}

#[test]
fn reset_events_carry_the_position_they_leave() {
    let reset = crate::protocol::reset_json("a:b", 9, "e2", crate::protocol::ResetReason::Epoch, 1);
    let ev = from_reply(&text_frame(&reset)).unwrap();
    assert!(ev.starts_with(b"event: reset\nid: a:b:e2:9\ndata: {\"op\":\"reset\""), "{ev:?}");
}

#[test]
fn accept_header_rules() {
    for ok in [None, Some("text/event-stream"), Some("*/*"), Some("text/html, text/*;q=0.5"), Some("TEXT/EVENT-STREAM")]
    {
        assert!(accepts_event_stream(ok), "{ok:?}");
    }
    for no in [Some("application/json"), Some("text/event-stream;q=0"), Some("")] {
        assert!(!accepts_event_stream(no), "{no:?}");
    }
}

#[test]
fn subscriptions_take_positions_from_last_event_id_over_from() {
    let q = "ch=a&ch=b%3Ax&ch=c&from=a:e:3&from=b:x:e:5";
    let subs = subscriptions(Some(q), Some("b:x:e:9"), 8).unwrap();
    let pos = |i: usize| subs[i].1.as_ref().map(|p| (p.epoch.as_str(), p.seq));
    assert_eq!(subs.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(), ["a", "b:x", "c"]);
    assert_eq!((pos(0), pos(1), pos(2)), (Some(("e", 3)), Some(("e", 9)), None));
    assert!(subscriptions(Some("ch=a"), Some(""), 8).unwrap()[0].1.is_none());
}

#[test]
fn bad_subscriptions_are_refused_with_a_reason() {
    let cases = [
        (None, None, "no channel"),
        (Some("ch=a&ch=a"), None, "named twice"),
        (Some("ch=a%20b"), None, "invalid channel"),
        (Some("ch=a&ch=b&ch=c"), None, "max_subscriptions (2)"),
        (Some("ch=a&from=b:e:1"), None, "not in ch"),
        (Some("ch=a&from=a:e:1&from=a:e:2"), None, "two positions"),
        (Some("ch=a&from=a:e"), None, "from: not of the form"),
        (Some("ch=a"), Some("a:e:x"), "Last-Event-ID: seq"),
        (Some("ch=a"), Some("z:e:1"), "Last-Event-ID names channel z"),
    ];
    for (q, id, want) in cases {
        let e = subscriptions(q, id, 2).unwrap_err();
        assert!(e.contains(want), "{q:?} {id:?}: {e}");
    }
    let huge = "a".repeat(100_000);
    assert!(subscriptions(Some("ch=a"), Some(&huge), 2).unwrap_err().contains("longer than 256"));
}
