//! The RFC 9110/9112 requirements on an origin server that apply to tether's plain endpoints
//! (`POST /publish/{ch}`, `/healthz`, `/readyz`, `/metrics`, `/connections`), one test per row
//! of the table in `docs/http.md`, over raw `std::net::TcpStream` sockets. The
//! `Expect: 100-continue` rows are in `http_expect_continue.rs`.

mod common;

use std::time::Duration;

use common::raw_http::*;
use common::*;

/// A short keep-alive idle / head timeout, so the "incomplete content" row ends quickly.
const CONFIG: &str = "[limits]\nhandshake_timeout_ms = 600\n";

const GET_ENDPOINTS: [&str; 4] = ["/healthz", "/readyz", "/metrics", "/connections"];

fn get(addr: std::net::SocketAddr, method: &str, path: &str) -> String {
    format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n")
}

/// RFC 9110 §6.6.1: an origin server with a clock MUST send Date in 2xx, 3xx and 4xx
/// responses (tether: every final response).
#[test]
fn every_final_response_carries_a_date() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let a = srv.addr;
    let cases = [
        get(a, "GET", "/healthz"),
        get(a, "GET", "/metrics"),
        get(a, "GET", "/nope"),
        get(a, "POST", "/healthz"),
        format!("POST /publish/d HTTP/1.1\r\nHost: {a}\r\nContent-Length: 2\r\n\r\n{{}}"),
        format!("POST /publish/d HTTP/1.1\r\nHost: {a}\r\nContent-Length: 3\r\n\r\nnot"),
        "GET /healthz HTTP/1.1\r\n\r\n".to_owned(),
    ];
    for req in cases {
        let r = ask(a, &req);
        let date = r.header("date");
        assert!(date.len() == 29 && date.ends_with(" GMT") && date.as_bytes()[3] == b',', "{req:?} -> Date {date:?}");
    }
}

/// RFC 9110 §9.1: GET and HEAD MUST be supported; §9.3.2: the answer to HEAD has no content
/// and the same header fields as GET; §8.6: its Content-Length equals the GET's.
#[test]
fn head_is_supported_wherever_get_is_and_carries_no_content() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    for path in ["/healthz", "/readyz"] {
        let g = ask(srv.addr, &get(srv.addr, "GET", path));
        let mut c = RawHttp::connect(srv.addr);
        c.send(get(srv.addr, "HEAD", path));
        let h = c.response_to(true);
        assert_eq!((h.status, g.status), (200, 200), "{path}");
        assert_eq!(h.header("content-length"), g.header("content-length"), "{path}");
        assert_eq!(h.header("content-type"), g.header("content-type"), "{path}");
        // No content follows: the next response on the connection starts right away.
        c.send(get(srv.addr, "GET", "/healthz"));
        let next = c.response();
        assert_eq!(next.status, 200, "after HEAD {path}: {next:?}");
        assert_eq!(next.body_text(), r#"{"status":"ok"}"#);
    }
    for path in ["/metrics", "/connections"] {
        let mut c = RawHttp::connect(srv.addr);
        c.send(get(srv.addr, "HEAD", path));
        let h = c.response_to(true);
        assert_eq!(h.status, 200, "HEAD {path}: {h:?}");
        assert!(h.header("content-length").parse::<usize>().unwrap() > 0, "{path}");
        c.send(get(srv.addr, "GET", "/healthz"));
        assert_eq!(c.response().body_text(), r#"{"status":"ok"}"#, "after HEAD {path}");
    }
    // A refused HEAD has no content either.
    let mut c = RawHttp::connect(srv.addr);
    c.send(get(srv.addr, "HEAD", "/nope"));
    let h = c.response_to(true);
    assert_eq!(h.status, 404);
    c.send(get(srv.addr, "GET", "/healthz"));
    assert_eq!(c.response().status, 200);
}

/// RFC 9110 §15.5.6: a 405 MUST carry Allow with the resource's methods.
#[test]
fn method_not_allowed_lists_the_allowed_methods() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    for path in GET_ENDPOINTS {
        let r = ask(srv.addr, &format!("POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n", srv.addr));
        assert_eq!(r.status, 405, "POST {path}");
        assert_eq!(r.header("allow"), "GET, HEAD", "POST {path}");
    }
    for method in ["GET", "HEAD"] {
        let mut c = RawHttp::connect(srv.addr);
        c.send(get(srv.addr, method, "/publish/x"));
        let r = c.response_to(method == "HEAD");
        assert_eq!(r.status, 405, "{method} /publish/x");
        assert_eq!(r.header("allow"), "POST");
    }
}

/// RFC 9110 §9.1: a method the server does not implement SHOULD get 501; method names are
/// case-sensitive. PUT and DELETE are implemented (the feeds admin API), so on a resource
/// that does not take them they get 405 with `Allow` (§15.5.6).
#[test]
fn unimplemented_methods_get_501_and_the_connection_stays_usable() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let mut c = RawHttp::connect(srv.addr);
    for method in ["OPTIONS", "PATCH", "BREW", "get", "PUT", "DELETE"] {
        c.send(get(srv.addr, method, "/healthz"));
        let r = c.response();
        if matches!(method, "PUT" | "DELETE") {
            assert_eq!((r.status, r.header("allow")), (405, "GET, HEAD"), "{method}");
        } else {
            assert_eq!(r.status, 501, "{method}");
        }
        assert_eq!(r.header("connection"), "keep-alive", "{method}");
    }
    c.send(get(srv.addr, "GET", "/healthz"));
    assert_eq!(c.response().status, 200);
}

/// RFC 9112 §3.2: 400 for an HTTP/1.1 request without Host, with more than one Host, or with
/// an invalid Host; HTTP/1.0 may omit it.
#[test]
fn host_is_required_once_and_valid_in_http_1_1() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let a = srv.addr;
    for (req, want) in [
        ("GET /healthz HTTP/1.1\r\n\r\n".to_owned(), 400),
        (format!("GET /healthz HTTP/1.1\r\nHost: {a}\r\nHost: {a}\r\n\r\n"), 400),
        ("GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n".to_owned(), 400),
        ("GET /healthz HTTP/1.1\r\nHost: user@h\r\n\r\n".to_owned(), 400),
        ("GET /healthz HTTP/1.1\r\nHost: h:x\r\n\r\n".to_owned(), 400),
        ("POST /publish/x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}".to_owned(), 400),
        ("GET /healthz HTTP/1.0\r\n\r\n".to_owned(), 200),
        ("GET /healthz HTTP/1.1\r\nHost: \r\n\r\n".to_owned(), 200),
        ("GET /healthz HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n".to_owned(), 200),
    ] {
        let r = ask(a, &req);
        assert_eq!(r.status, want, "{req:?}: {r:?}");
        if want == 400 {
            assert_eq!(r.header("connection"), "close", "{req:?}");
        }
    }
}

/// RFC 9112 §3.2.2: with an absolute-form target the server MUST ignore Host and use the
/// target's authority (so a bad Host line is no reason to refuse the target's).
#[test]
fn absolute_form_target_is_served() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let r = ask(srv.addr, &format!("GET http://{}/healthz HTTP/1.1\r\nHost: other.example\r\n\r\n", srv.addr));
    assert_eq!((r.status, r.body_text().as_str()), (200, r#"{"status":"ok"}"#));
}

/// RFC 9112 §5.1 (whitespace before the colon: MUST 400), §5.2 (obs-fold: MUST reject or
/// unfold), §2.2 (whitespace-preceded line after the request line: MUST reject or ignore),
/// RFC 9110 §5.5 (CR, LF or NUL in a value: MUST reject or replace).
#[test]
fn malformed_field_lines_get_400_and_close() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let a = srv.addr;
    for req in [
        format!("GET /healthz HTTP/1.1\r\nHost : {a}\r\n\r\n"),
        format!("GET /healthz HTTP/1.1\r\nHost: {a}\r\nX-Long: a\r\n folded\r\n\r\n"),
        format!("GET /healthz HTTP/1.1\r\n X-Lead: v\r\nHost: {a}\r\n\r\n"),
        format!("GET /healthz HTTP/1.1\r\nHost: {a}\r\nX-Nul: a\0b\r\n\r\n"),
        format!("GET /healthz HTTP/1.1\r\nHost: {a}\r\nX-Cr: a\rb\r\n\r\n"),
    ] {
        let mut c = RawHttp::connect(a);
        c.send(&req);
        let r = c.response();
        assert_eq!(r.status, 400, "{req:?}: {r:?}");
        assert_eq!(r.header("connection"), "close");
        c.until_closed(STEP);
    }
}

/// RFC 9112 §6.1 and §6.3: Transfer-Encoding with Content-Length (rejected here) and
/// Transfer-Encoding in HTTP/1.0 MUST end in closing the connection; chunked not last is 400
/// and close; a coding other than chunked SHOULD be 501; an invalid Content-Length is 400
/// and close.
#[test]
fn ambiguous_or_unsupported_framing_is_refused_and_the_connection_closed() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let a = srv.addr;
    let post = |fields: &str| format!("POST /publish/f HTTP/{fields}\r\n\r\n");
    for (req, want) in [
        (post(&format!("1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\nContent-Length: 5")), 400),
        (post(&format!("1.0\r\nHost: {a}\r\nTransfer-Encoding: chunked")), 400),
        (post(&format!("1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked, identity")), 400),
        (post(&format!("1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked")), 400),
        (post(&format!("1.1\r\nHost: {a}\r\nTransfer-Encoding: gzip, chunked")), 501),
        (post(&format!("1.1\r\nHost: {a}\r\nContent-Length: -1")), 400),
        (post(&format!("1.1\r\nHost: {a}\r\nContent-Length: 1, 2")), 400),
        (post(&format!("1.1\r\nHost: {a}\r\nContent-Length: 2\r\nContent-Length: 3")), 400),
        (post(&format!("1.1\r\nHost: {a}\r\nContent-Length: 0x10")), 400),
        (post(&format!("1.1\r\nHost: {a}\r\nContent-Length: 99999999999999999999999")), 400),
    ] {
        let mut c = RawHttp::connect(a);
        c.send(&req);
        // Bytes that would be a second request if the framing were guessed.
        c.send(format!("GET /healthz HTTP/1.1\r\nHost: {a}\r\n\r\n"));
        let r = c.response();
        assert_eq!(r.status, want, "{req:?}: {r:?}");
        assert_eq!(r.header("connection"), "close", "{req:?}");
        let rest = c.until_closed(STEP);
        assert!(rest.is_empty(), "{req:?}: a second response followed: {:?}", String::from_utf8_lossy(&rest));
    }
}

/// RFC 9112 §7.1: a recipient MUST be able to decode chunked; §7.1.1: it MUST ignore
/// unrecognized chunk extensions; trailers may be discarded.
#[test]
fn chunked_content_is_decoded_with_extensions_and_trailers() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let mut c = RawHttp::connect(srv.addr);
    c.send(format!(
        "POST /publish/chunked HTTP/1.1\r\nHost: {}\r\nTransfer-Encoding: chunked\r\n\r\n\
         4;name=value\r\n{{\"a\"\r\n3\r\n:1}}\r\n0\r\nX-Trailer: t\r\n\r\n",
        srv.addr
    ));
    let r = c.response();
    assert_eq!(r.status, 200, "{}", r.body_text());
    assert_eq!(seq_of_reply(&r.body), 1);
}

/// RFC 9112 §6.3: content shorter than its Content-Length when the connection goes idle is
/// incomplete: the server MUST NOT treat it as a request, and closes the connection.
#[test]
fn incomplete_content_is_never_served_and_the_connection_closes() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let mut c = RawHttp::connect(srv.addr);
    c.send(format!("POST /publish/short HTTP/1.1\r\nHost: {}\r\nContent-Length: 10\r\n\r\n{{}}", srv.addr));
    let got = c.until_closed(Duration::from_secs(5));
    assert!(!got.starts_with(b"HTTP/1.1 200"), "an incomplete request was served: {:?}", String::from_utf8_lossy(&got));
    let r =
        ask(srv.addr, &format!("POST /publish/short HTTP/1.1\r\nHost: {}\r\nContent-Length: 2\r\n\r\n{{}}", srv.addr));
    assert_eq!(seq_of_reply(&r.body), 1, "nothing was published from the incomplete request");
}

/// RFC 9112 §9.3 and §9.6: HTTP/1.1 persists by default; `Connection: close` makes the server
/// close after that response and MUST NOT process further requests; HTTP/1.0 persists only
/// with `keep-alive`; a closing response says `Connection: close`.
#[test]
fn persistence_follows_the_version_and_the_close_option() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let a = srv.addr;
    // HTTP/1.1 default: two requests on one connection.
    let mut c = RawHttp::connect(a);
    c.send(get(a, "GET", "/healthz"));
    assert_eq!(c.response().header("connection"), "keep-alive");
    c.send(get(a, "GET", "/readyz"));
    assert_eq!(c.response().status, 200);

    // `close`, with a pipelined request behind it that must not be processed.
    let mut c = RawHttp::connect(a);
    c.send(format!(
        "GET /healthz HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n\
         POST /publish/after-close HTTP/1.1\r\nHost: {a}\r\nContent-Length: 2\r\n\r\n{{}}"
    ));
    let r = c.response();
    assert_eq!((r.status, r.header("connection")), (200, "close"));
    let rest = c.until_closed(STEP);
    assert!(rest.is_empty(), "answered after close: {:?}", String::from_utf8_lossy(&rest));
    let seq = ask(a, &format!("POST /publish/after-close HTTP/1.1\r\nHost: {a}\r\nContent-Length: 2\r\n\r\n{{}}"));
    assert_eq!(seq_of_reply(&seq.body), 1, "the request after `close` was processed");

    // HTTP/1.0 without keep-alive: one response, then the server closes; never chunked.
    let mut c = RawHttp::connect(a);
    c.send("GET /metrics HTTP/1.0\r\n\r\n");
    let r = c.response();
    assert_eq!((r.status, r.header("connection")), (200, "close"));
    assert!(!r.has("transfer-encoding") && r.has("content-length"), "{}", r.head);
    c.until_closed(STEP);

    // HTTP/1.0 asking for keep-alive: it persists.
    let mut c = RawHttp::connect(a);
    c.send("GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(c.response().header("connection"), "keep-alive");
    c.send("GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(c.response().status, 200);
}

/// RFC 9112 §9.3.2: pipelined requests are answered in the order received.
#[test]
fn pipelined_requests_are_answered_in_order() {
    let srv = Server::start(CONFIG, &["--cores", "2"]);
    let a = srv.addr;
    let mut c = RawHttp::connect(a);
    let mut batch = String::new();
    for i in 0..6 {
        batch.push_str(&format!("POST /publish/pipe{i} HTTP/1.1\r\nHost: {a}\r\nContent-Length: 1\r\n\r\n{i}"));
        batch.push_str(&get(a, "GET", "/nope"));
    }
    c.send(batch);
    for i in 0..6 {
        let r = c.response();
        assert_eq!((r.status, seq_of_reply(&r.body)), (200, 1), "publish {i}");
        assert_eq!(c.response().status, 404, "after publish {i}");
    }
}
