//! One port, one tether process (issue 8): a second `tether serve` on an address another
//! process already listens on refuses to start, naming the address, and exits non-zero; the
//! first server goes on numbering its channels alone. (`SO_REUSEPORT` would otherwise let the
//! kernel split connections between two processes whose memory brokers number the same
//! channel twice: seq 1,1,2,3,2,3.) The cores of one process still share the port.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

/// Runs `tether serve --listen ADDR --cores 2` and waits (bounded) for it to exit.
fn second_serve(listen: &str) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["serve", "--listen", listen, "--cores", "2"])
        .env("TETHER_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tether");
    wait_child(child, Duration::from_secs(10), &format!("second server on {listen}"))
}

#[tokio::test]
async fn second_server_on_a_busy_port_refuses_to_start() {
    let srv = Server::start("", &["--cores", "2"]);
    let port = srv.addr.port();
    assert_eq!(srv.publish("one", "1").await, 1);

    let mut addrs = vec![format!("127.0.0.1:{port}"), format!("0.0.0.0:{port}")];
    // The dual-stack wildcard covers 127.0.0.1 too, where the box has IPv6.
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        addrs.push(format!("[::]:{port}"));
    }
    for listen in addrs {
        let out = second_serve(&listen);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "second server on {listen} exited {:?}; stderr {stderr}", out.status);
        assert!(
            stderr.contains(&format!("address {listen} is already in use by another process")),
            "stderr of the second server on {listen}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "the second server said it listens: {:?}", String::from_utf8_lossy(&out.stdout));
    }

    // The first server alone still numbers the channel, across many connections.
    for k in 2..=12 {
        assert_eq!(srv.publish("one", "1").await, k, "seq after the refused second servers");
    }
}

#[test]
fn every_bind_error_names_the_address() {
    // An address this box does not have: EADDRNOTAVAIL.
    let listen: SocketAddr = "192.0.2.1:8080".parse().unwrap();
    let out = second_serve(&listen.to_string());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("cannot listen on {listen}")), "stderr: {stderr}");
}
