//! Plain HTTP/1.1 for the non-WebSocket endpoints (`POST /publish/{channel}`, `/healthz`,
//! `/readyz`, `/metrics`, `/connections`) and for refused upgrades, sans-IO: responses are
//! built as bytes, request bodies and targets are decoded from bytes, expectations are
//! answered from the parsed head. Request heads are parsed by
//! [`crate::ws::handshake::parse_request`].
//!
//! Which requirement of RFC 9110/9112 is met where: `docs/http.md`.

mod date;
pub mod json;

use crate::ws::handshake::{HttpError, Request};

pub use date::imf_fixdate;

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
            return Expectation::Failed(HttpError::new(417, "unsupported expectation"));
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

/// Longest chunk-size line (size plus extensions, RFC 9112 §7.1.1) accepted in a chunked body.
const MAX_CHUNK_LINE: usize = 4096;
/// Largest trailer section (RFC 9112 §7.1.2) accepted after the last chunk; trailers are
/// discarded.
const MAX_TRAILER_BYTES: usize = 8192;

/// The standard reason phrase of `status` (RFC 9110 §15, RFC 6585), or `""` for codes tether
/// never sends (the phrase is optional on the wire, RFC 9112 §4).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
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
pub fn response(status: u16, content_type: &str, body: &[u8], extra: &[(&str, &str)], keep_alive: bool) -> Vec<u8> {
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
    status: u16,
    content_type: &str,
    content_length: usize,
    extra: &[(&str, &str)],
    keep_alive: bool,
) -> Vec<u8> {
    head_with_capacity(status, content_type, content_length, extra, keep_alive, 0)
}

/// A JSON error body `{"error":REASON}` (REASON JSON-escaped) with the given status and
/// `Content-Type: application/json`.
pub fn error_response(status: u16, reason: &str, extra: &[(&str, &str)], keep_alive: bool) -> Vec<u8> {
    let mut body = Vec::with_capacity(reason.len() + 16);
    body.extend_from_slice(b"{\"error\":");
    crate::protocol::push_json_str(&mut body, reason);
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
    if err.status == 426 {
        let mut headers = Vec::with_capacity(extra.len() + 2);
        headers.push(("Sec-WebSocket-Version", "13"));
        headers.push(("Upgrade", "websocket"));
        headers.extend_from_slice(extra);
        response(err.status, content_type, body.as_bytes(), &headers, false)
    } else {
        response(err.status, content_type, body.as_bytes(), extra, false)
    }
}

/// Decodes `%XX` escapes (RFC 3986 §2.1) in a path segment or query value. `+` is kept as is
/// (see [`query_param`] for form encoding). `None` on a truncated or non-hex escape, or when
/// the decoded bytes are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_owned());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hi = hex_value(*bytes.get(i + 1)?)?;
            let lo = hex_value(*bytes.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The value of the first `key` in a query string `a=1&b=2`, decoded as
/// `application/x-www-form-urlencoded` (`+` is a space, then [`percent_decode`]); keys are
/// decoded the same way before comparing. A key without `=` has the value `""`. `None` when
/// the key is absent or its value does not decode.
pub fn query_param(query: &str, key: &str) -> Option<String> {
    query_values(query, key).into_iter().flatten().next()
}

/// Every value of `key` in a query string, in order, decoded as [`query_param`] decodes
/// them: `None` for an occurrence whose value does not decode. Empty when `key` is absent;
/// more than one element when it is repeated (`?token=a&token=b`).
pub fn query_values(query: &str, key: &str) -> Vec<Option<String>> {
    let form_decode = |s: &str| {
        if s.contains('+') {
            percent_decode(&s.replace('+', " "))
        } else {
            percent_decode(s)
        }
    };
    query
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(k)?.as_str() == key).then(|| form_decode(v))
        })
        .collect()
}

/// Decodes a `Transfer-Encoding: chunked` body (RFC 9112 §7.1) that starts at `buf[0]` (the
/// byte after the request head).
///
/// - `Ok(None)`: incomplete; call again with more bytes (nothing is consumed, no allocation).
/// - `Ok(Some((body, consumed)))`: the decoded body and the encoded bytes it took, trailers and
///   the final CRLF included; the next pipelined request starts at `buf[consumed]`.
/// - `Err(413)`: the decoded body would exceed `max_body_bytes`.
/// - `Err(400)`: bad chunk size, missing CRLF after a chunk, or a chunk line longer than 4 KiB
///   or trailers larger than 8 KiB.
pub fn decode_chunked(buf: &[u8], max_body_bytes: usize) -> Result<Option<(Vec<u8>, usize)>, HttpError> {
    // Walk once without copying so a body arriving in many reads costs no allocation per read.
    let Some((body_len, consumed)) = walk_chunks(buf, max_body_bytes, |_| ())? else {
        return Ok(None);
    };
    let mut body = Vec::with_capacity(body_len);
    walk_chunks(buf, max_body_bytes, |chunk| body.extend_from_slice(chunk))?;
    Ok(Some((body, consumed)))
}

/// Visits each chunk's data; returns (decoded length, encoded length) once the body is
/// complete.
fn walk_chunks(
    buf: &[u8],
    max_body_bytes: usize,
    mut on_chunk: impl FnMut(&[u8]),
) -> Result<Option<(usize, usize)>, HttpError> {
    let mut pos = 0;
    let mut body_len = 0usize;
    loop {
        let Some(line_len) = line_at(buf, pos, MAX_CHUNK_LINE)? else {
            return Ok(None);
        };
        let size = chunk_size(&buf[pos..pos + line_len])?;
        pos += line_len + 2;
        if size == 0 {
            let trailer_start = pos;
            loop {
                let Some(line_len) = line_at(buf, pos, MAX_TRAILER_BYTES)? else {
                    return Ok(None);
                };
                pos += line_len + 2;
                if line_len == 0 {
                    return Ok(Some((body_len, pos)));
                }
                if pos - trailer_start > MAX_TRAILER_BYTES {
                    return Err(HttpError::new(400, "chunked trailers too large"));
                }
            }
        }
        body_len = body_len
            .checked_add(size)
            .filter(|&n| n <= max_body_bytes)
            .ok_or(HttpError::new(413, "request body too large"))?;
        let Some(end) = pos.checked_add(size).filter(|&end| end + 2 <= buf.len()) else {
            return Ok(None);
        };
        if &buf[end..end + 2] != b"\r\n" {
            return Err(HttpError::new(400, "missing CRLF after chunk"));
        }
        on_chunk(&buf[pos..end]);
        pos = end + 2;
    }
}

/// Length of the line starting at `buf[pos]` (up to, excluding, CRLF); `None` if its end has
/// not arrived yet; 400 if it is already longer than `limit`.
fn line_at(buf: &[u8], pos: usize, limit: usize) -> Result<Option<usize>, HttpError> {
    let rest = &buf[pos.min(buf.len())..];
    match rest.windows(2).position(|w| w == b"\r\n") {
        Some(n) if n <= limit => Ok(Some(n)),
        Some(_) => Err(HttpError::new(400, "chunk line too long")),
        None if rest.len() > limit + 1 => Err(HttpError::new(400, "chunk line too long")),
        None => Ok(None),
    }
}

/// `chunk-size [BWS ";" chunk-ext]` → size; extensions are ignored (RFC 9112 §7.1.1).
fn chunk_size(line: &[u8]) -> Result<usize, HttpError> {
    let bad = HttpError::new(400, "bad chunk size");
    let digits = line.split(|&b| b == b';').next().unwrap_or_default();
    let end = digits.iter().rposition(|&b| b != b' ' && b != b'\t').map_or(0, |i| i + 1);
    let digits = &digits[..end];
    if digits.is_empty() {
        return Err(bad);
    }
    digits.iter().try_fold(0usize, |acc, &b| {
        let d = hex_value(b).ok_or(bad)?;
        acc.checked_mul(16)
            .and_then(|n| n.checked_add(usize::from(d)))
            .ok_or(HttpError::new(413, "request body too large"))
    })
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// 1xx, 204 and 304 never carry content (RFC 9110 §6.4.1).
fn has_body(status: u16) -> bool {
    !(100..200).contains(&status) && status != 204 && status != 304
}

fn head_with_capacity(
    status: u16,
    content_type: &str,
    content_length: usize,
    extra: &[(&str, &str)],
    keep_alive: bool,
    body_capacity: usize,
) -> Vec<u8> {
    let extra_len: usize = extra.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
    let mut out = Vec::with_capacity(128 + content_type.len() + extra_len + body_capacity);
    out.extend_from_slice(b"HTTP/1.1 ");
    crate::protocol::push_u64(&mut out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason_phrase(status).as_bytes());
    out.extend_from_slice(b"\r\n");
    date::push_date_header(&mut out);
    if !content_type.is_empty() {
        push_header(&mut out, "Content-Type", content_type);
    }
    if has_body(status) {
        out.extend_from_slice(b"Content-Length: ");
        crate::protocol::push_u64(&mut out, content_length as u64);
        out.extend_from_slice(b"\r\n");
    }
    push_header(&mut out, "Connection", if keep_alive { "keep-alive" } else { "close" });
    for (name, value) in extra {
        push_header(&mut out, name, value);
    }
    out.extend_from_slice(b"\r\n");
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

#[cfg(test)]
mod tests;
