//! RFC 6455 §4.2 opening handshake over raw sockets: the good upgrade and every refusal.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONFIG: &str = "[limits]\nhandshake_timeout_ms = 400\nmax_header_bytes = 2048\n";

/// Sends `req` and returns the response status and head.
async fn ask(srv: &Server, req: &str) -> (u16, String) {
    let mut s = connect(srv.addr).await;
    s.write_all(req.as_bytes()).await.unwrap();
    let (status, head, _) = read_head(&mut s).await;
    (status, head)
}

fn req(lines: &[&str]) -> String {
    let mut r = lines.join("\r\n");
    r.push_str("\r\n\r\n");
    r
}

#[tokio::test]
async fn handshake_cases() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let host = format!("Host: {}", srv.addr);
    let key = format!("Sec-WebSocket-Key: {SAMPLE_KEY}");
    let good = |skip: &str| -> Vec<String> {
        ["GET /ws HTTP/1.1", &host, "Upgrade: websocket", "Connection: Upgrade", &key, "Sec-WebSocket-Version: 13"]
            .iter()
            .filter(|l| !l.starts_with(skip) || skip.is_empty())
            .map(|s| s.to_string())
            .collect()
    };
    let as_req = |v: Vec<String>| req(&v.iter().map(|s| s.as_str()).collect::<Vec<_>>());

    // Good upgrade: 101 with the RFC 6455 §1.3 accept value for the sample key.
    let (status, head) = ask(&srv, &as_req(good(""))).await;
    assert_eq!(status, 101, "{head}");
    assert_eq!(header(&head, "sec-websocket-accept"), Some(SAMPLE_ACCEPT), "{head}");
    assert!(header(&head, "upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket")), "{head}");
    assert!(header(&head, "connection").is_some_and(|v| v.to_ascii_lowercase().contains("upgrade")), "{head}");

    // Tokens are case-insensitive and Connection may carry a list.
    let r = req(&[
        "GET /ws HTTP/1.1",
        &host,
        "Upgrade: WebSocket",
        "Connection: keep-alive, Upgrade",
        &key,
        "Sec-WebSocket-Version: 13",
    ]);
    assert_eq!(ask(&srv, &r).await.0, 101, "token list / case");

    // Missing Host.
    assert_eq!(ask(&srv, &as_req(good("Host:"))).await.0, 400, "missing Host");
    // Bad keys: not base64, or base64 of other than 16 bytes.
    for bad in ["Sec-WebSocket-Key: not base64!!", "Sec-WebSocket-Key: dGhlIHNhbXBsZQ=="] {
        let r = req(&[
            "GET /ws HTTP/1.1",
            &host,
            "Upgrade: websocket",
            "Connection: Upgrade",
            bad,
            "Sec-WebSocket-Version: 13",
        ]);
        assert_eq!(ask(&srv, &r).await.0, 400, "{bad}");
    }
    assert_eq!(ask(&srv, &as_req(good("Sec-WebSocket-Key"))).await.0, 400, "missing key");
    // Not GET.
    let r = req(&[
        "POST /ws HTTP/1.1",
        &host,
        "Upgrade: websocket",
        "Connection: Upgrade",
        &key,
        "Sec-WebSocket-Version: 13",
        "Content-Length: 0",
    ]);
    assert_eq!(ask(&srv, &r).await.0, 400, "POST upgrade");
    // HTTP/1.0.
    let r = req(&[
        "GET /ws HTTP/1.0",
        &host,
        "Upgrade: websocket",
        "Connection: Upgrade",
        &key,
        "Sec-WebSocket-Version: 13",
    ]);
    assert_eq!(ask(&srv, &r).await.0, 400, "HTTP/1.0");
    // Missing Upgrade, missing Connection, wrong Upgrade token.
    assert_eq!(ask(&srv, &as_req(good("Upgrade:"))).await.0, 400, "missing Upgrade");
    assert_eq!(ask(&srv, &as_req(good("Connection:"))).await.0, 400, "missing Connection");
    let r = req(&["GET /ws HTTP/1.1", &host, "Upgrade: h2c", "Connection: Upgrade", &key, "Sec-WebSocket-Version: 13"]);
    assert_eq!(ask(&srv, &r).await.0, 400, "Upgrade: h2c");

    // Version 8: 426 naming the supported version.
    let r = req(&[
        "GET /ws HTTP/1.1",
        &host,
        "Upgrade: websocket",
        "Connection: Upgrade",
        &key,
        "Sec-WebSocket-Version: 8",
    ]);
    let (status, head) = ask(&srv, &r).await;
    assert_eq!(status, 426, "{head}");
    assert_eq!(header(&head, "sec-websocket-version"), Some("13"), "{head}");

    // A head larger than max_header_bytes (2048): 431.
    let filler = format!("X-Filler: {}", "a".repeat(4000));
    let r = req(&[
        "GET /ws HTTP/1.1",
        &host,
        "Upgrade: websocket",
        "Connection: Upgrade",
        &key,
        "Sec-WebSocket-Version: 13",
        &filler,
    ]);
    assert_eq!(ask(&srv, &r).await.0, 431, "oversize head");

    let m = srv.metrics().await;
    assert!(m.sum("tether_handshake_failures_total", &["reason=\"bad_request\""]) >= 9.0, "bad_request counted");
    assert!(m.sum("tether_handshake_failures_total", &["reason=\"version\""]) >= 1.0, "version counted");
    assert!(m.sum("tether_handshake_failures_total", &["reason=\"head_too_large\""]) >= 1.0, "head_too_large counted");
    assert_eq!(m.sum("tether_upgraded_total", &[]), 2.0, "only the two good upgrades count");
}

/// A client that sends half a request head and stalls is cut at handshake_timeout_ms.
#[tokio::test]
async fn handshake_timeout_closes_the_socket() {
    let srv = Server::start(CONFIG, &["--cores", "1"]);
    let mut s = connect(srv.addr).await;
    s.write_all(format!("GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\n", srv.addr).as_bytes()).await.unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 1024];
    // The server may answer (e.g. 408) before closing; read until EOF or reset.
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Err(_) => panic!("socket still open {:?} after a 400 ms handshake timeout", t0.elapsed()),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(_)) => {}
        }
    }
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(200), "closed after {waited:?}, before the 400 ms deadline");
    srv.wait_metric("tether_handshake_failures_total", &["reason=\"timeout\""], STEP, |v| v >= 1.0).await;
    assert_eq!(srv.gauge().await, 0.0);
}
