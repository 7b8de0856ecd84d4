//! HTTP/1.1 responses (RFC 9110, RFC 9112 §4), sans-IO: complete responses and heads built as
//! bytes, the JSON error body, refused upgrades, `HEAD` answers and the `Expect` decision.

use ::http::StatusCode;

use super::date;
use super::request::{HttpError, Request};

/// The interim response sent when a request with `Expect: 100-continue` may go on to send
/// its content (RFC 9110 §15.2.1). 1xx responses carry no content and need no `Date`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// What the server does about a request's `Expect` header (RFC 9110 §10.1.1), decided from
/// the head alone, before any content is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expectation {
    /// No expectation to meet (none sent, or an HTTP/1.0 request, whose `Expect` a server
    /// MUST ignore): read the content as usual.
    None,
    /// `100-continue`: send [`CONTINUE`] right after the head, unless the content has
    /// already arrived or a final status is already decided (e.g. 413 for a declared length
    /// over the limit, which the caller checks first).
    Continue,
    /// An expectation tether cannot meet: answer this final status (417) instead of reading
    /// the content, then close.
    Failed(HttpError),
}

/// Reads `req.expect` (RFC 9110 §10.1.1): `100-continue` (case-insensitive) is the only
/// expectation defined; any other member gets 417 Expectation Failed. HTTP/1.0 requests are
/// [`Expectation::None`]: a server MUST NOT send a 1xx response to an HTTP/1.0 client
/// (RFC 9110 §15.2) and MUST ignore their 100-continue.
pub fn expectation(req: &Request) -> Expectation {
    let Some(value) = req.expect.as_deref() else {
        return Expectation::None;
    };
    if req.minor_version == 0 {
        return Expectation::None;
    }
    let mut result = Expectation::None;
    for member in value.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        if member.eq_ignore_ascii_case("100-continue") {
            result = Expectation::Continue;
        } else {
            return Expectation::Failed(HttpError::new(StatusCode::EXPECTATION_FAILED, "unsupported expectation"));
        }
    }
    result
}

/// The answer to a `HEAD` request made from the answer to the same `GET`: the same head
/// (`Content-Length` included, RFC 9110 §9.3.2 and §8.6), no content. `resp` is a complete
/// response from [`response`]; anything after its head is cut.
pub fn head_only(mut resp: Vec<u8>) -> Vec<u8> {
    if let Some(end) = resp.windows(4).position(|w| w == b"\r\n\r\n") {
        resp.truncate(end + 4);
    }
    resp
}

/// The standard reason phrase of `status` (RFC 9110 §15, RFC 6585: the `http` crate's
/// `StatusCode::canonical_reason`), or `""` for a code without one (the phrase is optional on
/// the wire, RFC 9112 §4).
pub fn reason_phrase(status: StatusCode) -> &'static str {
    match status {
        // RFC 9110 §15.5.14 renamed 413; `http` still says RFC 7231's "Payload Too Large".
        StatusCode::PAYLOAD_TOO_LARGE => "Content Too Large",
        _ => status.canonical_reason().unwrap_or(""),
    }
}

/// A complete HTTP/1.1 response: status line with the standard reason phrase, `Date` (the
/// current second, RFC 9110 §6.6.1: an origin server with a clock MUST send it), `Content-Type`
/// (omitted if empty), `Content-Length`, `Connection: keep-alive` or `close`, then `extra`
/// headers, then the body.
///
/// 1xx, 204 and 304 responses carry neither `Content-Length` nor a body (RFC 9110 §8.6,
/// §15.3.5, §15.4.5), whatever `body` holds. An `extra` header whose name or value contains
/// CR or LF is skipped, so a header built from request data can never split the response.
/// For a `HEAD` request use [`response_head`] with the length the `GET` body would have.
pub fn response(
    status: StatusCode,
    content_type: &str,
    body: &[u8],
    extra: &[(&str, &str)],
    keep_alive: bool,
) -> Vec<u8> {
    let mut out = head_with_capacity(status, content_type, body.len(), extra, keep_alive, body.len());
    if has_body(status) {
        out.extend_from_slice(body);
    }
    out
}

/// Only the head of [`response`] (ending in CRLFCRLF), announcing `content_length` bytes:
/// for `HEAD` requests, or when the body is sent separately (e.g. a large `/metrics` text
/// written with `writev`).
pub fn response_head(
    status: StatusCode,
    content_type: &str,
    content_length: usize,
    extra: &[(&str, &str)],
    keep_alive: bool,
) -> Vec<u8> {
    head_with_capacity(status, content_type, content_length, extra, keep_alive, 0)
}

/// The head of a response whose body is delimited by the end of the connection (RFC 9112
/// §6.3, rule 8): no `Content-Length`, no `Transfer-Encoding`, `Connection: close`. For an
/// endless stream (Server-Sent Events); `extra` headers as in [`response`].
pub fn stream_head(status: StatusCode, content_type: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut out = status_line(status, content_type, extra, 0);
    push_header(&mut out, "Content-Type", content_type);
    push_header(&mut out, "Connection", "close");
    for (name, value) in extra {
        push_header(&mut out, name, value);
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A JSON error body `{"error":REASON}` (REASON JSON-escaped) with the given status and
/// `Content-Type: application/json`.
pub fn error_response(status: StatusCode, reason: &str, extra: &[(&str, &str)], keep_alive: bool) -> Vec<u8> {
    let mut body = Vec::with_capacity(reason.len() + 16);
    body.extend_from_slice(b"{\"error\":");
    // Writing into a Vec cannot fail, and a &str always serializes.
    let _ = serde_json::to_writer(&mut body, reason);
    body.push(b'}');
    response(status, "application/json", &body, extra, keep_alive)
}

/// The answer to a refused upgrade or an unreadable request head: `err.status` (400, 426, 431,
/// 503, …) with a `text/plain` body naming `err.reason`, always `Connection: close`.
/// 426 adds `Sec-WebSocket-Version: 13` (RFC 6455 §4.4) and `Upgrade: websocket`
/// (RFC 9110 §15.5.22). `extra` carries e.g. `Retry-After` for 503.
pub fn handshake_rejection(err: HttpError, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut body = String::with_capacity(err.reason.len() + 1);
    body.push_str(err.reason);
    body.push('\n');
    let content_type = "text/plain; charset=utf-8";
    if err.status == StatusCode::UPGRADE_REQUIRED {
        let mut headers = Vec::with_capacity(extra.len() + 2);
        headers.push(("Sec-WebSocket-Version", "13"));
        headers.push(("Upgrade", "websocket"));
        headers.extend_from_slice(extra);
        response(err.status, content_type, body.as_bytes(), &headers, false)
    } else {
        response(err.status, content_type, body.as_bytes(), extra, false)
    }
}

/// 1xx, 204 and 304 never carry content (RFC 9110 §6.4.1).
fn has_body(status: StatusCode) -> bool {
    !status.is_informational() && status != StatusCode::NO_CONTENT && status != StatusCode::NOT_MODIFIED
}

fn head_with_capacity(
    status: StatusCode,
    content_type: &str,
    content_length: usize,
    extra: &[(&str, &str)],
    keep_alive: bool,
    body_capacity: usize,
) -> Vec<u8> {
    let mut out = status_line(status, content_type, extra, body_capacity);
    if !content_type.is_empty() {
        push_header(&mut out, "Content-Type", content_type);
    }
    if has_body(status) {
        out.extend_from_slice(b"Content-Length: ");
        out.extend_from_slice(itoa::Buffer::new().format(content_length).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    push_header(&mut out, "Connection", if keep_alive { "keep-alive" } else { "close" });
    for (name, value) in extra {
        push_header(&mut out, name, value);
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The status line and `Date` of a response, in a buffer with room for the rest of the head
/// (`content_type`, `extra`) and `body_capacity` bytes of body.
fn status_line(status: StatusCode, content_type: &str, extra: &[(&str, &str)], body_capacity: usize) -> Vec<u8> {
    let extra_len: usize = extra.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
    let mut out = Vec::with_capacity(128 + content_type.len() + extra_len + body_capacity);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason_phrase(status).as_bytes());
    out.extend_from_slice(b"\r\n");
    date::push_date_header(&mut out);
    out
}

fn push_header(out: &mut Vec<u8>, name: &str, value: &str) {
    let splits = |s: &str| s.bytes().any(|b| b == b'\r' || b == b'\n');
    if splits(name) || splits(value) {
        return;
    }
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}
