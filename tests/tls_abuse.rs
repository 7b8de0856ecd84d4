//! What a TLS port does with peers that do not finish a handshake (docs/configuration.md
//! "TLS", docs/security.md): plain text (an HTTP request) is closed within 2 s and never
//! served; a slowloris on the TLS handshake, or a TLS connection that never sends its request
//! head, is closed by `limits.handshake_timeout_ms`; every TLS connection takes an
//! `accept_rate` token before its handshake; `tls.listen_tls` keeps plain text on `listen`.
//! Each counted in `tether_tls_handshake_failures_total`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::tls::{self, Pki};
use common::*;

/// Reads from `s` until EOF, a reset, or `limit`; returns what came and when it ended (`None`:
/// still open at `limit`).
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Option<Duration>) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return (got, None);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (got, Some(start.elapsed())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return (got, None)
            }
            Err(_) => return (got, Some(start.elapsed())),
        }
    }
}

fn failures(addr: SocketAddr, pki: &Pki, reason: &str) -> f64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = rt.block_on(tls::metrics(addr, &pki.client()));
    m.sum("tether_tls_handshake_failures_total", &[&format!("reason=\"{reason}\"")])
}

#[test]
fn plaintext_to_the_tls_port_is_closed_within_2s_and_never_served() {
    let pki = Pki::new("plain");
    let leaf = pki.leaf("server");
    let srv = Server::start(&tls::section(&leaf), &["--cores", "2"]);
    for req in [
        format!("GET /status HTTP/1.1\r\nHost: {}\r\n\r\n", srv.addr),
        format!("GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {SAMPLE_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n", srv.addr),
        format!("POST /publish/x HTTP/1.1\r\nHost: {}\r\nContent-Length: 2\r\n\r\n{{}}", srv.addr),
    ] {
        let mut s = TcpStream::connect(srv.addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let (got, closed) = read_until_closed(&mut s, Duration::from_secs(2));
        assert!(closed.is_some(), "a plain-text request on the TLS port stays open past 2 s (got {got:?})");
        assert!(!String::from_utf8_lossy(&got).contains("HTTP/1."), "served in plain text: {got:?}");
        // What comes back, if anything, is a TLS alert record (content type 21).
        assert!(got.is_empty() || got[0] == 21, "only an alert may come back: {got:?}");
    }
    assert_eq!(failures(srv.addr, &pki, "plaintext"), 3.0, "each counted as plaintext");
}

#[test]
fn a_slow_tls_handshake_and_a_silent_tls_connection_are_closed_by_handshake_timeout() {
    let pki = Pki::new("slow");
    let leaf = pki.leaf("server");
    let srv =
        Server::start(&format!("{}\n[limits]\nhandshake_timeout_ms = 600\n", tls::section(&leaf)), &["--cores", "1"]);
    // Slowloris on the handshake: a record header, then one byte at a time.
    let mut slow = TcpStream::connect(srv.addr).unwrap();
    slow.write_all(&[22, 3, 1, 0x02, 0x00]).unwrap();
    let start = Instant::now();
    let mut closed = None;
    while start.elapsed() < Duration::from_secs(4) {
        if slow.write_all(&[1]).is_err() {
            closed = Some(start.elapsed());
            break;
        }
        let (_, c) = read_until_closed(&mut slow, Duration::from_millis(100));
        if c.is_some() {
            closed = c.map(|_| start.elapsed());
            break;
        }
    }
    let closed = closed.expect("the slow handshake is still open after 4 s");
    assert!(closed >= Duration::from_millis(500), "closed before the timeout: {closed:?}");
    // A finished TLS handshake that never sends its request head is closed the same way.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let waited = rt.block_on(async {
        use tokio::io::AsyncReadExt;
        let mut s = tls::connect(srv.addr, &pki.client()).await;
        let start = Instant::now();
        let mut buf = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_secs(4), s.read(&mut buf)).await;
        assert!(matches!(r, Ok(Ok(0))), "the silent TLS connection ends cleanly (close_notify): {r:?}");
        start.elapsed()
    });
    assert!(waited < Duration::from_secs(3), "silent TLS connection closed after {waited:?}");
    assert_eq!(failures(srv.addr, &pki, "timeout"), 1.0, "the slow handshake counted as a timeout");
}

#[test]
fn every_tls_connection_takes_an_accept_rate_token_before_its_handshake() {
    let pki = Pki::new("rate");
    let leaf = pki.leaf("server");
    // 2 per second with a burst of 2: of 20 connections at once, at most a few get a handshake.
    let srv = Server::start(&format!("accept_rate = 2\n{}", tls::section(&leaf)), &["--cores", "1"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cfg = pki.client();
    let done = rt.block_on(async {
        let mut ok = 0;
        for _ in 0..20 {
            let tcp = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
            let name = rustls::pki_types::ServerName::IpAddress(srv.addr.ip().into());
            let hs = tokio_rustls::TlsConnector::from(cfg.clone()).connect(name, tcp);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(5), hs).await {
                ok += 1;
            }
        }
        ok
    });
    assert!((1..=4).contains(&done), "{done} of 20 handshakes done at accept_rate = 2");
    // Tokens come back at 2 per second: a scrape goes through within a few seconds.
    let refused = eventually_sync(Duration::from_secs(10), "a scrape past the rate", || {
        std::panic::catch_unwind(|| failures(srv.addr, &pki, "accept_rate")).map_err(|_| "refused")
    });
    assert!(refused >= 16.0, "refused before the handshake: {refused}");
}

#[test]
fn listen_tls_serves_tls_there_and_plain_text_on_listen() {
    let pki = Pki::new("both");
    let leaf = pki.leaf("server");
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let srv = Server::start(
        &format!("[tls]\ncert_file = {:?}\nkey_file = {:?}\nlisten_tls = \"{free}\"\n", leaf.cert, leaf.key),
        &["--cores", "2"],
    );
    // Plain text on `listen`.
    let m = srv.scrape().expect("plain /metrics on listen");
    assert_eq!(m.sum("tether_tls_connections", &[]), 0.0);
    // TLS on `listen_tls`.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = rt.block_on(tls::https(free, &pki.client(), "GET", "/healthz", ""));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(String::from_utf8_lossy(&srv.log_bytes()).contains("listening for TLS"), "{}", srv.log_tail(20));
}

#[test]
fn a_forged_record_on_an_open_tls_connection_ends_that_connection_only() {
    use futures::{SinkExt, StreamExt};
    use tokio::io::AsyncWriteExt;
    use tokio_tungstenite::tungstenite::Message;
    let pki = Pki::new("forged");
    let leaf = pki.leaf("server");
    let srv = Server::start(&tls::section(&leaf), &["--cores", "1"]);
    let cfg = pki.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut bystander = tls::wss(srv.addr, &cfg).await;
        bystander.send(Message::text(r#"{"op":"sub","ch":"forged"}"#)).await.unwrap();
        let sub = tokio::time::timeout(Duration::from_secs(10), bystander.next()).await.expect("subscribed");
        assert!(format!("{sub:?}").contains("subscribed"), "{sub:?}");
        let mut victim = tls::wss(srv.addr, &cfg).await;
        // An application-data record whose tag cannot verify, written under rustls' feet.
        let tcp = victim.get_mut().get_mut().0;
        tcp.write_all(&[23, 3, 3, 0, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20])
            .await
            .unwrap();
        let end = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match victim.next().await {
                    None | Some(Err(_)) => return,
                    Some(Ok(_)) => continue,
                }
            }
        })
        .await;
        assert!(end.is_ok(), "the connection with the forged record is still open after 2 s");
        let answer = tls::https(srv.addr, &cfg, "POST", "/publish/forged", "{\"still\":1}").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let m = tokio::time::timeout(Duration::from_secs(10), bystander.next()).await.expect("the bystander receives");
        assert!(format!("{m:?}").contains("still"), "{m:?}");
    });
}
