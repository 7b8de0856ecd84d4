//! tether's own TLS record layer after the handshake (src/server/tls/record.rs) against real
//! clients: every cipher suite tether serves (TLS 1.3 AES-128-GCM, AES-256-GCM,
//! ChaCha20-Poly1305; TLS 1.2 ECDHE-ECDSA with the same three) carries pub/sub over wss://
//! with a rustls client and with Python's `ssl` (OpenSSL); a client's KeyUpdate (rustls
//! `refresh_traffic_keys`, update_requested) is followed and answered and the connection keeps
//! working both ways; a corrupted record ends that connection alone with bad_record_mac; a
//! lowered `tls.records_per_key` makes the server update its key (TLS 1.3; the client sees the
//! KeyUpdate records on the wire and keeps reading) or close with close_notify (TLS 1.2).
//!
//! Run on both monoio drivers: the first test holds on every setup itself; the others follow
//! the environment (`MONOIO_FORCE_LEGACY_DRIVER=1` for epoll).

mod common;

use std::io::{Read, Write};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use common::drivers::{self, DRIVERS};
use common::tls::{self, Pki};
use common::*;
use futures::{SinkExt, StreamExt};
use rustls::crypto::ring::{cipher_suite as cs, default_provider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::SupportedCipherSuite;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const T: Duration = Duration::from_secs(10);

/// A TCP stream that counts the TLS 1.3 records the server sends whose outer length is 22: a
/// sealed 5-byte handshake message, i.e. a KeyUpdate (no WebSocket frame tether sends makes a
/// 5-byte record, and the handshake's records are longer).
struct Tap {
    inner: TcpStream,
    key_updates: Arc<AtomicUsize>,
    /// Header bytes of the record being read, and the body bytes still to skip.
    header: Vec<u8>,
    skip: usize,
}

impl Tap {
    fn scan(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (5 - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.header.len() == 5 {
                let len = usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
                if self.header[0] == 23 && len == 22 {
                    self.key_updates.fetch_add(1, Ordering::Relaxed);
                }
                self.skip = len;
                self.header.clear();
            }
        }
    }
}

impl AsyncRead for Tap {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let got = buf.filled()[before..].to_vec();
            self.scan(&got);
        }
        r
    }
}

impl AsyncWrite for Tap {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

type TapWs = WebSocketStream<TlsStream<Tap>>;

/// A rustls client configuration trusting `pki`'s CA and offering only `suite`.
fn only(pki: &Pki, suite: SupportedCipherSuite) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(&pki.ca).expect("CA PEM")).expect("CA");
    let version = match suite {
        SupportedCipherSuite::Tls12(_) => &rustls::version::TLS12,
        SupportedCipherSuite::Tls13(_) => &rustls::version::TLS13,
    };
    let p = rustls::crypto::CryptoProvider { cipher_suites: vec![suite], ..default_provider() };
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(p))
        .with_protocol_versions(&[version])
        .expect("version")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// wss:// through a [`Tap`]; the counter of KeyUpdate records the server sent on it.
async fn tapped(addr: std::net::SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> (TapWs, Arc<AtomicUsize>) {
    let key_updates = Arc::new(AtomicUsize::new(0));
    let tap = Tap {
        inner: TcpStream::connect(addr).await.expect("connect"),
        key_updates: key_updates.clone(),
        header: Vec::new(),
        skip: 0,
    };
    let name = ServerName::IpAddress(addr.ip().into());
    let tls = tokio::time::timeout(T, TlsConnector::from(cfg.clone()).connect(name, tap))
        .await
        .expect("TLS handshake within 10 s")
        .expect("TLS handshake");
    let (ws, _) = tokio::time::timeout(T, tokio_tungstenite::client_async(format!("wss://{addr}/ws"), tls))
        .await
        .expect("upgrade within 10 s")
        .expect("upgrade");
    (ws, key_updates)
}

async fn next_op<S>(ws: &mut WebSocketStream<S>, op: &str) -> Value
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let m = tokio::time::timeout(T, ws.next()).await.expect("a frame within 10 s").expect("open").expect("frame");
        if let Message::Text(t) = m {
            let v: Value = serde_json::from_str(t.as_str()).expect("JSON");
            if v["op"] == op {
                return v;
            }
        }
    }
}

/// Subscribes `ws` to `ch`, publishes a message of each size of `sizes` on it and reads each
/// back; returns the sizes read.
async fn round_trip<S>(ws: &mut WebSocketStream<S>, ch: &str, sizes: &[usize]) -> Vec<usize>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    ws.send(Message::text(json!({"op":"sub","ch":ch}).to_string())).await.unwrap();
    next_op(ws, "subscribed").await;
    let mut got = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let data = "q".repeat(n);
        ws.send(Message::text(json!({"op":"pub","ch":ch,"id":format!("m{i}"),"data":data}).to_string())).await.unwrap();
        got.push(next_op(ws, "msg").await["data"].as_str().map_or(0, str::len));
    }
    got
}

const SIZES: [usize; 5] = [1, 700, 16_384, 16_385, 40_000];

fn config(leaf: &tls::Leaf, extra: &str) -> String {
    format!("{}{extra}\n[limits]\nmax_message_bytes = 100000\nmax_publish_bytes = 100000\n", tls::section(leaf))
}

fn suites() -> [(SupportedCipherSuite, &'static str); 6] {
    [
        (cs::TLS13_AES_128_GCM_SHA256, "TLS13_AES_128_GCM_SHA256"),
        (cs::TLS13_AES_256_GCM_SHA384, "TLS13_AES_256_GCM_SHA384"),
        (cs::TLS13_CHACHA20_POLY1305_SHA256, "TLS13_CHACHA20_POLY1305_SHA256"),
        (cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
        (cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"),
        (cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    ]
}

/// Python's `suite_client.py` against `srv` for one suite: `(version, cipher)` OpenSSL
/// negotiated, after checking every size came back. TLS 1.3 suites are chosen through an
/// OpenSSL configuration file (Python's `ssl` has no call for them).
fn python(srv: &Server, pki: &Pki, ch: &str, version: &str, cipher: &str) -> (String, String) {
    let mut cmd = Command::new("python3");
    cmd.args(["tests/tls/suite_client.py", "127.0.0.1", &srv.addr.port().to_string(), pki.ca.to_str().unwrap(), ch]);
    cmd.arg(version);
    if version == "1.2" {
        cmd.arg(cipher);
    } else {
        let conf = pki.dir.join(format!("openssl-{cipher}.cnf"));
        std::fs::write(
            &conf,
            format!("openssl_conf = c\n[c]\nssl_conf = s\n[s]\nsystem_default = d\n[d]\nCiphersuites = {cipher}\n"),
        )
        .unwrap();
        cmd.env("OPENSSL_CONF", conf);
    }
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("python3 (pip install websockets)");
    let out = wait_child(child, Duration::from_secs(60), "the Python TLS client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "Python {version} {cipher} failed: {text}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        srv.log_tail(20)
    );
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["sizes"], json!([5, 700, 16_384, 40_000]), "Python {version} {cipher}: {v}");
    (v["version"].as_str().unwrap_or("").into(), v["cipher"].as_str().unwrap_or("").into())
}

/// A test PKI and a server using its leaf with `extra` in `[tls]` on `cores` cores (on the
/// driver the environment picks).
fn serve(tag: &str, extra: &str, cores: &str) -> (Pki, Server) {
    let pki = Pki::new(tag);
    let srv = Server::start(&config(&pki.leaf("server"), extra), &["--cores", cores]);
    (pki, srv)
}

#[test]
fn every_cipher_suite_carries_pub_sub_over_wss_with_rustls_and_openssl() {
    let pki = Pki::new("suites");
    let leaf = pki.leaf("server");
    for setup in DRIVERS {
        let srv = drivers::start(setup, &config(&leaf, ""), "2");
        let rt = tokio::runtime::Runtime::new().unwrap();
        for (i, (suite, name)) in suites().into_iter().enumerate() {
            let cfg = only(&pki, suite);
            let got = rt.block_on(async {
                let (mut ws, _) = tapped(srv.addr, &cfg).await;
                assert_eq!(ws.get_ref().get_ref().1.negotiated_cipher_suite(), Some(suite), "{setup:?}");
                let got = round_trip(&mut ws, &format!("r{i}"), &SIZES).await;
                ws.close(None).await.unwrap();
                got
            });
            assert_eq!(got, SIZES, "{setup:?} rustls {name}");
        }
        let openssl = [
            ("1.2", "ECDHE-ECDSA-AES128-GCM-SHA256"),
            ("1.2", "ECDHE-ECDSA-AES256-GCM-SHA384"),
            ("1.2", "ECDHE-ECDSA-CHACHA20-POLY1305"),
            ("1.3", "TLS_AES_128_GCM_SHA256"),
            ("1.3", "TLS_AES_256_GCM_SHA384"),
            ("1.3", "TLS_CHACHA20_POLY1305_SHA256"),
        ];
        for (i, (version, cipher)) in openssl.into_iter().enumerate() {
            let (v, c) = python(&srv, &pki, &format!("p{i}"), version, cipher);
            assert_eq!((v.as_str(), c.as_str()), (if version == "1.2" { "TLSv1.2" } else { "TLSv1.3" }, cipher));
        }
        let m = rt.block_on(tls::metrics(srv.addr, &pki.client()));
        assert_eq!(m.sum("tether_tls_handshake_failures_total", &[]), 0.0, "{setup:?}: no failure");
        assert!(m.sum("tether_tls_handshakes_total", &["version=\"TLSv1.2\""]) >= 6.0, "{setup:?}");
    }
}

#[test]
fn a_client_key_update_is_answered_and_the_connection_keeps_working_both_ways() {
    let (pki, srv) = serve("keyupdate", "", "2");
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (suite, name) in suites().into_iter().take(3) {
        let cfg = only(&pki, suite);
        // A channel per suite: publish ids are deduplicated per channel.
        let ch = format!("ku-{name}");
        rt.block_on(async {
            let (mut ws, server_updates) = tapped(srv.addr, &cfg).await;
            let (mut other, _) = tapped(srv.addr, &cfg).await;
            for ws in [&mut ws, &mut other] {
                ws.send(Message::text(json!({"op":"sub","ch":ch}).to_string())).await.unwrap();
                next_op(ws, "subscribed").await;
            }
            for round in 0..5 {
                // KeyUpdate(update_requested) goes out ahead of the next record.
                ws.get_mut().get_mut().1.refresh_traffic_keys().expect("refresh_traffic_keys");
                let data = "k".repeat(100 + round * 5000);
                ws.send(Message::text(json!({"op":"pub","ch":ch,"id":format!("k{round}"),"data":data}).to_string()))
                    .await
                    .unwrap();
                for w in [&mut ws, &mut other] {
                    let m = next_op(w, "msg").await;
                    assert_eq!(m["data"].as_str().map(str::len), Some(data.len()), "{name} round {round}");
                }
                // The other way: a message published elsewhere reaches the updated connection.
                other
                    .send(Message::text(json!({"op":"pub","ch":ch,"id":format!("o{round}"),"data":"back"}).to_string()))
                    .await
                    .unwrap();
                assert_eq!(next_op(&mut ws, "msg").await["data"], "back", "{name} round {round}");
                next_op(&mut other, "msg").await;
            }
            // Each request was answered with the server's own KeyUpdate.
            assert_eq!(server_updates.load(Ordering::Relaxed), 5, "{name}: the server's KeyUpdates");
            ws.close(None).await.unwrap();
        });
    }
}

#[test]
fn a_corrupted_record_ends_that_connection_with_bad_record_mac_and_no_other() {
    let (pki, srv) = serve("corrupt", "", "1");
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (suite, name) in suites() {
        let cfg = only(&pki, suite);
        // A channel per suite: publish ids are deduplicated per channel.
        let ch = format!("by-{name}");
        let (mut bystander, _) = rt.block_on(tapped(srv.addr, &cfg));
        rt.block_on(async {
            bystander.send(Message::text(json!({"op":"sub","ch":ch}).to_string())).await.unwrap();
            next_op(&mut bystander, "subscribed").await;
        });
        // A blocking rustls client whose first application record gets one bit flipped.
        let mut tcp = std::net::TcpStream::connect(srv.addr).unwrap();
        tcp.set_read_timeout(Some(T)).unwrap();
        let mut c = rustls::ClientConnection::new(cfg.clone(), ServerName::IpAddress(srv.addr.ip().into())).unwrap();
        while c.is_handshaking() {
            c.complete_io(&mut tcp).expect("handshake");
        }
        c.writer().write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut wire = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut wire).unwrap();
        }
        let last = wire.len() - 1;
        wire[last] ^= 0x40;
        tcp.write_all(&wire).unwrap();
        // The server answers with an alert and closes: rustls reports bad_record_mac.
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                Err(e) => panic!("{name}: no close within 10 s ({e}); got {} bytes", seen.len()),
            }
        }
        c.read_tls(&mut &seen[..]).unwrap();
        let err = c.process_new_packets().expect_err("an alert");
        assert_eq!(
            err,
            rustls::Error::AlertReceived(rustls::AlertDescription::BadRecordMac),
            "{name}: the alert the server sent"
        );
        // Another connection on the same core goes on.
        rt.block_on(async {
            bystander
                .send(Message::text(json!({"op":"pub","ch":ch,"id":"b","data":"still"}).to_string()))
                .await
                .unwrap();
            assert_eq!(next_op(&mut bystander, "msg").await["data"], "still", "{name}");
        });
    }
}

#[test]
fn a_lowered_records_per_key_makes_the_server_update_its_key_or_close_tls12() {
    let (pki, srv) = serve("limit", "records_per_key = 8", "2");
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (suite, name) in suites().into_iter().take(3) {
        let cfg = only(&pki, suite);
        rt.block_on(async {
            let (mut ws, server_updates) = tapped(srv.addr, &cfg).await;
            // 40 messages of a record each (and the acks): several keys' worth.
            let sizes = vec![300; 40];
            assert_eq!(round_trip(&mut ws, &format!("lim-{name}"), &sizes).await, sizes, "{name}");
            let n = server_updates.load(Ordering::Relaxed);
            assert!(n >= 5, "{name}: the server updated its key {n} times for 80+ records at 8 per key");
            ws.close(None).await.unwrap();
        });
    }
    // An independent client (OpenSSL) follows the server's KeyUpdates too.
    let (v, _) = python(&srv, &pki, "lim-py", "1.3", "TLS_AES_128_GCM_SHA256");
    assert_eq!(v, "TLSv1.3");
    // TLS 1.2 has no KeyUpdate: the connection ends with close_notify at the limit.
    let cfg = only(&pki, cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256);
    rt.block_on(async {
        let (mut ws, _) = tapped(srv.addr, &cfg).await;
        ws.send(Message::text(r#"{"op":"sub","ch":"lim12"}"#)).await.unwrap();
        let mut msgs = 0;
        // One publish at a time, each answered before the next: a record or two per publish
        // (the server coalesces what one flush writes into one record).
        let end = tokio::time::timeout(T, async {
            for i in 0..20 {
                let publish = json!({"op":"pub","ch":"lim12","id":format!("t{i}"),"data":"x"}).to_string();
                if ws.send(Message::text(publish)).await.is_err() {
                    break;
                }
                loop {
                    match ws.next().await {
                        Some(Ok(Message::Text(t))) if t.as_str().contains("\"msg\"") => {
                            msgs += 1;
                            break;
                        }
                        Some(Ok(_)) => {}
                        // The server ends TLS without a WebSocket close: tungstenite calls that
                        // a reset; rustls would report an EOF without close_notify itself.
                        Some(Err(e)) => return e.to_string(),
                        None => return String::new(),
                    }
                }
            }
            "all 20 messages came".to_string()
        })
        .await
        .expect("the TLS 1.2 connection ends within 10 s");
        assert!(
            msgs < 20 && !end.contains("close_notify"),
            "a clean TLS end (close_notify) after {msgs} messages: {end}"
        );
        assert!(msgs >= 1, "the connection carried messages before its key ran out: {end}");
    });
}
