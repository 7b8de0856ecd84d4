//! `allowed_origins`: browsers from a listed origin upgrade (compared as RFC 6454 origins:
//! scheme and host ignore case, the default port is implied), others get 403, and clients
//! that send no `Origin` (non-browser) are admitted.

mod common;

use common::*;
use tokio::io::AsyncWriteExt;

async fn upgrade_status(srv: &Server, origin: Option<&str>) -> u16 {
    let mut s = connect(srv.addr).await;
    let mut req = upgrade_request(srv.addr, "/ws", SAMPLE_KEY);
    if let Some(o) = origin {
        // Insert the header before the blank line that ends the head.
        req.truncate(req.len() - 2);
        req.push_str(&format!("Origin: {o}\r\n\r\n"));
    }
    s.write_all(req.as_bytes()).await.unwrap();
    read_head(&mut s).await.0
}

#[tokio::test]
async fn origin_allow_list_is_enforced_on_upgrades() {
    let srv = Server::start("allowed_origins = [\"https://app.example.com\"]\n", &["--cores", "1"]);
    assert_eq!(upgrade_status(&srv, Some("https://app.example.com")).await, 101);
    assert_eq!(upgrade_status(&srv, Some("HTTPS://App.Example.com:443")).await, 101, "same origin, other spelling");
    assert_eq!(upgrade_status(&srv, None).await, 101, "no Origin: a non-browser client");
    assert_eq!(upgrade_status(&srv, Some("https://evil.example")).await, 403);
    assert_eq!(upgrade_status(&srv, Some("https://app.example.com:8443")).await, 403, "another port is another origin");
    assert_eq!(srv.metric("tether_handshake_failures_total", &["reason=\"origin\""]).await, 2.0);
}
