//! The record layer against rustls itself: a rustls client (its own record layer) and an
//! unbuffered rustls server make the handshake in memory, the server's keys are handed to
//! [`Layer`], and records go both ways for every suite tether serves: sealed here and opened
//! by rustls, sealed by rustls and opened here, across KeyUpdates either side starts, with
//! close_notify, a corrupted record and an oversized one.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use rustls::client::ClientConnection;
use rustls::crypto::{ring as provider, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::SupportedCipherSuite;

use super::*;

/// A CA and a leaf for `localhost` made with the `openssl` CLI (as tests/common/tls.rs does),
/// in a fresh directory: the server configuration and the CA's DER.
fn pki(tag: &str) -> (Arc<rustls::ServerConfig>, CertificateDer<'static>) {
    let dir = std::env::temp_dir().join(format!("tether-record-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = |args: &str| {
        let out = Command::new("openssl").args(args.split(' ')).current_dir(&dir).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    run(&format!("req -x509 {ec} -keyout ca.key -out ca.pem -subj /CN=ca -days 1"));
    run(&format!("req {ec} -keyout leaf.key -out leaf.csr -subj /CN=localhost"));
    std::fs::write(dir.join("ext"), "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n").unwrap();
    run("x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem -days 1 -extfile ext");
    let p = Arc::new(provider::default_provider());
    let pair = crate::server::tls::keys::load_pair(&dir.join("leaf.pem"), &dir.join("leaf.key"), &p).unwrap();
    let ca = CertificateDer::from_pem_file(dir.join("ca.pem")).unwrap();
    let _ = std::fs::remove_dir_all(Path::new(&dir));
    (crate::server::tls::keys::server_config(pair, p), ca)
}

/// A rustls client offering only `suite` (and its version).
fn client(suite: SupportedCipherSuite, ca: &CertificateDer<'static>) -> ClientConnection {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let p = CryptoProvider { cipher_suites: vec![suite], ..provider::default_provider() };
    let version = match suite {
        SupportedCipherSuite::Tls12(_) => &rustls::version::TLS12,
        SupportedCipherSuite::Tls13(_) => &rustls::version::TLS13,
    };
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(p))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    ClientConnection::new(Arc::new(cfg), ServerName::try_from("localhost").unwrap()).unwrap()
}

/// Makes the handshake between `c` and `s` in memory, up to the server's `WriteTraffic` with
/// the handshake done (everything it encoded delivered to the client).
fn handshake(c: &mut ClientConnection, s: &mut UnbufferedServerConnection) {
    let mut inbox = Vec::new();
    for _ in 0..20 {
        while c.wants_write() {
            c.write_tls(&mut inbox).unwrap();
        }
        let mut outbox = Vec::new();
        let mut used = 0;
        let done = loop {
            let UnbufferedStatus { discard, state } = s.process_tls_records(&mut inbox[used..]);
            let stop = match state.expect("server handshake") {
                ConnectionState::EncodeTlsData(mut e) => {
                    let mut buf = vec![0u8; 16384];
                    match e.encode(&mut buf) {
                        Ok(n) => outbox.extend_from_slice(&buf[..n]),
                        Err(EncodeError::InsufficientSize(_) | EncodeError::AlreadyEncoded) => panic!("encode"),
                    }
                    None
                }
                ConnectionState::TransmitTlsData(x) => {
                    x.done();
                    None
                }
                ConnectionState::WriteTraffic(_) => Some(true),
                ConnectionState::BlockedHandshake => Some(false),
                other => panic!("server state {other:?}"),
            };
            used += discard;
            if let Some(stop) = stop {
                break stop && !s.is_handshaking();
            }
        };
        inbox.drain(..used);
        c.read_tls(&mut &outbox[..]).unwrap();
        c.process_new_packets().expect("client handshake");
        if done {
            assert!(!c.is_handshaking());
            return;
        }
    }
    panic!("no handshake in 20 rounds");
}

/// Everything the client reads from `wire` (its plaintext drained as it goes: rustls holds
/// little of it at once).
fn client_reads(c: &mut ClientConnection, wire: &[u8]) -> Vec<u8> {
    let mut wire = wire;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if !wire.is_empty() {
            c.read_tls(&mut wire).unwrap();
        }
        c.process_new_packets().expect("client opens what the layer sealed");
        loop {
            match c.reader().read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("client read: {e}"),
            }
        }
        if wire.is_empty() {
            return got;
        }
    }
}

/// The records rustls seals for `data` from the client.
fn client_sends(c: &mut ClientConnection, data: &[u8]) -> Vec<u8> {
    c.writer().write_all(data).unwrap();
    let mut wire = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut wire).unwrap();
    }
    wire
}

/// Opens every record of `wire` with `l`; returns the application data and what was handled.
fn layer_reads(l: &mut Layer, wire: &mut [u8], reply: &mut Vec<u8>) -> Result<(Vec<u8>, usize), Fatal> {
    let mut x = Expanded::default();
    let (mut data, mut handled, mut used) = (Vec::new(), 0, 0);
    while let Some(len) = l.record_len(&wire[used..])? {
        match l.open(&mut x, &mut wire[used..used + len], reply)? {
            Inbound::Data(p) => data.extend_from_slice(p),
            Inbound::Handled => handled += 1,
            Inbound::Closed => panic!("close_notify"),
        }
        used += len;
    }
    assert_eq!(used, wire.len(), "a partial record left");
    Ok((data, handled))
}

/// Seals `data` as application data records (2^14 bytes each at most) with `l`.
fn layer_seals(l: &mut Layer, data: &[u8]) -> Vec<u8> {
    let mut x = Expanded::default();
    let mut out = Vec::new();
    for chunk in data.chunks(MAX_PLAIN) {
        if l.exhausted() {
            let start = out.len();
            out.resize(start + KEY_UPDATE_RECORD, 0);
            let n = l.update_tx(&mut x, &mut out[start..]).unwrap();
            out.truncate(start + n);
        }
        l.seal_message(&mut x, APPLICATION_DATA, chunk, &mut out).unwrap();
    }
    out
}

fn suites() -> Vec<(SupportedCipherSuite, Aead)> {
    use provider::cipher_suite::*;
    vec![
        (TLS13_AES_128_GCM_SHA256, Aead::Aes128Gcm),
        (TLS13_AES_256_GCM_SHA384, Aead::Aes256Gcm),
        (TLS13_CHACHA20_POLY1305_SHA256, Aead::Chacha20Poly1305),
        (TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, Aead::Aes128Gcm),
        (TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, Aead::Aes256Gcm),
        (TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, Aead::Chacha20Poly1305),
    ]
}

/// A connected pair for `suite`: the rustls client and the server's keys in a [`Layer`].
fn pair(
    cfg: &Arc<rustls::ServerConfig>,
    ca: &CertificateDer<'static>,
    suite: SupportedCipherSuite,
    limit: Option<u64>,
) -> (ClientConnection, Layer) {
    let mut c = client(suite, ca);
    let mut s = UnbufferedServerConnection::new(cfg.clone()).unwrap();
    handshake(&mut c, &mut s);
    (c, Layer::take(s, limit).expect("keys handed over"))
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

#[test]
fn every_suite_round_trips_with_rustls_both_ways() {
    let (cfg, ca) = pki("both");
    for (suite, aead) in suites() {
        let (mut c, mut l) = pair(&cfg, &ca, suite, None);
        assert_eq!(l.aead(), aead, "{suite:?}");
        assert_eq!(l.tls13(), matches!(suite, SupportedCipherSuite::Tls13(_)), "{suite:?}");
        for n in [1, 120, 1000, MAX_PLAIN, MAX_PLAIN + 1, 40_000] {
            let data = payload(n);
            // Sealed here, opened by rustls.
            let wire = layer_seals(&mut l, &data);
            assert_eq!(client_reads(&mut c, &wire), data, "{suite:?}: {n} bytes to the client");
            // Sealed by rustls, opened here.
            let mut wire = client_sends(&mut c, &data);
            let mut reply = Vec::new();
            let (got, _) = layer_reads(&mut l, &mut wire, &mut reply).unwrap();
            assert_eq!(got, data, "{suite:?}: {n} bytes from the client");
            assert!(reply.is_empty(), "{suite:?}: nothing to answer");
        }
        // close_notify sealed here is the client's end of input.
        let mut out = Vec::new();
        l.alert(&mut Expanded::default(), alert::CLOSE_NOTIFY, false, &mut out).unwrap();
        c.read_tls(&mut &out[..]).unwrap();
        let st = c.process_new_packets().unwrap();
        assert!(st.peer_has_closed(), "{suite:?}: close_notify seen");
    }
}

#[test]
fn a_client_key_update_is_followed_and_answered_in_tls13() {
    let (cfg, ca) = pki("ku");
    for (suite, _) in suites().into_iter().filter(|(s, _)| matches!(s, SupportedCipherSuite::Tls13(_))) {
        let (mut c, mut l) = pair(&cfg, &ca, suite, None);
        for round in 0..3 {
            // rustls sends KeyUpdate(update_requested), then data under its next key.
            c.refresh_traffic_keys().unwrap();
            let data = payload(3000 + round);
            let mut wire = client_sends(&mut c, &data);
            let mut reply = Vec::new();
            let (got, handled) = layer_reads(&mut l, &mut wire, &mut reply).unwrap();
            assert_eq!((got, handled), (data.clone(), 1), "{suite:?} round {round}");
            assert_eq!(reply.len(), KEY_UPDATE_RECORD, "{suite:?}: our KeyUpdate in answer");
            assert_eq!(l.tx.seq, 0, "{suite:?}: the next transmit key");
            // Our KeyUpdate, then data under our next key: rustls follows both.
            reply.extend_from_slice(&layer_seals(&mut l, &data));
            assert_eq!(client_reads(&mut c, &reply), data, "{suite:?} round {round}");
        }
    }
}

#[test]
fn the_transmit_key_changes_at_its_limit_and_rustls_follows() {
    let (cfg, ca) = pki("limit");
    for (suite, _) in suites().into_iter().filter(|(s, _)| matches!(s, SupportedCipherSuite::Tls13(_))) {
        let (mut c, mut l) = pair(&cfg, &ca, suite, Some(4));
        // 20 records under a limit of 4 per key: several KeyUpdates on the way.
        let data = payload(20 * 1000);
        let mut wire = Vec::new();
        for chunk in data.chunks(1000) {
            wire.extend_from_slice(&layer_seals(&mut l, chunk));
            assert!(l.tx.seq < 4, "{suite:?}: never past the limit");
        }
        assert_eq!(client_reads(&mut c, &wire), data, "{suite:?}");
    }
    // TLS 1.2 has no KeyUpdate: the key is spent (the send path closes the connection).
    let suite = provider::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256;
    let (_, mut l) = pair(&cfg, &ca, suite, Some(3));
    let mut out = Vec::new();
    while !l.exhausted() {
        l.seal_message(&mut Expanded::default(), APPLICATION_DATA, b"x", &mut out).unwrap();
    }
    assert_eq!(l.tx.seq, 2);
    assert!(l.update_tx(&mut Expanded::default(), &mut [0u8; 64]).is_err(), "no KeyUpdate in TLS 1.2");
}

#[test]
fn a_corrupted_or_oversized_record_is_fatal_with_its_alert() {
    let (cfg, ca) = pki("bad");
    for (suite, _) in suites() {
        let (mut c, mut l) = pair(&cfg, &ca, suite, None);
        let mut wire = client_sends(&mut c, b"hello");
        let last = wire.len() - 1;
        wire[last] ^= 1;
        let err = layer_reads(&mut l, &mut wire, &mut Vec::new()).unwrap_err();
        assert_eq!(err.alert, Some(alert::BAD_RECORD_MAC), "{suite:?}");
        let [hi, lo] = ((MAX_PLAIN + 2049) as u16).to_be_bytes();
        let big = [APPLICATION_DATA, 3, 3, hi, lo];
        assert_eq!(l.record_len(&big).unwrap_err().alert, Some(alert::RECORD_OVERFLOW), "{suite:?}");
    }
}

/// The peer's side of `l`: its keys with the directions swapped, sealing what `l` opens (the
/// records a client would send, whatever rustls' client would or would not send itself).
fn mirror(l: &Layer) -> Layer {
    let swap = |d: &Direction| Direction { key: d.key, iv: d.iv, seq: d.seq };
    Layer { tx: swap(&l.rx), rx: swap(&l.tx), kernel: None, ..*l }
}

/// `l` opens one record `peer` seals of type `typ` with `body`; the reply it made.
fn peer_sends(l: &mut Layer, peer: &mut Layer, typ: u8, body: &[u8]) -> (Result<bool, Fatal>, Vec<u8>) {
    let mut wire = Vec::new();
    peer.seal_message(&mut Expanded::default(), typ, body, &mut wire).unwrap();
    let mut reply = Vec::new();
    let r = l.open(&mut Expanded::default(), &mut wire, &mut reply).map(|i| i == Inbound::Handled);
    (r, reply)
}

#[test]
fn alerts_and_post_handshake_messages_are_handled_as_rustls_does() {
    let (cfg, ca) = pki("edges");
    let suites = suites();
    let (_, mut l) = pair(&cfg, &ca, suites[3].0, None);
    let mut peer = mirror(&l);
    // TLS 1.2 renegotiation: a no_renegotiation warning the first time, the end the second.
    let (r, mut reply) = peer_sends(&mut l, &mut peer, HANDSHAKE, &[CLIENT_HELLO, 0, 0, 0]);
    assert_eq!(r, Ok(true));
    let len = reply.len();
    match peer.open(&mut Expanded::default(), &mut reply[..len], &mut Vec::new()) {
        Err(f) => panic!("the reply does not open: {f:?}"),
        Ok(i) => assert_eq!(i, Inbound::Handled, "a tolerated warning"),
    }
    let (r, _) = peer_sends(&mut l, &mut peer, HANDSHAKE, &[CLIENT_HELLO, 0, 0, 0]);
    assert_eq!(r.unwrap_err().alert, Some(alert::UNEXPECTED_MESSAGE));
    // Four warnings are tolerated in TLS 1.2, not a fifth.
    let (_, mut l) = pair(&cfg, &ca, suites[5].0, None);
    let mut peer = mirror(&l);
    for _ in 0..4 {
        assert_eq!(peer_sends(&mut l, &mut peer, ALERT, &[WARNING, 42]).0, Ok(true));
    }
    assert_eq!(
        peer_sends(&mut l, &mut peer, ALERT, &[WARNING, 42]).0.unwrap_err().alert,
        Some(alert::UNEXPECTED_MESSAGE)
    );
    // TLS 1.3: user_canceled is tolerated, any other warning is fatal; close_notify is the
    // end of input; a fatal alert is answered with nothing.
    let fresh = || {
        let (_, l) = pair(&cfg, &ca, suites[0].0, None);
        let peer = mirror(&l);
        (l, peer)
    };
    let (mut l, mut peer) = fresh();
    assert_eq!(peer_sends(&mut l, &mut peer, ALERT, &[WARNING, alert::USER_CANCELED]).0, Ok(true));
    assert_eq!(peer_sends(&mut l, &mut peer, ALERT, &[WARNING, alert::CLOSE_NOTIFY]).0, Ok(false));
    assert_eq!(peer_sends(&mut l, &mut peer, ALERT, &[WARNING, 42]).0.unwrap_err().alert, Some(alert::DECODE_ERROR));
    let (mut l, mut peer) = fresh();
    assert_eq!(peer_sends(&mut l, &mut peer, ALERT, &[FATAL, 40]).0.unwrap_err().alert, None);
    // TLS 1.3 post-handshake messages: a KeyUpdate's request_update must be 0 or 1 and the
    // message must end its record; nothing else is accepted; a record must have a type.
    let cases: [(&[u8], u8, u8); 5] = [
        (&[KEY_UPDATE, 0, 0, 1, 2], HANDSHAKE, alert::ILLEGAL_PARAMETER),
        (&[KEY_UPDATE, 0, 0, 1, 0, 1], HANDSHAKE, alert::UNEXPECTED_MESSAGE),
        (&[KEY_UPDATE, 0, 0, 2, 0], HANDSHAKE, alert::DECODE_ERROR),
        (&[4, 0, 0, 1, 0], HANDSHAKE, alert::UNEXPECTED_MESSAGE),
        (&[], 0, alert::UNEXPECTED_MESSAGE),
    ];
    for (body, typ, want) in cases {
        let (mut l, mut peer) = fresh();
        assert_eq!(peer_sends(&mut l, &mut peer, typ, body).0.unwrap_err().alert, Some(want), "{body:?}");
    }
}
