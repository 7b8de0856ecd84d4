//! Close-code handling of `tether::client` against a real server (issue 4, client item 5;
//! docs/protocol.md, close codes): a stop code ends the client with a typed error naming the code,
//! and fails the pending publish, instead of reconnecting. (The full code table and the seeded
//! backoff formula are unit-tested in `crates/tether-client/src/close.rs` and `crates/tether-proto/src/protocol/backoff.rs`.)

mod common;

use std::time::Duration;

use common::*;
use tether::client::{Client, ClientConfig, ClientError, Event};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_too_big_stops_the_client_with_1009() {
    let _serial = serial().await;
    let srv = Server::start("[limits]\nmax_message_bytes = 1024\n", &["--cores", "1"]);
    let mut cfg = ClientConfig::new(srv.ws_url());
    cfg.seed = Some(3);
    let mut client = Client::connect(cfg).expect("client");
    let ack = client.publisher().send("stop.codes", None, &"x".repeat(4096)).await.expect("queued");
    let err = tokio::time::timeout(STEP, ack)
        .await
        .expect("publish outcome in time")
        .expect_err("an oversized publish cannot be acked");
    assert!(matches!(err, ClientError::Closed { code: 1009, .. }), "{err:?}");
    let end = loop {
        match tokio::time::timeout(STEP, client.next_event()).await.expect("client ended in time") {
            Ok(Event::Connected { .. }) => {}
            Ok(other) => panic!("unexpected event {other:?}"),
            Err(e) => break e,
        }
    };
    assert!(matches!(end, ClientError::Closed { code: 1009, .. }), "{end:?}");
    assert!(end.to_string().contains("1009"), "the error names the code: {end}");
    // No reconnect: the server saw exactly one upgrade.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(srv.metric("tether_upgraded_total", &[]).await, 1.0);
    assert_eq!(client.stats().connects, 1);
}
