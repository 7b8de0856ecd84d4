use super::*;
use crate::http::StatusCode;

/// The response as text with its `Date` line removed, after checking there is exactly one,
/// right after the status line (RFC 9110 §6.6.1).
fn text(v: &[u8]) -> String {
    let t = std::str::from_utf8(v).expect("UTF-8");
    let (status, rest) = t.split_once("\r\n").expect("status line");
    let date = rest.strip_prefix("Date: ").unwrap_or_else(|| panic!("no Date after the status line: {t:?}"));
    let (value, rest) = date.split_once("\r\n").expect("Date line");
    assert!(value.len() == 29 && value.ends_with(" GMT"), "Date {value:?}");
    assert!(!rest.contains("\r\nDate:"), "two Date lines: {t:?}");
    format!("{status}\r\n{rest}")
}

#[test]
fn plain_response() {
    let out = response(StatusCode::OK, "application/json", b"{\"seq\":1}", &[("X-A", "1")], true);
    assert_eq!(
        text(&out),
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\
         Connection: keep-alive\r\nX-A: 1\r\n\r\n{\"seq\":1}"
    );
    let out = response(StatusCode::NOT_FOUND, "", b"", &[], false);
    assert_eq!(text(&out), "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
}

#[test]
fn bodiless_statuses_and_unknown_reason() {
    let out = response(StatusCode::NO_CONTENT, "text/plain", b"ignored", &[], true);
    assert_eq!(text(&out), "HTTP/1.1 204 No Content\r\nContent-Type: text/plain\r\nConnection: keep-alive\r\n\r\n");
    let out = response(StatusCode::from_u16(599).unwrap(), "", b"x", &[], false);
    assert!(text(&out).starts_with("HTTP/1.1 599 \r\nContent-Length: 1\r\n"));
    assert_eq!(reason_phrase(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE), "Request Header Fields Too Large");
    assert_eq!(reason_phrase(StatusCode::PAYLOAD_TOO_LARGE), "Content Too Large");
}

#[test]
fn response_head_announces_a_length() {
    let out = response_head(StatusCode::OK, "text/plain; version=0.0.4", 12345, &[], true);
    assert_eq!(
        text(&out),
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: 12345\r\n\
         Connection: keep-alive\r\n\r\n"
    );
}

#[test]
fn header_injection_is_dropped() {
    let out =
        response(StatusCode::OK, "", b"", &[("X-Evil", "a\r\nSet-Cookie: x"), ("X\nB", "v"), ("X-Ok", "v")], true);
    let t = &text(&out);
    assert!(!t.contains("Evil") && !t.contains("Set-Cookie") && !t.contains("X\nB"));
    assert!(t.contains("X-Ok: v\r\n"));
}

#[test]
fn json_error_response() {
    let out = error_response(StatusCode::BAD_REQUEST, "body is not JSON: \"x\" at line 1\n", &[], true);
    let t = &text(&out);
    let (head, body) = t.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"));
    assert!(head.contains(&format!("Content-Length: {}", body.len())));
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v, serde_json::json!({"error": "body is not JSON: \"x\" at line 1\n"}));
}

#[test]
fn rejections() {
    let out = handshake_rejection(HttpError::new(StatusCode::BAD_REQUEST, "missing Host header"), &[]);
    assert_eq!(
        text(&out),
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 20\r\n\
         Connection: close\r\n\r\nmissing Host header\n"
    );
    let out =
        handshake_rejection(HttpError::new(StatusCode::UPGRADE_REQUIRED, "unsupported Sec-WebSocket-Version"), &[]);
    let t = &text(&out);
    assert!(t.starts_with("HTTP/1.1 426 Upgrade Required\r\n"));
    assert!(t.contains("\r\nSec-WebSocket-Version: 13\r\n") && t.contains("\r\nConnection: close\r\n"));
    assert!(t.contains("\r\nUpgrade: websocket\r\n"));
    let out = handshake_rejection(
        HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "too many connections"),
        &[("Retry-After", "5")],
    );
    let t = &text(&out);
    assert!(t.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
    assert!(t.contains("\r\nRetry-After: 5\r\n") && t.ends_with("\r\n\r\ntoo many connections\n"));
    assert!(!t.contains("Sec-WebSocket-Version"));
    let t =
        handshake_rejection(HttpError::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large"), &[]);
    let t = t.as_slice();
    assert!(text(t).starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
}

#[test]
fn percent_decoding() {
    assert_eq!(percent_decode("news").as_deref(), Some("news"));
    assert_eq!(percent_decode("a%20b%2Fc%2f").as_deref(), Some("a b/c/"));
    assert_eq!(percent_decode("caf%C3%A9").as_deref(), Some("café"));
    assert_eq!(percent_decode("a+b").as_deref(), Some("a+b"));
    assert_eq!(percent_decode("").as_deref(), Some(""));
    for bad in ["%", "%2", "%zz", "a%g0", "%C3", "%ff"] {
        assert_eq!(percent_decode(bad), None, "{bad}");
    }
}

#[test]
fn query_params() {
    let q = "from=12&ch=news%3Aeu&empty=&flag&sp=a+b%2B&from=99";
    assert_eq!(query_param(q, "from").as_deref(), Some("12"));
    assert_eq!(query_param(q, "ch").as_deref(), Some("news:eu"));
    assert_eq!(query_param(q, "empty").as_deref(), Some(""));
    assert_eq!(query_param(q, "flag").as_deref(), Some(""));
    assert_eq!(query_param(q, "sp").as_deref(), Some("a b+"));
    assert_eq!(query_param(q, "missing"), None);
    assert_eq!(query_param("", "a"), None);
    assert_eq!(query_param("a%20b=1", "a b").as_deref(), Some("1"));
    assert_eq!(query_param("a=%zz", "a"), None);
}

#[test]
fn chunked_bodies() {
    let enc = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE \r\n in\r\n\r\nchunks.\r\n0\r\nX-T: 1\r\n\r\nNEXT";
    let (body, used) = decode_chunked(enc, 1024).unwrap().unwrap();
    assert_eq!(body, b"Wikipedia in\r\n\r\nchunks.");
    assert_eq!(&enc[used..], b"NEXT");
    // Every strict prefix is "need more".
    let complete = enc.len() - 4;
    for end in 0..complete {
        assert_eq!(decode_chunked(&enc[..end], 1024), Ok(None), "prefix {end}");
    }
    assert_eq!(decode_chunked(b"0\r\n\r\n", 0), Ok(Some((Vec::new(), 5))));
}

#[test]
fn chunked_errors() {
    let status = |enc: &[u8], max| decode_chunked(enc, max).map(|_| ()).unwrap_err().status;
    assert_eq!(status(b"a\r\n0123456789\r\n0\r\n\r\n", 9), 413);
    assert_eq!(status(b"8\r\n01234", 7), 413);
    assert_eq!(status(b"ffffffffffffffffff\r\n", usize::MAX), 413);
    assert_eq!(status(b"zz\r\n", 100), 400);
    assert_eq!(status(b"\r\n", 100), 400);
    assert_eq!(status(b";ext\r\n", 100), 400);
    assert_eq!(status(b"3\r\nabcX\r\n", 100), 400);
    let long_line = [b"1;".as_slice(), &[b'x'; 5000]].concat();
    assert_eq!(status(&long_line, 100), 400);
    let mut big_trailers = b"0\r\n".to_vec();
    for _ in 0..1000 {
        big_trailers.extend_from_slice(b"X-Trailer: 0123456789\r\n");
    }
    assert_eq!(status(&big_trailers, 100), 400);
}

fn parsed(head: &str) -> Request {
    crate::http::parse_request(head.as_bytes(), 8192).expect("valid head").expect("complete head")
}

#[test]
fn expectations() {
    let with = |version: &str, expect: Option<&str>| {
        let mut head = format!("POST /publish/x HTTP/{version}\r\nHost: h\r\nContent-Length: 5\r\n");
        if let Some(e) = expect {
            head.push_str(&format!("Expect: {e}\r\n"));
        }
        head.push_str("\r\n");
        expectation(&parsed(&head))
    };
    assert_eq!(with("1.1", None), Expectation::None);
    assert_eq!(with("1.1", Some("100-continue")), Expectation::Continue);
    assert_eq!(with("1.1", Some("100-Continue")), Expectation::Continue);
    let failed = Expectation::Failed(HttpError::new(StatusCode::EXPECTATION_FAILED, "unsupported expectation"));
    assert_eq!(with("1.1", Some("200-ok")), failed);
    assert_eq!(with("1.1", Some("100-continue, x=1")), failed);
    // RFC 9110 §10.1.1 / §15.2: HTTP/1.0 expectations are ignored, no 1xx is ever sent.
    assert_eq!(with("1.0", Some("100-continue")), Expectation::None);
    assert_eq!(with("1.0", Some("200-ok")), Expectation::None);
    assert_eq!(CONTINUE, b"HTTP/1.1 100 Continue\r\n\r\n");
}

#[test]
fn head_answers_keep_the_head_and_drop_the_content() {
    let get = response(StatusCode::OK, "application/json", b"{\"status\":\"ok\"}", &[], true);
    let head = head_only(get.clone());
    assert_eq!(text(&head), text(&get[..get.len() - 15]));
    assert!(text(&head).contains("Content-Length: 15\r\n"));
    assert!(head.ends_with(b"\r\n\r\n"));
}
