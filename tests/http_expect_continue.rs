//! `Expect: 100-continue` on the plain endpoints (RFC 9110 §10.1.1, §15.2), over raw sockets:
//! the interim `100 Continue` comes right after the head (curl, .NET and the AWS SDKs wait a
//! second for it before sending a body), or the final status comes instead of it when the
//! request is already refused; HTTP/1.0 clients never get a 1xx.

mod common;

use std::time::{Duration, Instant};

use common::raw_http::*;
use common::*;

const CONFIG: &str = "[limits]\nmax_publish_bytes = 4096\nqueue_max_bytes = 131072\n";

fn publish_head(addr: std::net::SocketAddr, version: &str, len: usize, extra: &str) -> String {
    format!("POST /publish/expect HTTP/{version}\r\nHost: {addr}\r\nContent-Length: {len}\r\n{extra}\r\n")
}

#[test]
fn small_body_gets_100_continue_right_after_the_head_then_the_final_status() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let body = br#"{"a":1}"#;
    let mut c = RawHttp::connect(srv.addr);
    let t0 = Instant::now();
    c.send(publish_head(srv.addr, "1.1", body.len(), "Expect: 100-continue\r\n"));
    let interim = c.response();
    let waited = t0.elapsed();
    assert_eq!((interim.status, interim.head.as_str()), (100, "HTTP/1.1 100 Continue"), "{interim:?}");
    assert!(waited < Duration::from_millis(500), "100 Continue took {waited:?}");
    c.send(body);
    let fin = c.response();
    assert_eq!(fin.status, 200, "{fin:?}");
    assert_eq!(seq_of_reply(&fin.body), 1);

    // Keep-alive: the next request with an expectation gets its own 100 Continue.
    c.send(publish_head(srv.addr, "1.1", body.len(), "Expect: 100-Continue\r\n"));
    assert_eq!(c.response().status, 100);
    c.send(body);
    assert_eq!(seq_of_reply(&c.response().body), 2);
}

#[test]
fn chunked_body_gets_100_continue() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let mut c = RawHttp::connect(srv.addr);
    c.send(format!(
        "POST /publish/expect HTTP/1.1\r\nHost: {}\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n",
        srv.addr
    ));
    assert_eq!(c.response().status, 100);
    c.send("3;ext=ignored\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n");
    let fin = c.response();
    assert_eq!(fin.status, 200, "{}", fin.body_text());
}

#[test]
fn body_declared_too_large_gets_413_instead_of_100_and_the_connection_closes() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let mut c = RawHttp::connect(srv.addr);
    c.send(publish_head(srv.addr, "1.1", 4097, "Expect: 100-continue\r\n"));
    let fin = c.response();
    assert_eq!(fin.status, 413, "{fin:?}");
    assert_eq!(fin.header("connection"), "close");
    c.until_closed(STEP);
}

#[test]
fn unknown_expectation_gets_417_and_the_connection_closes() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let mut c = RawHttp::connect(srv.addr);
    c.send(publish_head(srv.addr, "1.1", 7, "Expect: 200-ok\r\n"));
    let fin = c.response();
    assert_eq!(fin.status, 417, "{fin:?}");
    assert_eq!(fin.header("connection"), "close");
    c.until_closed(STEP);
}

#[test]
fn http_1_0_expectation_is_ignored_no_interim_response() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let mut c = RawHttp::connect(srv.addr);
    c.send(publish_head(srv.addr, "1.0", 7, "Expect: 100-continue\r\n"));
    // RFC 9110 §15.2: no 1xx to an HTTP/1.0 client; the server just waits for the content.
    c.silent_for(Duration::from_millis(300));
    c.send(br#"{"a":1}"#);
    let fin = c.response();
    assert_eq!(fin.status, 200, "{fin:?}");
}

#[test]
fn content_sent_with_the_head_needs_no_interim_response() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let mut c = RawHttp::connect(srv.addr);
    let mut req = publish_head(srv.addr, "1.1", 7, "Expect: 100-continue\r\n").into_bytes();
    req.extend_from_slice(br#"{"a":1}"#);
    c.send(req);
    let fin = c.response();
    assert_eq!(fin.status, 200, "the first response is the final one: {fin:?}");
}
