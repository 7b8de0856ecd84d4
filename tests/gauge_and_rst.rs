//! The connection gauge is exact (docs/operations.md, reaping): it returns to 0 after clients
//! leave by close handshake, by EOF, and by TCP RST; 1,000 RSTs are reaped within 1 s and the
//! server's descriptors return to their baseline.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use serde_json::json;

/// Opens `n` raw upgraded connections subscribed to `ch`, `batch` handshakes at a time.
async fn open_raw(srv: &Server, n: usize, batch: usize, ch: &str) -> Vec<RawWs> {
    let mut all = Vec::with_capacity(n);
    while all.len() < n {
        let k = batch.min(n - all.len());
        let more = futures::future::join_all((0..k).map(|_| async {
            let mut ws = RawWs::connect(srv.addr, "/ws").await;
            ws.subscribe(ch).await;
            ws
        }))
        .await;
        all.extend(more);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauge_returns_to_zero_after_close_eof_and_rst() {
    let _serial = serial().await;
    let srv = Server::start("", &["--cores", "2"]);

    let mut polite = Vec::new();
    for _ in 0..40 {
        let mut ws = tung::connect(&srv.ws_url()).await;
        tung::send(&mut ws, json!({"op": "sub", "ch": "gauge.a"})).await;
        polite.push(ws);
    }
    let rst = open_raw(&srv, 40, 40, "gauge.a").await;
    let eof = open_raw(&srv, 20, 20, "gauge.b").await;
    srv.wait_gauge(100.0, STEP).await;

    // Close handshake.
    for mut ws in polite {
        ws.close(None).await.unwrap();
        // Drive the close handshake to its end.
        while let Ok(Some(Ok(_))) = tokio::time::timeout(STEP, ws.next()).await {}
    }
    srv.wait_gauge(60.0, STEP).await;
    // RST: SO_LINGER 0, then drop.
    for ws in rst {
        set_rst_on_close(&ws.s);
        drop(ws);
    }
    srv.wait_gauge(20.0, Duration::from_secs(2)).await;
    // Plain EOF without a close frame.
    drop(eof);
    srv.wait_gauge(0.0, Duration::from_secs(2)).await;

    // Nothing is left subscribed: a publish reaches no one.
    let before = srv.metric("tether_messages_delivered_total", &[]).await;
    srv.publish("gauge.a", "1").await;
    srv.publish("gauge.b", "2").await;
    assert_eq!(srv.metric("tether_messages_delivered_total", &[]).await, before, "a reaped subscriber got a delivery");
    let m = srv.metrics().await;
    assert!(m.sum("tether_reaped_total", &["reason=\"close\""]) >= 40.0, "close reaps counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_rsts_reaped_within_a_second() {
    let _serial = serial().await;
    let srv = Server::start("", &["--cores", "2"]);
    // Let the process settle, then take the descriptor baseline: the cores are up once the
    // gauge answers, and the feeds thread (its own runtime's descriptors) once `/feeds`
    // answers from loopback (no admin token set), which only it does.
    srv.wait_gauge(0.0, STEP).await;
    let (status, _, body) = http_request(srv.addr, "GET", "/feeds", &[], b"").await;
    assert_eq!(status, 200, "GET /feeds: {}", String::from_utf8_lossy(&body));
    let baseline = srv.fd_count();

    let conns = open_raw(&srv, 1000, 100, "rst.storm").await;
    srv.wait_gauge(1000.0, STEP).await;
    let open_fds = srv.fd_count();
    assert!(open_fds >= 1000, "one descriptor per connection: {open_fds} open, baseline {baseline}");

    let t0 = Instant::now();
    for ws in conns {
        set_rst_on_close(&ws.s);
        drop(ws);
    }
    srv.wait_gauge(0.0, Duration::from_secs(1)).await;
    let reaped_in = t0.elapsed();

    eventually(
        Duration::from_secs(2),
        &format!("the server back to its {baseline} descriptors after the RSTs"),
        || {
            let fds = srv.fd_count();
            std::future::ready(check(fds <= baseline, || fds))
        },
    )
    .await;
    eprintln!("1000 RSTs reaped in {reaped_in:?}");
}
