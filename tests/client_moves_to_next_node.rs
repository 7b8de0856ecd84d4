//! Several URLs (issue 9, item 9; docs/clients.md, "Rust client and command-line tools"): a client given two
//! tether nodes moves to the second when the first dies (SIGKILL: no close frame, no drain),
//! within a bounded time, resumes its subscription there, has its outbox acked there, and
//! receives what is published there. `tether pub` takes the same comma-separated list, and an
//! empty one is refused naming the argument.
//!
//! Each node runs the memory broker, so the two do not share channels: the resume on the
//! second node is answered with an `epoch` reset, where nodes sharing a broker would resume
//! without a gap (the client sends the same `from`/`epoch` either way).

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tether::client::{Client, ClientConfig, Event};

/// The next client event that is not `Connected`/`Disconnected`.
async fn next_data(c: &mut Client) -> Event {
    loop {
        let ev = tokio::time::timeout(STEP, c.next_event()).await.expect("no client event in time").expect("event");
        match ev {
            Event::Connected { .. } | Event::Disconnected { .. } => {}
            ev => return ev,
        }
    }
}

fn expect_msg(ev: Event, want_seq: u64) -> serde_json::Value {
    match ev {
        Event::Message { seq, data, .. } if seq == want_seq => serde_json::from_str(data.get()).expect("data"),
        other => panic!("expected msg #{want_seq}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_becomes_a_resume_on_the_next() {
    let _serial = serial().await;
    let a = Server::start("", &["--cores", "1"]);
    let b = Server::start("", &["--cores", "1"]);
    let ch = "nodes.failover";
    // The default backoff: the point is how soon the second node is tried with it.
    let mut cfg = ClientConfig::with_urls([a.ws_url(), b.ws_url()]);
    cfg.seed = Some(17);
    let mut client = Client::connect(cfg).expect("client");
    client.subscribe(ch, None).expect("subscribe");

    let epoch_a = match next_data(&mut client).await {
        Event::Subscribed { seq: 0, epoch, .. } => epoch,
        other => panic!("expected subscribed on the first node, got {other:?}"),
    };
    assert_eq!(a.publish(ch, r#"{"n":1}"#).await, 1);
    assert_eq!(expect_msg(next_data(&mut client).await, 1), json!({"n":1}));
    client.commit(ch, 1).await.expect("commit");

    let killed = Instant::now();
    drop(a); // SIGKILL
    let outbox = client.publisher().send(ch, Some("across-nodes".into()), &json!({"n":"outbox"})).await.expect("send");
    loop {
        let ev = tokio::time::timeout(STEP, client.next_event()).await.expect("reconnect in time").expect("event");
        match ev {
            Event::Disconnected { .. } => {}
            Event::Connected { .. } => break,
            other => panic!("expected the switch to the second node, got {other:?}"),
        }
    }
    let switched = killed.elapsed();
    assert!(switched < Duration::from_secs(3), "connected to the second node after {switched:?}");
    b.wait_gauge(1.0, STEP).await;

    // The resume (from 1 under the first node's epoch) reaches the second node, whose own
    // memory broker answers with an epoch reset.
    let reset_seq = match next_data(&mut client).await {
        Event::Reset { reason, seq, epoch, .. } if reason == "epoch" => {
            assert_ne!(epoch, epoch_a);
            seq
        }
        other => panic!("expected an epoch reset from the second node, got {other:?}"),
    };
    let ack = tokio::time::timeout(STEP, outbox).await.expect("ack in time").expect("outbox acked by the second node");
    assert_eq!(ack.id, "across-nodes");
    let published = b.publish(ch, r#"{"n":2}"#).await;
    assert_eq!(published, ack.seq + 1);
    let mut seen = Vec::new();
    while seen.last() != Some(&published) {
        match next_data(&mut client).await {
            Event::Message { seq, data, .. } => {
                assert!(seq > reset_seq, "seq {seq} at or before the reset's {reset_seq}");
                if seq == published {
                    assert_eq!(serde_json::from_str::<serde_json::Value>(data.get()).expect("data"), json!({"n":2}));
                }
                client.commit(ch, seq).await.expect("commit");
                seen.push(seq);
            }
            other => panic!("expected messages from the second node, got {other:?}"),
        }
    }
    assert_eq!(client.stats().connects, 2);
    assert_eq!(b.metric("tether_upgraded_total", &[]).await, 1.0);
    client.close().await;
}

/// Runs the `tether` binary with `args`, bounded in time.
fn tether(args: &[&str]) -> Output {
    run_tether(args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pub_command_takes_a_comma_separated_list() {
    let _serial = serial().await;
    let srv = Server::start("", &["--cores", "1"]);
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("ws://{}/ws", l.local_addr().expect("addr"))
    };
    let list = format!("{dead},{}", srv.ws_url());
    let out =
        tokio::task::spawn_blocking(move || tether(&["pub", &list, "nodes.cli", r#"{"n":1}"#])).await.expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let ack: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!((ack["op"].as_str(), ack["seq"].as_u64()), (Some("ack"), Some(1)), "{stdout}");

    let out = tokio::task::spawn_blocking(|| tether(&["pub", "", "nodes.cli", "1"])).await.expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr.contains("invalid URL: URL has an empty entry"), "{stderr}");
    let out = tokio::task::spawn_blocking(|| tether(&["pub", "ws://127.0.0.1:1/ws,https://x/ws", "c", "1"]))
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("URL entry 2 of 2: https://x/ws: expected ws://HOST:PORT/ws"), "{stderr}");
}
