//! `SIGHUP` reloads `[tls]` (docs/configuration.md "TLS", docs/operations.md): with 1,000
//! wss:// connections open, new files and a SIGHUP make new handshakes present the new
//! certificate while every open connection stays and still receives; a key that does not
//! match the certificate at the next reload is refused with a log line naming the key file,
//! and the pair in use stays.

mod common;

use std::time::Duration;

use common::tls::{self, Pki};
use common::*;
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

/// Connections held open across the reloads.
const OPEN: usize = 1_000;

#[test]
fn sighup_swaps_the_certificate_while_1000_connections_stay_open_and_a_wrong_key_keeps_the_old_pair() {
    let pki = Pki::new("reload");
    let (old, new, other) = (pki.leaf("old"), pki.leaf("new"), pki.leaf("other"));
    // The server reads these two paths; the test swaps their contents.
    let live = tls::Leaf { cert: pki.dir.join("live.pem"), key: pki.dir.join("live.key") };
    std::fs::copy(&old.cert, &live.cert).unwrap();
    std::fs::copy(&old.key, &live.key).unwrap();
    let srv = Server::start(&tls::section(&live), &["--cores", "2"]);
    let cfg = pki.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut open = Vec::with_capacity(OPEN);
        for _ in 0..OPEN {
            open.push(tls::wss(srv.addr, &cfg).await);
        }
        let first = tls::connect(srv.addr, &cfg).await;
        assert_eq!(tls::peer_leaf(&first), old.der(), "the old certificate at first");
        drop(first);

        std::fs::copy(&new.cert, &live.cert).unwrap();
        std::fs::copy(&new.key, &live.key).unwrap();
        srv.signal(libc::SIGHUP);
        let want = new.der();
        eventually(Duration::from_secs(10), "new handshakes present the new certificate", || async {
            let s = tls::connect(srv.addr, &cfg).await;
            check(tls::peer_leaf(&s) == want, || "still the old certificate")
        })
        .await;

        // A key of another certificate: refused, the new pair stays.
        std::fs::copy(&other.key, &live.key).unwrap();
        srv.signal(libc::SIGHUP);
        let key_path = live.key.display().to_string();
        eventually(Duration::from_secs(10), "the refused reload logged with the key file", || async {
            let log = String::from_utf8_lossy(&srv.log_bytes()).into_owned();
            check(log.contains("TLS reload refused") && log.contains(&key_path), || "no such log line yet")
        })
        .await;
        let s = tls::connect(srv.addr, &cfg).await;
        assert_eq!(tls::peer_leaf(&s), want, "the pair in use stays after a refused reload");
        // An unreadable certificate file: refused too, naming it.
        std::fs::remove_file(&live.cert).unwrap();
        srv.signal(libc::SIGHUP);
        let cert_path = live.cert.display().to_string();
        eventually(Duration::from_secs(10), "the unreadable certificate logged", || async {
            let log = String::from_utf8_lossy(&srv.log_bytes()).into_owned();
            check(log.matches("TLS reload refused").count() == 2 && log.contains(&cert_path), || "not yet")
        })
        .await;
        let m = tls::metrics(srv.addr, &cfg).await;
        assert_eq!(m.sum("tether_tls_reloads_total", &["result=\"ok\""]), 1.0);
        assert_eq!(m.sum("tether_tls_reloads_total", &["result=\"failed\""]), 2.0);
        assert_eq!(m.sum("tether_connections", &[]), OPEN as f64, "every wss:// connection stayed open");

        // Every connection that lived through the reloads still works: each answers a ping,
        // and a publish reaches all of them.
        for ws in open.iter_mut() {
            ws.send(Message::text(r#"{"op":"sub","ch":"reload"}"#)).await.unwrap();
        }
        for (i, ws) in open.iter_mut().enumerate() {
            let m = next_text(ws).await;
            assert!(m.contains("\"subscribed\""), "connection {i}: {m}");
        }
        let answer = tls::https(srv.addr, &cfg, "POST", "/publish/reload", "{\"after\":\"reload\"}").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        for (i, ws) in open.iter_mut().enumerate() {
            let m = next_text(ws).await;
            assert!(m.contains("\"after\":\"reload\""), "connection {i}: {m}");
        }
    });
}

async fn next_text(ws: &mut tls::Wss) -> String {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a frame within 10 s")
            .expect("open")
            .expect("frame");
        if let Message::Text(t) = m {
            return t.as_str().to_owned();
        }
    }
}
