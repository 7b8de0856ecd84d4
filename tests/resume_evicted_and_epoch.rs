//! Typed reset (issue 4, "Evicted history"; docs/protocol.md): a resume point that history no
//! longer holds gets `reset` with reason `evicted` and the first seq still available as
//! `oldest`; a resume across a server restart gets `reset` with reason `epoch`. Either way the
//! stream continues live at `reset.seq + 1` with no gap. Raw JSON over tokio-tungstenite, so
//! every field is checked as sent.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::tung::{connect, next_json, quiet, send, Ws};
use common::*;
use serde_json::{json, Value};
use tether::client::{Client, ClientConfig, Event, Position};

const CONFIG: &str = "[drain]\nwindow_ms = 200\n\n[[channels]]\npattern = \"*\"\nhistory = 100\n";

/// Subscribes with `from`/`epoch` and returns the first reply.
async fn resume(addr: SocketAddr, ch: &str, from: u64, epoch: &str) -> (Ws, Value) {
    let mut w = connect(&format!("ws://{addr}/ws")).await;
    send(&mut w, json!({"op": "sub", "ch": ch, "from": from, "epoch": epoch})).await;
    let first = next_json(&mut w).await;
    (w, first)
}

async fn publish_n(addr: SocketAddr, ch: &str, from: u64, to: u64) {
    let mut http = HttpConn::new(addr).await;
    for i in from..=to {
        assert_eq!(http.publish(ch, format!("{{\"n\":{i}}}").as_bytes()).await, i);
    }
}

fn assert_reset(v: &Value, ch: &str, reason: &str, seq: u64, epoch: &str, oldest: u64) {
    assert_eq!(v["op"], "reset", "{v}");
    assert_eq!(v["ch"], ch, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
    assert_eq!(v["seq"], seq, "reset.seq is the head: {v}");
    assert_eq!(v["epoch"], epoch, "reset carries the current epoch: {v}");
    assert_eq!(v["oldest"], oldest, "reset.oldest is the first seq still in history: {v}");
}

async fn expect_msg(w: &mut Ws, ch: &str, seq: u64) {
    let v = next_json(w).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str(), v["seq"].as_u64()), (Some("msg"), Some(ch), Some(seq)), "{v}");
    assert_eq!(v["data"]["n"], seq, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_resume_gets_reset_and_restart_gets_epoch_reset() {
    let _serial = serial().await;
    let ch = "resume.evicted";
    let srv = Server::start(CONFIG, &["--cores", "2"]);
    let addr = srv.addr;

    // A subscriber processes seq 1..10, then goes away.
    let mut w = connect(&format!("ws://{addr}/ws")).await;
    send(&mut w, json!({"op": "sub", "ch": ch})).await;
    let subscribed = next_json(&mut w).await;
    assert_eq!((subscribed["op"].as_str(), subscribed["seq"].as_u64()), (Some("subscribed"), Some(0)), "{subscribed}");
    let epoch = subscribed["epoch"].as_str().expect("epoch").to_string();
    publish_n(addr, ch, 1, 10).await;
    for seq in 1..=10 {
        expect_msg(&mut w, ch, seq).await;
    }
    drop(w);

    // 1,000 more while it is away: history (100) now holds 911..1010.
    publish_n(addr, ch, 11, 1010).await;

    let (mut evicted, first) = resume(addr, ch, 10, &epoch).await;
    assert_reset(&first, ch, "evicted", 1010, &epoch, 911);
    // Boundary: from 909 needs 910, which is gone; from 910 needs 911, the oldest kept.
    let (mut just_gone, first) = resume(addr, ch, 909, &epoch).await;
    assert_reset(&first, ch, "evicted", 1010, &epoch, 911);
    let (mut just_kept, first) = resume(addr, ch, 910, &epoch).await;
    assert_eq!(
        (first["op"].as_str(), first["recovered"].as_bool(), first["seq"].as_u64()),
        (Some("subscribed"), Some(true), Some(1010)),
        "{first}"
    );
    for seq in 911..=1010 {
        expect_msg(&mut just_kept, ch, seq).await;
    }
    let (mut at_head, first) = resume(addr, ch, 1010, &epoch).await;
    assert_eq!((first["op"].as_str(), first["recovered"].as_bool()), (Some("subscribed"), Some(true)), "{first}");
    let (_, first) = resume(addr, ch, 1011, &epoch).await;
    assert_eq!(first["op"], "error", "from beyond the head: {first}");

    // The client library surfaces the same reset as an event.
    let mut client = Client::connect(ClientConfig::new(srv.ws_url())).expect("client");
    client.subscribe_at(ch, Position { seq: 10, epoch: Some(epoch.clone()) }).expect("subscribe");
    let reset = next_non_status(&mut client).await;
    match &reset {
        Event::Reset { ch: c, seq, epoch: e, reason, oldest } => {
            assert_eq!(
                (c.as_str(), *seq, e.as_str(), reason.as_str(), *oldest),
                (ch, 1010, epoch.as_str(), "evicted", 911)
            );
        }
        other => panic!("expected Event::Reset, got {other:?}"),
    }

    // Live continues at reset.seq + 1 with nothing replayed and nothing skipped.
    quiet(&mut evicted, Duration::from_millis(100)).await;
    publish_n(addr, ch, 1011, 1011).await;
    for w in [&mut evicted, &mut just_gone, &mut just_kept, &mut at_head] {
        expect_msg(w, ch, 1011).await;
    }
    match next_non_status(&mut client).await {
        Event::Message { seq: 1011, .. } => {}
        other => panic!("expected msg 1011 after the reset, got {other:?}"),
    }
    client.close().await;

    // A second channel whose position will be beyond the new process's head.
    let other = "resume.epoch-empty";
    let mut w = connect(&format!("ws://{addr}/ws")).await;
    send(&mut w, json!({"op": "sub", "ch": other})).await;
    let other_epoch = next_json(&mut w).await["epoch"].as_str().expect("epoch").to_string();
    publish_n(addr, other, 1, 7).await;
    drop(w);

    // Restart: a new process on the same port starts every channel with a new epoch.
    for w in [evicted, just_gone, just_kept, at_head] {
        drop(w);
    }
    let mut srv = srv;
    srv.signal(libc::SIGTERM);
    let st = srv.wait_exit(Duration::from_secs(5)).expect("old server did not exit within 5 s");
    assert!(st.success(), "{st:?}");
    let srv2 = Server::start_at(CONFIG, addr, &["--cores", "2"]);
    publish_n(addr, ch, 1, 5).await;

    let (mut stale, first) = resume(addr, ch, 1011, &epoch).await;
    let new_epoch = first["epoch"].as_str().expect("epoch").to_string();
    assert_ne!(new_epoch, epoch, "the restarted process kept the old epoch");
    assert_reset(&first, ch, "epoch", 5, &new_epoch, 1);
    // A seq that exists again under the new numbering is still another message: reset.
    let (mut same_seq, first) = resume(addr, ch, 3, &epoch).await;
    assert_reset(&first, ch, "epoch", 5, &new_epoch, 1);
    // Under the new epoch the same position resumes normally.
    let (mut current, first) = resume(addr, ch, 3, &new_epoch).await;
    assert_eq!((first["op"].as_str(), first["recovered"].as_bool()), (Some("subscribed"), Some(true)), "{first}");
    expect_msg(&mut current, ch, 4).await;
    expect_msg(&mut current, ch, 5).await;
    publish_n(addr, ch, 6, 6).await;
    for w in [&mut stale, &mut same_seq, &mut current] {
        expect_msg(w, ch, 6).await;
    }

    // A position beyond the new head under the old epoch is a reset too, not an error: the
    // client cannot know the numbering restarted.
    let (mut empty, first) = resume(addr, other, 7, &other_epoch).await;
    assert_eq!(first["op"], "reset", "resume after restart on an unpublished channel: {first}");
    assert_eq!((first["reason"].as_str(), first["seq"].as_u64()), (Some("epoch"), Some(0)), "{first}");
    assert_ne!(first["epoch"], other_epoch.as_str());
    publish_n(addr, other, 1, 1).await;
    expect_msg(&mut empty, other, 1).await;

    let mut client = Client::connect(ClientConfig::new(srv2.ws_url())).expect("client");
    client.subscribe_at(ch, Position { seq: 1011, epoch: Some(epoch.clone()) }).expect("subscribe");
    match next_non_status(&mut client).await {
        Event::Reset { reason, seq: 6, epoch: e, .. } if reason == "epoch" && e == new_epoch => {}
        other => panic!("expected an epoch reset at seq 6, got {other:?}"),
    }
    client.close().await;
}

/// The next client event that is not `Connected`/`Disconnected`/`Subscribed`.
async fn next_non_status(c: &mut Client) -> Event {
    loop {
        let ev =
            tokio::time::timeout(STEP, c.next_event()).await.expect("no client event in time").expect("client event");
        match ev {
            Event::Connected { .. } | Event::Disconnected { .. } | Event::Subscribed { .. } => {}
            ev => return ev,
        }
    }
}
