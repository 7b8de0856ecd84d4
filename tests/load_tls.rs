//! `tether load` over TLS (issue 30): `wss://` for `connect`, `fanout` (its publisher over
//! WebSocket and over HTTP) and `idle`, `https://` for `fanout --sse`, with `--ca` trusting a
//! test CA made at test time. The server does not speak TLS itself here: the real nginx, from
//! the shipped docs/recipes/nginx.conf, terminates it in front of a plain `tether serve` on
//! 127.0.0.1. Without `--ca` the test CA is not trusted and every handshake fails as `tls`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::Duration;

use common::proxy::{Proxy, ProxyOpts, TestCa};
use common::server::{spawn_load_with, BIN};
use common::Server;

/// Longest a `tether load` run here may take before it is stopped and the test fails.
const RUN_LIMIT: Duration = Duration::from_secs(90);

/// Runs `tether load ARGS` and returns (exit success, the final JSON line); SIGTERM after
/// [`RUN_LIMIT`] (the load tool then reports what it has, and the test fails on the time).
fn load(args: &[String]) -> (bool, serde_json::Value) {
    let mut child = spawn_load_with(Path::new(BIN), args);
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let last = BufReader::new(out).lines().map_while(Result::ok).filter(|l| l.starts_with('{')).last();
        let _ = tx.send(last.unwrap_or_default());
    });
    let last = match rx.recv_timeout(RUN_LIMIT) {
        Ok(line) => line,
        Err(_) => {
            // SAFETY: SIGTERM to the load process this test started.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let _ = child.wait();
            panic!("tether load {args:?} did not finish within {RUN_LIMIT:?}");
        }
    };
    let status = child.wait().expect("reap tether load");
    let report = serde_json::from_str(&last).unwrap_or_else(|e| panic!("tether load {args:?}: report {last:?}: {e}"));
    (status.success(), report)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[test]
fn load_connect_fanout_and_idle_run_over_wss_through_nginx() {
    let server = Server::start("", &[]);
    let ca = TestCa::new();
    let proxy = Proxy::nginx(&ca, server.addr, ProxyOpts::default());
    let url = proxy.wss_url();
    let ca_file = ca.ca_cert.to_str().unwrap();

    let (ok, r) = load(&strings(&["connect", &url, "--conns", "300", "--ca", ca_file]));
    assert!(ok, "connect: {r}");
    assert_eq!((r["ok"].as_u64(), r["errors"].as_u64()), (Some(300), Some(0)), "connect: {r}");
    assert!(r["handshakes_per_s"].as_u64() > Some(0), "connect: {r}");

    let fanout =
        ["fanout", &url, "--subs", "40", "--rate", "50", "--duration", "2s", "--channels", "2", "--ca", ca_file];
    let (ok, r) = load(&strings(&fanout));
    assert!(ok, "fanout: {r}");
    assert_eq!((r["lost"].as_u64(), r["errors"].as_u64()), (Some(0), Some(0)), "fanout: {r}");
    // About 100 messages over 2 channels of 20 subscribers each, every one delivered.
    assert!(r["expected"].as_u64() >= Some(1900), "fanout: {r}");
    assert_eq!(r["deliveries"], r["expected"], "fanout: {r}");

    // The publisher over HTTPS (`POST /publish/{ch}` on a keep-alive TLS connection).
    let (ok, r) = load(&strings(&[&fanout[..], &["--publish", "http"]].concat()));
    assert!(ok, "fanout --publish http: {r}");
    assert!(r["expected"].as_u64() >= Some(1900), "fanout --publish http: {r}");
    assert_eq!(r["deliveries"], r["expected"], "fanout --publish http: {r}");

    let https = url.replace("wss://", "https://").replace("/ws", "/");
    let (ok, r) =
        load(&strings(&["fanout", &url, "--sse", "--subs", "20", "--rate", "20", "--duration", "1s", "--ca", ca_file]));
    assert!(ok, "fanout --sse: {r}");
    assert_eq!(r["lost"].as_u64(), Some(0), "fanout --sse: {r}");
    assert!(r["expected"].as_u64() >= Some(380), "fanout --sse: {r}");
    assert_eq!(r["deliveries"], r["expected"], "fanout --sse: {r}");
    // Subscribers named by an https:// URL, the publisher by the wss:// one.
    let sse_https =
        ["fanout", &https, "--sse", "--publish-url", &url, "--subs", "5", "--rate", "10", "--duration", "1s"];
    let (ok, r) = load(&strings(&[&sse_https[..], &["--ca", ca_file]].concat()));
    assert!(ok, "fanout --sse over https://: {r}");
    assert!(r["expected"].as_u64() >= Some(45), "fanout --sse https://: {r}");
    assert_eq!(r["deliveries"], r["expected"], "fanout --sse https://: {r}");

    let (ok, r) = load(&strings(&["idle", &url, "--conns", "500", "--hold", "1s", "--channels", "5", "--ca", ca_file]));
    assert!(ok, "idle: {r}");
    assert_eq!((r["connections"].as_u64(), r["errors"].as_u64()), (Some(500), Some(0)), "idle: {r}");
}

#[test]
fn load_refuses_a_certificate_it_was_not_told_to_trust() {
    let server = Server::start("", &[]);
    let ca = TestCa::new();
    let proxy = Proxy::nginx(&ca, server.addr, ProxyOpts::default());
    // No --ca: the system bundle, which does not hold the test CA.
    let (ok, r) = load(&strings(&["connect", &proxy.wss_url(), "--conns", "5"]));
    assert!(!ok, "an untrusted certificate must fail: {r}");
    assert_eq!((r["ok"].as_u64(), r["errors"].as_u64()), (Some(0), Some(5)), "{r}");
    assert_eq!(r["error_kinds"]["tls"].as_u64(), Some(5), "{r}");
}
