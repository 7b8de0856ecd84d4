//! The HTTP API's credentials (docs/security.md): `auth.publish_keys` guard
//! `POST /publish/{ch}`; `admin.token` guards `/connections` (and `/metrics` with
//! `admin.protect_metrics`); without a token `/connections` is served only to local peers.
//! `/healthz` and `/readyz` stay open. Real server, raw HTTP/1.1 over real sockets.

mod common;

use std::net::SocketAddr;

use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpSocket;

const KEY: &str = "pk-3f9a1c77e2b04d5a";
const ADMIN: &str = "adm-8d2e61b0c4f7a935";

/// `GET path` on a fresh connection whose source address is `from`, with optional bearer;
/// the status, the head and what came with it.
async fn get_from(from: &str, addr: SocketAddr, path: &str, bearer: Option<&str>) -> (u16, String, Vec<u8>) {
    request_from(from, "GET", addr, path, bearer).await
}

async fn request_from(
    from: &str,
    method: &str,
    addr: SocketAddr,
    path: &str,
    bearer: Option<&str>,
) -> (u16, String, Vec<u8>) {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut s = tokio::time::timeout(STEP, sock.connect(addr)).await.expect("connect timed out").unwrap();
    let auth = bearer.map(|b| format!("Authorization: Bearer {b}\r\n")).unwrap_or_default();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let (status, head, body) = read_head(&mut s).await;
    (status, head, body)
}

#[tokio::test]
async fn publish_keys_guard_http_publish() {
    let srv = Server::start(&format!("[auth]\npublish_keys = [\"{KEY}\"]\n"), &["--cores", "1"]);
    let wrong = format!("Bearer {KEY}x");
    let right = format!("Bearer {KEY}");
    let (status, head, body) = http_request(srv.addr, "POST", "/publish/news", &[], b"{\"a\":1}").await;
    assert_eq!(status, 401, "no key: {}", String::from_utf8_lossy(&body));
    assert_eq!(header(&head, "www-authenticate"), Some("Bearer realm=\"tether\""));
    let (status, head, _) =
        http_request(srv.addr, "POST", "/publish/news", &[("Authorization", &wrong)], b"{\"a\":1}").await;
    assert_eq!(status, 401, "wrong key");
    assert!(header(&head, "www-authenticate").is_some_and(|v| v.contains("invalid_token")), "{head}");
    let (status, _, _) =
        http_request(srv.addr, "POST", "/publish/news", &[("Authorization", "Basic a2V5")], b"1").await;
    assert_eq!(status, 401, "another scheme is no key");
    let (status, _, body) =
        http_request(srv.addr, "POST", "/publish/news", &[("Authorization", &right)], b"{\"a\":1}").await;
    assert_eq!((status, seq_of_reply(&body)), (200, 1), "right key");

    // A refused publish on a keep-alive connection leaves it usable for the next request, and
    // nothing refused was published: the next accepted publish is seq 2.
    let mut c = HttpConn::new(srv.addr).await;
    let (status, _) = c.post("/publish/news", &[], b"2").await;
    assert_eq!(status, 401);
    let (status, body) = c.post("/publish/news", &[("Authorization", &right)], b"3").await;
    assert_eq!((status, seq_of_reply(&body)), (200, 2));
    assert_eq!(srv.metric("tether_http_auth_failures_total", &["endpoint=\"publish\""]).await, 4.0);
}

#[tokio::test]
async fn connections_without_admin_token_only_for_local_peers() {
    // Only 127.0.0.1 counts as local: a client bound to 127.0.0.2 stands for a remote peer.
    let srv = Server::start("[admin]\nlocal_peers = [\"127.0.0.1\"]\n", &["--cores", "1"]);
    let (status, _, _) = get_from("127.0.0.2", srv.addr, "/connections", None).await;
    assert_eq!(status, 401, "a non-local peer without a token");
    let (status, _, _) = get_from("127.0.0.2", srv.addr, "/connections", Some(ADMIN)).await;
    assert_eq!(status, 401, "no token is configured, so none can be right");
    let (status, _, _) = get_from("127.0.0.1", srv.addr, "/connections", None).await;
    assert_eq!(status, 200, "a local peer");
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(get_from("127.0.0.2", srv.addr, open, None).await.0, 200, "{open} stays open");
    }
    assert_eq!(srv.metric("tether_http_auth_failures_total", &["endpoint=\"admin\""]).await, 2.0);
}

#[tokio::test]
async fn admin_token_guards_connections_and_optionally_metrics() {
    let srv = Server::start(&format!("[admin]\ntoken = \"{ADMIN}\"\nprotect_metrics = true\n"), &["--cores", "1"]);
    for path in ["/connections", "/metrics"] {
        assert_eq!(get_from("127.0.0.1", srv.addr, path, None).await.0, 401, "{path}: loopback needs the token too");
        assert_eq!(get_from("127.0.0.1", srv.addr, path, Some("adm-8d2e61b0c4f7a936")).await.0, 401, "{path}");
        assert_eq!(get_from("127.0.0.2", srv.addr, path, Some(ADMIN)).await.0, 200, "{path} with the token");
    }
    for open in ["/healthz", "/readyz"] {
        assert_eq!(get_from("127.0.0.2", srv.addr, open, None).await.0, 200, "{open} stays open");
    }
    // HEAD is guarded like GET.
    assert_eq!(request_from("127.0.0.1", "HEAD", srv.addr, "/connections", None).await.0, 401);
    assert_eq!(request_from("127.0.0.1", "HEAD", srv.addr, "/connections", Some(ADMIN)).await.0, 200);
}

#[test]
fn refused_configs_name_the_key() {
    for (toml, key) in [
        ("[auth]\npublish_keys = [\"short\"]\n", "auth.publish_keys[0]"),
        ("[admin]\ntoken = \"has space in it 0123\"\n", "admin.token"),
        ("[admin]\nprotect_metrics = true\n", "admin.protect_metrics"),
        ("[admin]\nlocal_peers = [\"localhost\"]\n", "admin.local_peers"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config", "/dev/stdin"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(toml.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{toml}: {err}");
        assert!(err.contains(key), "{toml}: error should name {key}: {err}");
    }
}
