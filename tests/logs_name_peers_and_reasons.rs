//! What the server logs (docs/operations.md, "Logs"): at `debug`, handshake failures and reaps with the
//! reason and the peer address; at `info`, the config in effect, overflow closes and drain
//! progress; floods are rate-limited with a summary of what was suppressed; an invalid
//! `TETHER_LOG` is reported and logging falls back to `info`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::AsyncWriteExt;

/// Polls the server log until `pred` holds; panics after `limit` with the log tail.
fn wait_log(srv: &Server, what: &str, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
    eventually_sync(limit, &format!("{what} in the log"), || {
        let log = srv.log_tail(100_000);
        if pred(&log) {
            Ok(log)
        } else {
            Err(format!("log tail:\n{}", srv.log_tail(60)))
        }
    })
}

fn debug_server(config: &str) -> Server {
    Server::start_with_env(config, "127.0.0.1:0".parse().unwrap(), &["--cores", "1"], &[("TETHER_LOG", "debug")])
}

#[tokio::test]
async fn debug_names_handshake_failures_and_reaps_with_their_peer() {
    let srv = debug_server("[heartbeat]\nping_interval_ms = 200\npong_timeout_ms = 100\n");
    let log = srv.log_tail(100);
    assert!(log.contains("INFO") && log.contains("config in effect: listen=127.0.0.1:0"), "{log}");

    // A request without Host.
    let mut bad = connect(srv.addr).await;
    let peer = bad.local_addr().unwrap();
    bad.write_all(b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n").await.unwrap();
    wait_log(&srv, "handshake failure line", STEP, |l| {
        l.lines().any(|l| {
            l.contains("DEBUG")
                && l.contains("handshake failed")
                && l.contains(&format!("peer={peer}"))
                && l.contains("why=\"bad_request\"")
                && l.contains("missing Host header")
        })
    });

    // A WebSocket client that never answers a ping is reaped for pong timeout.
    let silent = RawWs::connect(srv.addr, "/ws").await;
    let peer = silent.s.local_addr().unwrap();
    wait_log(&srv, "pong timeout reap", STEP, |l| {
        l.lines().any(|l| {
            l.contains("connection reaped") && l.contains(&format!("peer={peer}")) && l.contains("why=\"pong_timeout\"")
        })
    });

    // One that goes away without a close frame: eof.
    let gone = RawWs::connect(srv.addr, "/ws").await;
    let peer = gone.s.local_addr().unwrap();
    drop(gone);
    wait_log(&srv, "eof reap", STEP, |l| {
        l.lines().any(|l| {
            l.contains("connection reaped") && l.contains(&format!("peer={peer}")) && l.contains("why=\"eof\"")
        })
    });
    drop(silent);
}

#[tokio::test]
async fn drain_progress_is_logged_at_info() {
    let mut srv = Server::start("[drain]\nwindow_ms = 400\n", &["--cores", "1"]);
    let _a = RawWs::connect(srv.addr, "/ws").await;
    let _b = RawWs::connect(srv.addr, "/ws").await;
    srv.wait_gauge(2.0, STEP).await;
    srv.signal(libc::SIGTERM);
    let st = srv.wait_exit(Duration::from_secs(10)).expect("exit after the drain");
    assert!(st.success(), "{st:?}");
    let log = srv.log_tail(200);
    for what in ["drain started: closes spread over the window core=0 connections=2 window_ms=400", "draining core=0"] {
        assert!(log.lines().any(|l| l.contains("INFO") && l.contains(what)), "no {what:?} in\n{log}");
    }
    assert!(
        log.contains("drain done: every connection closed") || log.contains("drain deadline reached"),
        "no end of drain in\n{log}"
    );
}

#[tokio::test]
async fn overflow_close_is_logged_at_info_with_the_peer() {
    let srv = Server::start(
        "[limits]\nqueue_max_bytes = 65536\nmax_publish_bytes = 16384\nmax_message_bytes = 16384\n",
        &["--cores", "1"],
    );
    let mut non_reader = RawWs::upgrade(connect_small_rcvbuf(srv.addr, 4096).await, srv.addr, "/ws").await;
    let peer = non_reader.s.local_addr().unwrap();
    non_reader.subscribe("slow").await;
    let body = format!("\"{}\"", "x".repeat(16_000));
    let mut http = HttpConn::new(srv.addr).await;
    let end = Instant::now() + STEP;
    while srv.metric("tether_overflow_total", &[]).await < 1.0 {
        assert!(Instant::now() < end, "no overflow within {STEP:?}");
        http.publish("slow", body.as_bytes()).await;
    }
    wait_log(&srv, "overflow close line", STEP, |l| {
        l.lines().any(|l| {
            l.contains("INFO") && l.contains("slow subscriber closed with 1013") && l.contains(&format!("peer={peer}"))
        })
    });
}

#[tokio::test]
async fn a_flood_of_bad_handshakes_is_rate_limited_and_summarised() {
    const BAD: usize = 200;
    let srv = debug_server("");
    let t0 = Instant::now();
    for _ in 0..BAD {
        let mut s = connect(srv.addr).await;
        s.write_all(b"GET /ws HTTP/1.1\r\n\r\n").await.unwrap();
        let (status, _, _) = read_head(&mut s).await;
        assert_eq!(status, 400);
    }
    let flood = t0.elapsed();
    // Every failure is either logged or counted in a summary line, eventually.
    let count = |log: &str| -> (usize, usize) {
        let logged = log.lines().filter(|l| l.contains("handshake failed")).count();
        let suppressed = log
            .lines()
            .filter(|l| l.contains("similar lines (handshake failure)"))
            .filter_map(|l| l.split("suppressed ").nth(1)?.split(' ').next()?.parse::<usize>().ok())
            .sum();
        (logged, suppressed)
    };
    let log = wait_log(&srv, "summary of the suppressed lines", Duration::from_secs(10), |l| {
        let (logged, suppressed) = count(l);
        logged + suppressed >= BAD
    });
    let (logged, suppressed) = count(&log);
    assert_eq!(logged + suppressed, BAD, "logged {logged} + suppressed {suppressed}");
    // At most 10 lines per second (per core; one core here).
    let windows = flood.as_secs() as usize + 2;
    assert!(logged <= 10 * windows, "{logged} lines in {flood:?}: not rate-limited");
    assert!(suppressed > 0, "{BAD} failures in {flood:?} and nothing suppressed");
}

#[tokio::test]
async fn invalid_tether_log_is_reported_and_info_is_used() {
    let srv =
        Server::start_with_env("", "127.0.0.1:0".parse().unwrap(), &["--cores", "1"], &[("TETHER_LOG", "verbose")]);
    let log = srv.log_tail(100);
    assert!(
        log.contains("TETHER_LOG=\"verbose\"") && log.contains("is not a level") && log.contains("logging at info"),
        "{log}"
    );
    assert!(log.contains("INFO") && log.contains("core started"), "info lines are written: {log}");
    // Debug lines are not.
    let mut s = connect(srv.addr).await;
    s.write_all(b"GET /ws HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(read_head(&mut s).await.0, 400);
    srv.wait_metric("tether_handshake_failures_total", &[], STEP, |v| v >= 1.0).await;
    assert!(!srv.log_tail(100).contains("DEBUG"), "{}", srv.log_tail(100));
}
