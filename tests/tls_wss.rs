//! wss:// and https:// on tether's own TLS (`[tls]`, docs/configuration.md "TLS") against a
//! real server with a test CA made by `openssl` (tests/common/tls.rs): Python's `ssl` +
//! `websockets` (OpenSSL, permessage-deflate) subscribes, publishes and resumes over wss://,
//! publishes, reads SSE and the status page over https://; a rustls client under
//! tokio-tungstenite moves messages of every size across records and partial writes;
//! `openssl s_client` sees TLS 1.3, TLS 1.2 and ALPN `http/1.1`. Every monoio driver and
//! readiness source.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::drivers::{self, DRIVERS};
use common::tls::{self, Pki};
use common::*;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(10);

#[test]
fn python_ssl_client_subscribes_publishes_and_resumes_over_wss_and_https() {
    let pki = Pki::new("py");
    let leaf = pki.leaf("server");
    for setup in DRIVERS {
        let srv = drivers::start(setup, &tls::section(&leaf), "2");
        let child = Command::new("python3")
            .args([
                "tests/tls/client.py",
                "127.0.0.1",
                &srv.addr.port().to_string(),
                pki.ca.to_str().unwrap(),
                "tls.py",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn python3 (pip install websockets: scripts/setup)");
        let out = wait_child(child, Duration::from_secs(60), "the Python TLS client");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{setup:?}: Python client failed: {text}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            srv.log_tail(30)
        );
        let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(v["tls_version"], "TLSv1.3", "{setup:?}: {v}");
        assert_eq!(v["alpn"], "http/1.1", "{setup:?}: {v}");
        assert_eq!(v["extensions"], json!(["permessage-deflate"]), "{setup:?}: deflate over TLS: {v}");
        assert_eq!(v["live"], json!([1, 2, 3]), "{setup:?}: {v}");
        assert_eq!(v["https_publish"], json!([[200, 4], [200, 5]]), "{setup:?}: {v}");
        assert_eq!(v["recovered"], true, "{setup:?}: {v}");
        assert_eq!(v["replayed"], json!([4, 5]), "{setup:?}: resume over wss://: {v}");
        assert_eq!(v["sse_status"], 200, "{setup:?}: {v}");
        assert_eq!(v["sse_msg"], true, "{setup:?}: SSE over https://: {v}");
        assert_eq!(v["status_page"], json!([200, true]), "{setup:?}: {v}");
        assert_eq!(v["metrics"][0], 200, "{setup:?}: {v}");
        let m = tokio::runtime::Runtime::new().unwrap().block_on(tls::metrics(srv.addr, &pki.client()));
        assert!(m.sum("tether_tls_handshakes_total", &["version=\"TLSv1.3\""]) >= 8.0, "{setup:?}: handshakes");
        assert_eq!(m.sum("tether_tls_handshake_failures_total", &[]), 0.0, "{setup:?}: no failure");
    }
}

/// Messages of every size from 1 byte to past the 60 KiB sealing chunk, both ways, with the
/// subscriber reading slowly at first so the server's writes come back short (kept ciphertext).
#[test]
fn rustls_client_moves_every_size_over_wss() {
    let pki = Pki::new("tung");
    let leaf = pki.leaf("server");
    let cfg = pki.client();
    let srv = Server::start(
        &format!(
            "{}\n[limits]\nmax_message_bytes = 200000\nmax_publish_bytes = 200000\nqueue_max_bytes = 8388608\n",
            tls::section(&leaf)
        ),
        &["--cores", "2"],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut sub = tls::wss(srv.addr, &cfg).await;
        let mut publ = tls::wss(srv.addr, &cfg).await;
        sub.send(Message::text(r#"{"op":"sub","ch":"sizes"}"#)).await.unwrap();
        let first = next_text(&mut sub).await;
        assert_eq!(first["op"], "subscribed", "{first}");
        let sizes: Vec<usize> = vec![1, 100, 1000, 16_000, 16_384, 16_385, 40_000, 61_440, 65_536, 150_000];
        for (i, &n) in sizes.iter().enumerate() {
            let data = "y".repeat(n);
            publ.send(Message::text(json!({"op":"pub","ch":"sizes","id":format!("s{i}"),"data":data}).to_string()))
                .await
                .unwrap();
        }
        // Let the server's writes meet a full socket before reading anything.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for (i, &n) in sizes.iter().enumerate() {
            let m = next_op(&mut sub, "msg").await;
            assert_eq!(m["seq"], i as u64 + 1);
            assert_eq!(m["data"].as_str().map(str::len), Some(n), "message {i}");
        }
        for i in 0..sizes.len() {
            let ack = next_op(&mut publ, "ack").await;
            assert_eq!(ack["id"], format!("s{i}"));
        }
        sub.close(None).await.unwrap();
        // Our close frame is answered, then close_notify and the FIN end the stream cleanly.
        let rest = tokio::time::timeout(T, async {
            let mut n = 0;
            while let Some(m) = sub.next().await {
                m.expect("a clean end (close_notify before the FIN)");
                n += 1;
            }
            n
        })
        .await
        .expect("the server ends the connection");
        assert!(rest <= 1, "only the close answer after our close");
    });
}

async fn next_text(ws: &mut tls::Wss) -> Value {
    loop {
        let m = tokio::time::timeout(T, ws.next()).await.expect("a frame within 10 s").expect("open").expect("frame");
        if let Message::Text(t) = m {
            return serde_json::from_str(t.as_str()).expect("JSON");
        }
    }
}

async fn next_op(ws: &mut tls::Wss, op: &str) -> Value {
    loop {
        let v = next_text(ws).await;
        if v["op"] == op {
            return v;
        }
    }
}

fn s_client(addr: std::net::SocketAddr, ca: &std::path::Path, version: &str) -> String {
    let child = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-alpn", "http/1.1", version, "-CAfile"])
        .arg(ca)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl (scripts/setup installs it)");
    let out = wait_child(child, T, "openssl s_client");
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn openssl_s_client_sees_tls13_tls12_and_alpn() {
    let pki = Pki::new("sclient");
    let leaf = pki.leaf("server");
    let srv = Server::start(&tls::section(&leaf), &["--cores", "1"]);
    let out = s_client(srv.addr, &pki.ca, "-tls1_3");
    assert!(out.contains("New, TLSv1.3"), "TLS 1.3 expected:\n{out}");
    assert!(out.contains("ALPN protocol: http/1.1"), "ALPN http/1.1 expected:\n{out}");
    assert!(out.contains("Verify return code: 0 (ok)"), "the chain verifies against the test CA:\n{out}");
    let out = s_client(srv.addr, &pki.ca, "-tls1_2");
    assert!(out.contains("Protocol  : TLSv1.2") || out.contains("New, TLSv1.2"), "TLS 1.2 expected:\n{out}");
    assert!(out.contains("ALPN protocol: http/1.1"), "ALPN over TLS 1.2:\n{out}");
    // Clients that close right behind their Finished (close_notify in the same read) count
    // as done handshakes, not failed ones.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cfg = pki.client();
    rt.block_on(async {
        use tokio::io::AsyncWriteExt;
        for _ in 0..20 {
            let mut s = tls::connect(srv.addr, &cfg).await;
            s.shutdown().await.expect("close_notify and FIN");
        }
    });
    let m = eventually_sync(T, "21 TLS 1.3 handshakes counted", || {
        let m = rt.block_on(tls::metrics(srv.addr, &cfg));
        let n = m.sum("tether_tls_handshakes_total", &["version=\"TLSv1.3\""]);
        check(n >= 22.0, || n).map(|_| m)
    });
    assert_eq!(m.sum("tether_tls_handshakes_total", &["version=\"TLSv1.2\""]), 1.0);
    assert_eq!(m.sum("tether_tls_handshake_failures_total", &[]), 0.0, "no handshake counted as failed");
    // TLS 1.1 and older are refused.
    let out = s_client(srv.addr, &pki.ca, "-tls1_1");
    assert!(!out.contains("New, TLSv1.1"), "TLS 1.1 must be refused:\n{out}");
}

/// SIGTERM's drain reaches a wss:// connection as on ws://: a 1012 close frame, then
/// close_notify and the FIN, and the process exits 0.
#[test]
fn the_drain_closes_wss_connections_with_1012_and_close_notify() {
    let pki = Pki::new("drain");
    let leaf = pki.leaf("server");
    let cfg = pki.client();
    let mut srv = Server::start(&format!("{}\n[drain]\nwindow_ms = 200\n", tls::section(&leaf)), &["--cores", "2"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut ws = tls::wss(srv.addr, &cfg).await;
        srv.signal(libc::SIGTERM);
        let code = tokio::time::timeout(T, async {
            loop {
                match ws.next().await {
                    Some(Ok(Message::Close(Some(f)))) => return u16::from(f.code),
                    Some(Ok(_)) => continue,
                    other => panic!("no close frame: {other:?}"),
                }
            }
        })
        .await
        .expect("a close frame within the drain");
        assert_eq!(code, 1012);
        // Our answer, then the server's close_notify ends the stream without an error.
        let end = tokio::time::timeout(T, async {
            while let Some(m) = ws.next().await {
                m.expect("a clean end");
            }
        })
        .await;
        assert!(end.is_ok(), "the stream did not end");
    });
    let st = srv.wait_exit(T).expect("tether exits after the drain");
    assert!(st.success(), "exit status {st:?}");
}

/// The peer's close_notify is answered with tether's own before the socket closes (RFC 8446
/// §6.1), right after the handshake, after a request and after a WebSocket upgrade: OpenSSL's two-way shutdown through
/// Python's `ssl` (`unwrap()`) returns only when the server's close_notify arrives.
#[test]
fn the_peers_close_notify_is_answered_with_close_notify() {
    let pki = Pki::new("notify");
    let leaf = pki.leaf("server");
    for setup in DRIVERS {
        let srv = drivers::start(setup, &tls::section(&leaf), "1");
        let child = Command::new("python3")
            .args(["tests/tls/close_notify.py", "127.0.0.1", &srv.addr.port().to_string(), pki.ca.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn python3");
        let out = wait_child(child, Duration::from_secs(30), "the Python close_notify client");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{setup:?}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(v["handshake"], "answered", "{setup:?}: {v}\n{}", srv.log_tail(20));
        assert_eq!(v["after_http"], "answered after HTTP/1.1 200 OK", "{setup:?}: {v}\n{}", srv.log_tail(20));
        assert_eq!(
            v["after_ws"],
            "answered after HTTP/1.1 101 Switching Protocols",
            "{setup:?}: {v}\n{}",
            srv.log_tail(20)
        );
    }
}
