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

/// A burst that waits in the listener's backlog all at once (the accept loop takes up to 64
/// per completion with `accept4`, src/server/listen.rs) is accepted in full and every
/// connection is upgraded, on one core: none lost, none accepted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_queued_in_the_backlog_is_accepted_and_upgraded_in_full() {
    const N: usize = 300;
    let srv = Server::start("", &["--cores", "1"]);
    // All connected before any request is sent: the kernel completes the TCP handshakes into
    // the backlog, so the accept loop finds a queue of them.
    let conns = futures::future::join_all((0..N).map(|_| connect(srv.addr))).await;
    let upgrades = conns.into_iter().enumerate().map(|(i, mut s)| async move {
        s.write_all(upgrade_request(srv.addr, "/ws", SAMPLE_KEY).as_bytes()).await.unwrap();
        let (status, head, _) = read_head(&mut s).await;
        assert_eq!(status, 101, "connection {i} of the burst: {head}");
        assert_eq!(header(&head, "sec-websocket-accept"), Some(SAMPLE_ACCEPT), "connection {i}: {head}");
        s
    });
    let held = futures::future::join_all(upgrades).await;
    srv.wait_gauge(N as f64, STEP).await;
    let accepted = srv.metric("tether_accepted_total", &[]).await;
    // The burst, plus the metric scrapes' own connections so far.
    assert!(
        accepted >= N as f64 && accepted <= N as f64 + 10.0,
        "tether_accepted_total {accepted} after a burst of {N}"
    );
    drop(held);
    srv.wait_gauge(0.0, STEP).await;
}
