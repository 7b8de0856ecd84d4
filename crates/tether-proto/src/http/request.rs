//! HTTP/1.1 request heads (RFC 9112 §2–§3, parsed by `httparse`) and request targets, sans-IO.
//!
//! [`parse_request`] turns the bytes read so far into an owned [`Request`] (or "need more"),
//! following RFC 9112 for framing (`Content-Length`, `Transfer-Encoding`, `Connection`);
//! [`percent_decode`] and [`query_param`] decode the target. Refusals are [`HttpError`]s that
//! [`super::handshake_rejection`] turns into bytes.

use super::StatusCode;

/// Most header fields accepted in one request head; one more is answered with 431
/// (RFC 6585 §5). Browsers send 10–20; 64 leaves room for proxies.
pub const MAX_HEADERS: usize = 64;

/// Request method (RFC 9110 §9). Only the methods tether routes on are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET` (the upgrade, probes, metrics).
    Get,
    /// `POST` (publish).
    Post,
    /// `HEAD`: answered like `GET`, without content (RFC 9110 §9.3.2).
    Head,
    /// `PUT` (the admin API: `PUT /feeds/{id}`).
    Put,
    /// `DELETE` (the admin API: `DELETE /feeds/{id}`).
    Delete,
    /// Any other method (501, or 405 where the resource exists).
    Other,
}

/// One parsed request head. Owned (the read buffer is reused), small.
///
/// Header-derived fields are `None`/`false` when the header is absent. A header sent several
/// times is combined as a comma list (RFC 9110 §5.3), except `Host` and `Content-Length`,
/// whose repeats [`parse_request`] rejects (a repeated `Host`, conflicting lengths).
#[derive(Debug, Clone)]
pub struct Request {
    /// The request method.
    pub method: Method,
    /// Request target without the query, still percent-encoded (`/publish/news`). An
    /// absolute-form target (`http://host/p`, RFC 9112 §3.2.2) is reduced to its path.
    pub path: String,
    /// Everything after the first `?`, undecoded; `None` when there is no `?`.
    pub query: Option<String>,
    /// `x` of `HTTP/1.x` (0 or 1).
    pub minor_version: u8,
    /// Bytes of the head including the final CRLFCRLF; the body (if any) starts here.
    pub head_len: usize,
    /// `Content-Length` in bytes, when present.
    pub content_length: Option<usize>,
    /// `Transfer-Encoding` ends in `chunked` (RFC 9112 §6.1); never together with
    /// `content_length`.
    pub chunked: bool,
    /// Whether the connection stays open after the response (RFC 9112 §9.3): HTTP/1.1 unless
    /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`.
    pub keep_alive: bool,
    /// `Host`, or the authority of an absolute-form target (RFC 9112 §3.2.2). Always present
    /// in an HTTP/1.1 request ([`parse_request`] refuses one without); may be `None` or empty
    /// in HTTP/1.0.
    pub host: Option<String>,
    /// `Origin` (RFC 6454), as sent; compared by `Config::origin_allowed`.
    pub origin: Option<String>,
    /// `Sec-Fetch-Site` (W3C Fetch Metadata: `cross-site`, `same-site`, `same-origin`,
    /// `none`), as sent by browsers; the admin guard refuses cross-site and same-site ones.
    pub fetch_site: Option<String>,
    /// `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header), with one pair of
    /// surrounding double quotes removed (the draft makes it a structured-field string).
    pub idempotency_key: Option<String>,
    /// `Upgrade` contains the token `websocket` (case-insensitive, comma list).
    pub upgrade_websocket: bool,
    /// `Connection` contains the token `upgrade` (case-insensitive, comma list).
    pub connection_upgrade: bool,
    /// `Sec-WebSocket-Key` (RFC 6455 §4.2.1), as sent.
    pub ws_key: Option<String>,
    /// `Sec-WebSocket-Version` (RFC 6455 §4.2.1), as sent.
    pub ws_version: Option<String>,
    /// `Sec-WebSocket-Extensions` (RFC 6455 §9.1), every header's value joined with `, ` in
    /// order (the offers of all headers, first preferred); `ws::deflate::negotiate` reads it.
    pub ws_extensions: Option<String>,
    /// `Expect` (RFC 9110 §10.1.1), comma lists combined; `crate::http::expectation` reads it.
    pub expect: Option<String>,
    /// The credentials of `Authorization: Bearer <credentials>` (RFC 6750 §2.1; the scheme is
    /// case-insensitive), as sent. `None` when the header is absent or uses another scheme.
    /// A repeated `Authorization` header is refused with 400 (which of two credentials would
    /// count is ambiguous).
    pub bearer: Option<String>,
    /// `Accept` (RFC 9110 §12.5.1), comma lists combined; `GET /sse` reads it.
    pub accept: Option<String>,
    /// `Last-Event-ID` (WHATWG HTML §9.2.4), as sent: the id of the last event an EventSource
    /// received before it reconnected. `GET /sse` parses it (`crate::sse::Position`).
    pub last_event_id: Option<String>,
}

/// A request refused before it reaches a route: the HTTP status to answer with and a short,
/// stable, human-readable reason (also fit for a metrics label).
///
/// Statuses produced here: 400 (malformed or not a valid upgrade), 426 (unsupported
/// `Sec-WebSocket-Version`), 431 (head too large), 501 (a transfer coding other than
/// `chunked`). Callers may build others (e.g. 503 for admission, 417 for an expectation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpError {
    /// HTTP status code of the answer.
    pub status: StatusCode,
    /// Why, in a few words (the answer's body, and a metrics label).
    pub reason: &'static str,
}

impl HttpError {
    /// A refusal with `status` and `reason`.
    pub const fn new(status: StatusCode, reason: &'static str) -> Self {
        Self { status, reason }
    }

    /// A `400 Bad Request` refusal with `reason`.
    pub const fn bad(reason: &'static str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, reason)
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.reason)
    }
}

impl std::error::Error for HttpError {}

/// The credentials of an `Authorization` value using the `Bearer` scheme (RFC 6750 §2.1:
/// `Bearer` case-insensitive, then one or more spaces, then the token), or `None` for another
/// scheme or an empty token.
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    let token = rest.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Parses the request head at the start of `buf` (RFC 9112 §2–§3, via `httparse`).
///
/// - `Ok(None)`: the head is incomplete and `buf` is still shorter than `max_head_bytes`;
///   read more and call again with the grown buffer (nothing is consumed).
/// - `Ok(Some(req))`: `req.head_len` bytes form the head; any body follows.
/// - `Err(431)`: the head is, or must become, longer than `max_head_bytes` bytes, or it has more
///   than [`MAX_HEADERS`] fields.
/// - `Err(400)`: malformed request line or field, non-UTF-8 value in a field tether reads,
///   an HTTP/1.1 request without `Host`, a repeated `Host` or one that is not
///   `host[:port]` (RFC 9112 §3.2), bad or conflicting `Content-Length`, `Transfer-Encoding`
///   whose last coding is not `chunked` or that repeats `chunked`, or sent with
///   `Content-Length` or over HTTP/1.0 (RFC 9112 §6.1, §6.3 — ambiguous framing is the root of
///   request smuggling, so it is refused, not guessed).
/// - `Err(501)`: a transfer coding other than `chunked` (`gzip, chunked`): tether decodes
///   only `chunked` (RFC 9112 §6.1 "SHOULD respond with 501").
pub fn parse_request(buf: &[u8], max_head_bytes: usize) -> Result<Option<Request>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    // Only the first `max_head_bytes` are ever parsed: what lies beyond the limit must not
    // decide the answer, or a head over the limit would get 400 or 431 depending on how its
    // bytes were split into reads (found by the `handshake` fuzz target).
    let window = &buf[..buf.len().min(max_head_bytes)];
    let head_len = match parsed.parse(window) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            // A head that fills the limit without ending can only complete beyond it.
            return if buf.len() >= max_head_bytes {
                Err(HttpError::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large"))
            } else {
                Ok(None)
            };
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HttpError::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "too many header fields"))
        }
        Err(_) => return Err(HttpError::bad("malformed request head")),
    };
    if head_len > max_head_bytes {
        return Err(HttpError::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large"));
    }

    let method = match parsed.method {
        Some("GET") => Method::Get,
        Some("POST") => Method::Post,
        Some("HEAD") => Method::Head,
        Some("PUT") => Method::Put,
        Some("DELETE") => Method::Delete,
        _ => Method::Other,
    };
    let minor_version = parsed.version.unwrap_or(1);
    let target = parsed.path.unwrap_or("/");
    let (target, authority) = split_absolute_form(target);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_owned())),
        None => (target, None),
    };
    // `http://host?q` has an empty path, which RFC 9112 §3.2.2 reads as "/".
    let path = if path.is_empty() { "/".to_owned() } else { path.to_owned() };

    let mut req = Request {
        method,
        path,
        query,
        minor_version,
        head_len,
        content_length: None,
        chunked: false,
        keep_alive: false,
        host: None,
        origin: None,
        fetch_site: None,
        idempotency_key: None,
        upgrade_websocket: false,
        connection_upgrade: false,
        ws_key: None,
        ws_version: None,
        ws_extensions: None,
        expect: None,
        bearer: None,
        accept: None,
        last_event_id: None,
    };
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut host_seen = false;
    let mut authorization_seen = false;
    let mut transfer_codings: Vec<String> = Vec::new();

    for h in parsed.headers.iter() {
        let name = h.name;
        let value = trim_ows(h.value);
        if name.eq_ignore_ascii_case("connection") {
            for t in tokens(value) {
                if t.eq_ignore_ascii_case(b"close") {
                    conn_close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    conn_keep_alive = true;
                } else if t.eq_ignore_ascii_case(b"upgrade") {
                    req.connection_upgrade = true;
                }
            }
        } else if name.eq_ignore_ascii_case("upgrade") {
            if tokens(value).any(|t| t.eq_ignore_ascii_case(b"websocket")) {
                req.upgrade_websocket = true;
            }
        } else if name.eq_ignore_ascii_case("host") {
            // RFC 9112 §3.2: more than one Host is a 400.
            if host_seen {
                return Err(HttpError::bad("repeated Host header"));
            }
            host_seen = true;
            let host = utf8(value)?;
            if !valid_host(host) {
                return Err(HttpError::bad("invalid Host header"));
            }
            if authority.is_none() {
                req.host = Some(host.to_owned());
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            let n = content_length(value)?;
            if req.content_length.is_some_and(|prev| prev != n) {
                return Err(HttpError::bad("conflicting Content-Length"));
            }
            req.content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            for t in tokens(value) {
                transfer_codings.push(String::from_utf8_lossy(t).into_owned());
            }
        } else if name.eq_ignore_ascii_case("origin") {
            combine(&mut req.origin, utf8(value)?);
        } else if name.eq_ignore_ascii_case("sec-fetch-site") {
            combine(&mut req.fetch_site, utf8(value)?);
        } else if name.eq_ignore_ascii_case("idempotency-key") {
            combine(&mut req.idempotency_key, unquote(utf8(value)?));
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            combine(&mut req.ws_key, utf8(value)?);
        } else if name.eq_ignore_ascii_case("sec-websocket-version") {
            combine(&mut req.ws_version, utf8(value)?);
        } else if name.eq_ignore_ascii_case("sec-websocket-extensions") {
            combine(&mut req.ws_extensions, utf8(value)?);
        } else if name.eq_ignore_ascii_case("expect") {
            combine(&mut req.expect, utf8(value)?);
        } else if name.eq_ignore_ascii_case("accept") {
            combine(&mut req.accept, utf8(value)?);
        } else if name.eq_ignore_ascii_case("last-event-id") {
            combine(&mut req.last_event_id, utf8(value)?);
        } else if name.eq_ignore_ascii_case("authorization") {
            if authorization_seen {
                return Err(HttpError::bad("repeated Authorization header"));
            }
            authorization_seen = true;
            req.bearer = bearer_credentials(utf8(value)?).map(str::to_owned);
        }
    }

    // RFC 9112 §3.2: "A server MUST respond with a 400 (Bad Request) status code to any
    // HTTP/1.1 request message that lacks a Host header field" (absolute form included).
    if minor_version >= 1 && !host_seen {
        return Err(HttpError::bad("missing Host header"));
    }

    if let Some(a) = authority {
        req.host = Some(a.to_owned());
    }
    if !transfer_codings.is_empty() {
        if minor_version == 0 {
            return Err(HttpError::bad("Transfer-Encoding in HTTP/1.0"));
        }
        if req.content_length.is_some() {
            return Err(HttpError::bad("both Content-Length and Transfer-Encoding"));
        }
        let is_chunked = |c: &String| c.eq_ignore_ascii_case("chunked");
        if !transfer_codings.last().is_some_and(is_chunked) {
            return Err(HttpError::bad("Transfer-Encoding must end in chunked"));
        }
        if transfer_codings.iter().filter(|c| is_chunked(c)).count() > 1 {
            return Err(HttpError::bad("chunked applied more than once"));
        }
        if transfer_codings.len() > 1 {
            return Err(HttpError::new(StatusCode::NOT_IMPLEMENTED, "only the chunked transfer coding is supported"));
        }
        req.chunked = true;
    }
    req.keep_alive = if minor_version >= 1 { !conn_close } else { conn_keep_alive && !conn_close };
    Ok(Some(req))
}

/// Splits `http://authority/path?q` into (`/path?q`, `Some(authority)`); other targets are
/// returned as they are.
fn split_absolute_form(target: &str) -> (&str, Option<&str>) {
    let rest = ["http://", "https://"].iter().find_map(|scheme| {
        let head = target.get(..scheme.len())?;
        head.eq_ignore_ascii_case(scheme).then(|| &target[scheme.len()..])
    });
    let Some(rest) = rest else {
        return (target, None);
    };
    let (target, authority) = match rest.find(['/', '?']) {
        Some(i) => (&rest[i..], &rest[..i]),
        None => ("", rest),
    };
    (target, (!authority.is_empty()).then_some(authority))
}

/// `Host` (RFC 9112 §3.2, RFC 3986 §3.2.2): `uri-host [":" port]`, where the host is a
/// reg-name (unreserved, sub-delims, pct-encoded), an IPv4 address or an `[IP-literal]`. The
/// empty value is valid (a target URI without authority).
fn valid_host(v: &str) -> bool {
    // unreserved / sub-delims / the `%` of pct-encoded (RFC 3986 §2).
    let host_byte = |b: u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(&b);
    let port = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = v.strip_prefix('[') {
        let Some((literal, after)) = rest.split_once(']') else {
            return false;
        };
        let literal_ok = !literal.is_empty() && literal.bytes().all(|b| host_byte(b) || b == b':');
        return literal_ok && (after.is_empty() || after.strip_prefix(':').is_some_and(port));
    }
    let (host, p) = v.rsplit_once(':').unwrap_or((v, ""));
    host.bytes().all(host_byte) && port(p)
}

/// Comma-separated list elements, trimmed, empty ones skipped (RFC 9110 §5.6.1).
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(trim_ows).filter(|t| !t.is_empty())
}

/// Strips optional whitespace (SP / HTAB, RFC 9110 §5.6.3) from both ends.
fn trim_ows(v: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = v.iter().position(|b| !is_ows(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !is_ows(b)).map_or(start, |i| i + 1);
    &v[start..end]
}

fn utf8(v: &[u8]) -> Result<&str, HttpError> {
    std::str::from_utf8(v).map_err(|_| HttpError::bad("header value is not UTF-8"))
}

fn combine(slot: &mut Option<String>, value: &str) {
    match slot {
        Some(prev) => {
            prev.push_str(", ");
            prev.push_str(value);
        }
        None => *slot = Some(value.to_owned()),
    }
}

fn unquote(v: &str) -> &str {
    v.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(v)
}

/// `Content-Length` (RFC 9110 §8.6): digits only (no sign), or a list of identical values.
fn content_length(value: &[u8]) -> Result<usize, HttpError> {
    let bad = HttpError::bad("bad Content-Length");
    let mut result = None;
    for part in value.split(|&b| b == b',').map(trim_ows) {
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return Err(bad);
        }
        let n: usize = std::str::from_utf8(part).ok().and_then(|s| s.parse().ok()).ok_or(bad)?;
        if result.is_some_and(|prev| prev != n) {
            return Err(HttpError::bad("conflicting Content-Length"));
        }
        result = Some(n);
    }
    result.ok_or(bad)
}

/// Decodes `%XX` escapes (RFC 3986 §2.1) in a path segment or query value. `+` is kept as is
/// (see [`query_param`] for form encoding). `None` on a truncated or non-hex escape, or when
/// the decoded bytes are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let well_formed = s
        .split('%')
        .skip(1)
        .all(|after| after.as_bytes().get(..2).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)));
    if !well_formed {
        return None;
    }
    percent_encoding::percent_decode_str(s).decode_utf8().ok().map(|c| c.into_owned())
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

#[cfg(test)]
mod tests;
