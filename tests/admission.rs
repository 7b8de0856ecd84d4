//! Admission (docs/operations.md, admission): past `max_connections` the upgrade gets 503 with
//! `Retry-After`; `accept_rate` refuses handshakes over the rate the same way.

mod common;

use common::*;
use tokio::io::AsyncWriteExt;

/// One upgrade attempt: the status and the response head.
async fn try_upgrade(srv: &Server) -> (u16, String, tokio::net::TcpStream) {
    let mut s = connect(srv.addr).await;
    s.write_all(upgrade_request(srv.addr, "/ws", SAMPLE_KEY).as_bytes()).await.unwrap();
    let (status, head, _) = read_head(&mut s).await;
    (status, head, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_past_max_connections_gets_503_with_retry_after() {
    let srv = Server::start("max_connections = 100\n", &["--cores", "2"]);
    let mut held = Vec::new();
    for i in 0..100 {
        let (status, head, s) = try_upgrade(&srv).await;
        assert_eq!(status, 101, "upgrade {} of 100: {head}", i + 1);
        held.push(s);
    }
    srv.wait_gauge(100.0, STEP).await;

    let (status, head, _) = try_upgrade(&srv).await;
    assert_eq!(status, 503, "the 101st upgrade: {head}");
    let retry = header(&head, "retry-after").unwrap_or_else(|| panic!("no Retry-After in {head}"));
    assert!(retry.parse::<u64>().is_ok(), "Retry-After {retry:?} is not delay-seconds");
    assert_eq!(srv.gauge().await, 100.0, "a refused upgrade is not counted");
    srv.wait_metric("tether_handshake_failures_total", &["reason=\"over_capacity\""], STEP, |v| v >= 1.0).await;

    // Plain HTTP is not a connection in this sense: it is still served at capacity.
    assert_eq!(http_request(srv.addr, "GET", "/healthz", &[], b"").await.0, 200);

    // A slot freed is a slot available again.
    drop(held.pop());
    srv.wait_gauge(99.0, STEP).await;
    let (status, head, _s) = try_upgrade(&srv).await;
    assert_eq!(status, 101, "after one left: {head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_over_accept_rate_get_503_with_retry_after() {
    let srv = Server::start("accept_rate = 5\n", &["--cores", "1"]);
    let mut refused = 0;
    let mut held = Vec::new();
    for _ in 0..30 {
        let (status, head, s) = try_upgrade(&srv).await;
        match status {
            101 => held.push(s),
            503 => {
                assert!(header(&head, "retry-after").is_some(), "no Retry-After in {head}");
                refused += 1;
            }
            other => panic!("unexpected status {other}: {head}"),
        }
    }
    assert!(refused > 0, "30 back-to-back upgrades with accept_rate = 5: none refused");
    assert!(!held.is_empty(), "accept_rate = 5 admitted nothing");
    srv.wait_metric("tether_handshake_failures_total", &["reason=\"rate_limited\""], STEP, |v| v >= 1.0).await;
}
