//! Loopback trust is not browser trust (docs/security.md, "The admin endpoints"): a web page
//! on the operator's machine reaches `127.0.0.1` as a loopback peer, so
//! - a state-changing admin request with a foreign `Origin` or a cross-site / same-site
//!   `Sec-Fetch-Site` is refused with 403, with or without `admin.token`, and changes nothing;
//! - without a token, every admin endpoint refuses (421) a `Host` that does not name this
//!   server by a loopback name or address (DNS rebinding), and answers one that does.
//!
//! Real server, a real upstream feed, raw HTTP/1.1 over real sockets.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::feeds::node_config;
use common::upstream::Upstream;
use common::{connect, read_head, Server};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "admin-token-0123456789";

/// One request with exactly the head lines given (the caller writes `Host`); the status and
/// the body read to the close.
async fn raw(addr: SocketAddr, method: &str, path: &str, lines: &[String], body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = connect(addr).await;
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for l in lines {
        req.push_str(l);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let (status, _, mut rest) = read_head(&mut s).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await.expect("body timed out");
    (status, rest)
}

fn host(addr: SocketAddr) -> String {
    format!("Host: {addr}")
}

/// The feed's `desired_state`, read with credentials that pass.
async fn desired(addr: SocketAddr, auth: &[String], id: &str) -> String {
    let mut lines = vec![host(addr)];
    lines.extend_from_slice(auth);
    let (status, body) = raw(addr, "GET", &format!("/feeds/{id}"), &lines, b"").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    v["desired_state"].as_str().unwrap().to_owned()
}

/// The browser-made requests that must change nothing: (header lines, what they are).
fn foreign(addr: SocketAddr) -> Vec<(Vec<String>, &'static str)> {
    let own = format!("Origin: http://{addr}");
    vec![
        (vec!["Origin: https://evil.example".into(), "Content-Type: text/plain".into()], "foreign Origin"),
        (vec!["Origin: null".into()], "opaque Origin"),
        (vec![format!("Origin: http://127.0.0.1:{}", addr.port() + 1)], "another port is another origin"),
        (vec!["Origin: http://localhost".into()], "localhost without the port"),
        (vec![own.clone(), "Origin: https://evil.example".into()], "a repeated Origin"),
        (vec!["Sec-Fetch-Site: cross-site".into()], "cross-site"),
        (vec!["Sec-Fetch-Site: same-site".into()], "same-site (another port of localhost)"),
        (vec![own, "Sec-Fetch-Site: cross-site".into()], "own Origin but cross-site"),
    ]
}

async fn refuses_browser_writes(addr: SocketAddr, auth: Vec<String>, up: &Upstream) {
    let mut lines = vec![host(addr)];
    lines.extend_from_slice(&auth);
    let def = format!("{{\"url\":\"{}\",\"channel\":\"feed.btc\",\"seq_pointer\":\"/seq\"}}", up.url("btc"));
    let (status, body) = raw(addr, "PUT", "/feeds/btc", &lines, def.as_bytes()).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert_eq!(desired(addr, &auth, "btc").await, "STARTED");
    for (extra, what) in foreign(addr) {
        for (method, path, body) in [
            ("POST", "/feeds/btc/stop", &b"x"[..]),
            ("DELETE", "/feeds/btc", b""),
            (
                "PUT",
                "/feeds/btc",
                format!("{{\"url\":\"{}\",\"channel\":\"x\",\"seq_pointer\":\"/s\"}}", up.url("btc")).as_bytes(),
            ),
        ] {
            let mut lines = vec![host(addr)];
            lines.extend(auth.iter().cloned());
            lines.extend(extra.iter().cloned());
            let (status, body) = raw(addr, method, path, &lines, body).await;
            assert_eq!(status, 403, "{method} {path} with {what}: {}", String::from_utf8_lossy(&body));
        }
        assert_eq!(desired(addr, &auth, "btc").await, "STARTED", "{what} changed the feed");
    }
    // The server's own origin (the status page's), a listed one, and a non-browser client pass.
    for extra in [
        vec![format!("Origin: http://{addr}"), "Sec-Fetch-Site: same-origin".into()],
        vec!["Origin: https://ops.example".into()],
        vec![],
    ] {
        let mut lines = vec![host(addr)];
        lines.extend(auth.iter().cloned());
        lines.extend(extra.iter().cloned());
        let (status, body) = raw(addr, "POST", "/feeds/btc/stop", &lines, b"").await;
        assert_eq!(status, 200, "{extra:?}: {}", String::from_utf8_lossy(&body));
        assert_eq!(desired(addr, &auth, "btc").await, "STOPPED");
        let (status, _) = raw(addr, "POST", "/feeds/btc/start", &lines, b"").await;
        assert_eq!(status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_writes_are_refused_without_a_token() {
    let up = Upstream::start(Duration::from_millis(50), None).await;
    let cfg = format!("allowed_origins = [\"https://ops.example\"]\n{}", node_config("", "memory", &up, &[]));
    let node = Server::start(&cfg, &["--cores", "1"]);
    refuses_browser_writes(node.addr, vec![], &up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_writes_are_refused_with_a_token() {
    let up = Upstream::start(Duration::from_millis(50), None).await;
    let cfg = format!(
        "allowed_origins = [\"https://ops.example\"]\n{}[admin]\ntoken = \"{TOKEN}\"\n",
        node_config("", "memory", &up, &[])
    );
    let node = Server::start(&cfg, &["--cores", "1"]);
    refuses_browser_writes(node.addr, vec![format!("Authorization: Bearer {TOKEN}")], &up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_every_admin_endpoint_needs_a_loopback_host() {
    let up = Upstream::start(Duration::from_millis(50), None).await;
    let node = Server::start(&node_config("", "memory", &up, &[]), &["--cores", "1"]);
    let addr = node.addr;
    let port = addr.port();
    // (endpoint, its answer once the guard passes): `/feeds/nope` is a 404 from behind it.
    let endpoints =
        [("/connections", 200), ("/status", 200), ("/status.json", 200), ("/feeds", 200), ("/feeds/nope", 404)];
    for (path, passed) in endpoints {
        for bad in [
            "rebind.attacker.example".to_owned(),
            format!("rebind.attacker.example:{port}"),
            format!("localhost.attacker.example:{port}"),
            format!("127.0.0.1.nip.io:{port}"),
            format!("2130706433:{port}"),
        ] {
            let (status, body) = raw(addr, "GET", path, &[format!("Host: {bad}")], b"").await;
            assert_eq!(status, 421, "GET {path} Host {bad}: {}", String::from_utf8_lossy(&body));
            assert!(!String::from_utf8_lossy(&body).contains("127.0.0.1:"), "{path} leaked addresses");
        }
        for good in [format!("127.0.0.1:{port}"), format!("localhost:{port}"), "localhost".into(), "127.0.0.1".into()] {
            let (status, body) = raw(addr, "GET", path, &[format!("Host: {good}")], b"").await;
            assert_eq!(status, passed, "GET {path} Host {good}: {}", String::from_utf8_lossy(&body));
        }
    }
    // Open endpoints stay open to any Host.
    for path in ["/healthz", "/metrics"] {
        let (status, _) = raw(addr, "GET", path, &["Host: rebind.attacker.example".into()], b"").await;
        assert_eq!(status, 200, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_protected_metrics_take_any_host_but_not_browser_writes() {
    let up = Upstream::start(Duration::from_millis(50), None).await;
    let cfg = format!("{}[admin]\ntoken = \"{TOKEN}\"\nprotect_metrics = true\n", node_config("", "memory", &up, &[]));
    let node = Server::start(&cfg, &["--cores", "1"]);
    let auth = format!("Authorization: Bearer {TOKEN}");
    for path in ["/metrics", "/connections", "/status.json", "/feeds"] {
        // The token is the credential: a rebinding page does not have it.
        let (status, _) =
            raw(node.addr, "GET", path, &["Host: tether.internal.example".into(), auth.clone()], b"").await;
        assert_eq!(status, 200, "{path}");
        let (status, _) = raw(node.addr, "GET", path, &["Host: tether.internal.example".into()], b"").await;
        assert_eq!(status, 401, "{path} without the token");
    }
    let lines = vec!["Host: tether.internal.example".into(), auth, "Origin: https://evil.example".into()];
    let (status, _) = raw(node.addr, "POST", "/feeds/btc/stop", &lines, b"").await;
    assert_eq!(status, 403);
}
