use super::*;
use crate::http::parse_request;
use crate::http::StatusCode;

/// The sample handshake of RFC 6455 §1.3.
const SAMPLE_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const SAMPLE_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

fn upgrade_head(extra: &str) -> String {
    format!(
        "GET /ws?token=a%20b HTTP/1.1\r\nHost: example.com\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: {SAMPLE_KEY}\r\n\
         Sec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
}

fn parse(head: &str) -> Result<Option<Request>, HttpError> {
    parse_request(head.as_bytes(), 8192)
}

fn req(head: &str) -> Request {
    parse(head).expect("valid head").expect("complete head")
}

/// A request built from `lines` (request line first), each line CRLF-terminated, with
/// `Host: h` added after the request line when `lines` has no `Host` (HTTP/1.1 requires one).
fn head_of(lines: &[&str]) -> String {
    let mut lines = lines.to_vec();
    if !lines.iter().any(|l| l.to_ascii_lowercase().starts_with("host:")) {
        lines.insert(1.min(lines.len()), "Host: h");
    }
    let mut s = lines.join("\r\n");
    s.push_str("\r\n\r\n");
    s
}

#[test]
fn good_upgrade_yields_accept() {
    let r = req(&upgrade_head("Origin: https://app.example\r\n"));
    assert_eq!(check_upgrade(&r), Ok(SAMPLE_ACCEPT.to_owned()));
}

fn upgrade_with(change: impl Fn(&str) -> Option<String>) -> Result<String, HttpError> {
    let head = upgrade_head("");
    let lines: Vec<String> = head.trim_end().split("\r\n").filter_map(&change).collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    check_upgrade(&req(&head_of(&lines)))
}

fn replace(prefix: &'static str, with: &'static str) -> impl Fn(&str) -> Option<String> {
    move |l: &str| Some(if l.starts_with(prefix) { with.to_owned() } else { l.to_owned() })
}

fn drop_line(prefix: &'static str) -> impl Fn(&str) -> Option<String> {
    move |l: &str| (!l.starts_with(prefix)).then(|| l.to_owned())
}

#[test]
fn each_upgrade_rule_is_checked() {
    let bad = |reason| Err(HttpError::new(StatusCode::BAD_REQUEST, reason));
    assert_eq!(upgrade_with(replace("GET", "POST /ws HTTP/1.1")), bad("method must be GET"));
    assert_eq!(upgrade_with(replace("GET", "GET /ws HTTP/1.0")), bad("HTTP/1.1 required"));
    // An HTTP/1.1 request without Host is refused by the parser already (RFC 9112 §3.2).
    let no_host = upgrade_head("").replace("Host: example.com\r\n", "");
    assert_eq!(parse(&no_host).map(|_| ()), bad("missing Host header").map(|_: String| ()));
    assert_eq!(upgrade_with(drop_line("Upgrade")), bad("missing Upgrade: websocket"));
    assert_eq!(upgrade_with(replace("Upgrade", "Upgrade: h2c")), bad("missing Upgrade: websocket"));
    assert_eq!(upgrade_with(drop_line("Connection")), bad("missing Connection: upgrade"));
    assert_eq!(upgrade_with(replace("Connection", "Connection: keep-alive")), bad("missing Connection: upgrade"));
    assert_eq!(upgrade_with(drop_line("Sec-WebSocket-Key")), bad("missing Sec-WebSocket-Key"));
    for key in [
        "Sec-WebSocket-Key: not base64!!",
        "Sec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAA",     // 15 bytes
        "Sec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAAAAA=", // 17 bytes
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ",   // unpadded
        "Sec-WebSocket-Key: ",
    ] {
        assert_eq!(upgrade_with(replace("Sec-WebSocket-Key", key)), bad("bad Sec-WebSocket-Key"), "{key}");
    }
    let key_twice =
        |l: &str| Some(if l.starts_with("Sec-WebSocket-Key") { format!("{l}\r\n{l}") } else { l.to_owned() });
    assert_eq!(upgrade_with(key_twice), bad("bad Sec-WebSocket-Key"));
}

#[test]
fn wrong_or_missing_version_gets_426() {
    let unsupported = Err(HttpError::new(StatusCode::UPGRADE_REQUIRED, "unsupported Sec-WebSocket-Version"));
    for v in ["Sec-WebSocket-Version: 8", "Sec-WebSocket-Version: 13, 8", "Sec-WebSocket-Version: 14"] {
        assert_eq!(upgrade_with(replace("Sec-WebSocket-Version", v)), unsupported, "{v}");
    }
    assert_eq!(upgrade_with(drop_line("Sec-WebSocket-Version")), unsupported);
}

#[test]
fn case_and_spacing_of_a_valid_upgrade() {
    let head = head_of(&[
        "GET /ws HTTP/1.1",
        "host: example.com",
        "UPGRADE:  WebSocket ",
        "connection: keep-alive, Upgrade",
        "sec-websocket-key:\tdGhlIHNhbXBsZSBub25jZQ==",
        "sec-websocket-version: 13",
    ]);
    assert_eq!(check_upgrade(&req(&head)), Ok(SAMPLE_ACCEPT.to_owned()));
}

#[test]
fn switching_protocols_head() {
    let out = switching_protocols(SAMPLE_ACCEPT, None);
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
    );
}
