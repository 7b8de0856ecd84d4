//! Presence through the Rust client and the command line (docs/clients.md) against a real
//! `tether serve`: `Client::presence` gathers every page and `presence_stats` counts; a
//! `join_leave` subscription receives the diffs; refusals come back as `ClientError::Refused`
//! (with `retry_after` for `limit`); after its node is killed the client subscribes again (on
//! the other node) with join_leave and raises `PresenceReset { reconnected: true }` before the
//! new diffs;
//! `tether presence` prints members and counts, and `tether sub --join-leave` prints the diffs
//! on stdout beside the messages. The wire protocol itself is `presence.rs`.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::tung::{connect, next_json, send, Ws};
use common::{run_tether, Server};
use serde_json::{json, Value};
use tether::client::{Client, ClientConfig, ClientError, Event, Member, PresenceStats, SubscribeOptions};

/// Presence rooms with join/leave (window 200 ms, pages of 2), presence without join/leave,
/// and (the default rule) channels without presence.
const CONFIG: &str = "[presence]\nwindow_ms = 200\npage_size = 2\n\
     [limits.per_connection]\npresence_rate = 20\n\
     [[channels]]\npattern = \"room.*\"\npresence = true\njoin_leave = true\n\
     [[channels]]\npattern = \"quiet.*\"\npresence = true\n";

/// How long one expected event may take (a window is 200 ms).
const STEP: Duration = Duration::from_secs(10);

/// A client with fast reconnects.
fn client(srv: &Server) -> Client {
    let mut cfg = ClientConfig::new(srv.ws_url());
    cfg.backoff.base = Duration::from_millis(50);
    cfg.backoff.cap = Duration::from_millis(200);
    Client::connect(cfg).expect("client")
}

/// The next event that is not `Connected` / `Disconnected`, within [`STEP`].
async fn next_data(c: &mut Client) -> Event {
    loop {
        match tokio::time::timeout(STEP, c.next_event()).await.expect("an event in time").expect("event") {
            Event::Connected { .. } | Event::Disconnected { .. } => continue,
            ev => return ev,
        }
    }
}

/// The next `PresenceDiff`, as (joins, leaves) client ids.
async fn next_diff(c: &mut Client) -> (BTreeSet<String>, BTreeSet<String>) {
    match next_data(c).await {
        Event::PresenceDiff { joins, leaves, raw, .. } => {
            assert!(raw.starts_with(r#"{"op":"presence_diff""#), "{raw}");
            (ids(&joins), ids(&leaves))
        }
        other => panic!("expected a presence diff, got {other:?}"),
    }
}

fn ids(members: &[Member]) -> BTreeSet<String> {
    members.iter().map(|m| m.client.clone()).collect()
}

/// A tokio-tungstenite subscriber of `ch` (no join/leave).
async fn member(srv: &Server, ch: &str) -> Ws {
    let mut ws = connect(&srv.ws_url()).await;
    send(&mut ws, json!({"op": "sub", "ch": ch})).await;
    assert_eq!(next_json(&mut ws).await["op"], "subscribed");
    ws
}

#[tokio::test]
async fn rust_client_lists_every_page_counts_and_receives_diffs() {
    let srv = Server::start(CONFIG, &[]);
    let mut others = Vec::new();
    for _ in 0..4 {
        others.push(member(&srv, "room.a").await);
    }
    let mut c = client(&srv);
    c.subscribe_with("room.a", SubscribeOptions { join_leave: true, ..SubscribeOptions::default() }).expect("sub");
    assert!(matches!(next_data(&mut c).await, Event::Subscribed { ref ch, .. } if ch == "room.a"));
    // The first window announces the client's own join (and the others' when they joined in
    // the same window).
    let (joins, leaves) = next_diff(&mut c).await;
    assert!(!joins.is_empty() && leaves.is_empty(), "{joins:?} {leaves:?}");

    // Five members in pages of two: three pages, gathered into one list.
    let members = c.presence("room.a").await.expect("presence");
    let listed = ids(&members);
    assert_eq!(listed.len(), 5, "{members:?}");
    assert!(listed.is_superset(&joins), "{members:?}");
    assert!(members.iter().all(|m| m.user.is_none() && m.info.is_none()), "no auth: {members:?}");
    let stats = c.presence_stats("room.a").await.expect("stats");
    assert_eq!(stats, PresenceStats { ch: "room.a".into(), clients: 5, users: 0 });
    // Asked from another task through a publisher handle, while events are read.
    let asker = c.publisher();
    let quiet = tokio::spawn(async move { asker.presence("quiet.nobody").await });
    assert_eq!(quiet.await.expect("task").expect("empty channel"), Vec::<Member>::new());

    // One leaves (its connection drops): its leave arrives, naming a listed member.
    drop(others.pop());
    let (joins, leaves) = next_diff(&mut c).await;
    assert!(joins.is_empty(), "{joins:?}");
    assert_eq!(leaves.len(), 1, "{leaves:?}");
    assert!(listed.is_superset(&leaves), "{leaves:?}");
    let now = ids(&c.presence("room.a").await.expect("presence"));
    assert_eq!(now, listed.difference(&leaves).cloned().collect(), "the diff adds up to the list");
}

#[tokio::test]
async fn refusals_are_typed_and_answers_stay_matched() {
    let srv = Server::start(CONFIG, &[]);
    let mut c = client(&srv);
    let refused = |r: Result<Vec<Member>, ClientError>| match r {
        Err(ClientError::Refused { code, retry_after, .. }) => (code, retry_after),
        other => panic!("expected a refusal, got {other:?}"),
    };
    // No presence on the default rule.
    assert_eq!(refused(c.presence("plain.x").await), ("presence_off".into(), None));
    match c.presence_stats("plain.x").await {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, "presence_off"),
        other => panic!("{other:?}"),
    }
    // join_leave where the rule has none: the subscription is refused and not made again.
    c.subscribe_with("quiet.a", SubscribeOptions { join_leave: true, ..SubscribeOptions::default() }).expect("sub");
    match next_data(&mut c).await {
        Event::Error { code, ch, .. } => assert_eq!((code.as_str(), ch.as_deref()), ("presence_off", Some("quiet.a"))),
        other => panic!("expected the refusal, got {other:?}"),
    }
    // A sub and queries about one channel in one burst: each answer goes to its request.
    c.subscribe("room.b", None).expect("sub");
    let (list, stats) = tokio::join!(c.presence("room.b"), c.presence_stats("room.b"));
    let list = list.expect("presence");
    assert_eq!(stats.expect("stats").clients, list.len() as u64);
    // Past presence_rate (20 per second): `limit`, with the wait in `retry_after`.
    let asks: Vec<_> = (0..60).map(|_| c.presence("room.b")).collect();
    let answers = futures::future::join_all(asks).await;
    let limited: Vec<_> = answers.into_iter().filter(|r| r.is_err()).map(refused).collect();
    assert!(!limited.is_empty(), "60 requests at once, 20 per second allowed");
    assert!(limited.iter().all(|(code, wait)| code == "limit" && wait.is_some()), "{limited:?}");
}

#[tokio::test]
async fn after_a_node_dies_join_leave_is_made_again_and_the_view_is_reset() {
    // Two nodes (memory broker: each its own channels and epochs); the client starts on the
    // first and moves to the second when the first is killed. (Not a restart on the same
    // port: with other tests' connections about, the freed port can be taken as an ephemeral
    // one before the new server binds it.)
    let (mut first_node, srv) = (Server::start(CONFIG, &[]), Server::start(CONFIG, &[]));
    let mut cfg = ClientConfig::with_urls([first_node.ws_url(), srv.ws_url()]);
    cfg.backoff.base = Duration::from_millis(50);
    cfg.backoff.cap = Duration::from_millis(200);
    let mut c = Client::connect(cfg).expect("client");
    c.subscribe_with("room.r", SubscribeOptions { join_leave: true, ..SubscribeOptions::default() }).expect("sub");
    assert!(matches!(next_data(&mut c).await, Event::Subscribed { .. }));
    let (first, _) = next_diff(&mut c).await;
    first_node.signal(libc::SIGKILL); // no close frame: the client sees a cut
    first_node.wait_exit(STEP).expect("the killed node exits");
    // The other node numbers the channel under another epoch: the resume is a reset, then the
    // client's own presence reset, then the diffs of the new connection (made with join_leave).
    match next_data(&mut c).await {
        Event::Reset { ch, reason, .. } => assert_eq!((ch.as_str(), reason.as_str()), ("room.r", "epoch")),
        other => panic!("expected the epoch reset, got {other:?}"),
    }
    match next_data(&mut c).await {
        Event::PresenceReset { ch, reconnected } => assert_eq!((ch.as_str(), reconnected), ("room.r", true)),
        other => panic!("expected the client's presence reset, got {other:?}"),
    }
    let mut other = member(&srv, "room.r").await;
    let mut joined = BTreeSet::new();
    let deadline = Instant::now() + STEP;
    while joined.len() < 2 && Instant::now() < deadline {
        let (joins, _) = next_diff(&mut c).await;
        joined.extend(joins);
    }
    assert_eq!(joined.len(), 2, "its own join and the other member's: {joined:?}");
    assert!(!joined.contains(first.iter().next().expect("first")), "a new connection is a new member");
    assert_eq!(ids(&c.presence("room.r").await.expect("presence")), joined);
    send(&mut other, json!({"op": "unsub", "ch": "room.r"})).await;
    let (_, leaves) = next_diff(&mut c).await;
    assert_eq!(leaves.len(), 1);
}

/// A `tether sub` process whose stdout lines arrive on a channel.
struct SubCli {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl SubCli {
    fn spawn(args: &[&str]) -> SubCli {
        let mut child = Command::new(common::server::BIN)
            .args(args)
            .env("TETHER_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tether");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        SubCli { child, lines }
    }

    /// The next stdout line as JSON, within [`STEP`].
    fn next(&self) -> Value {
        let line = self.lines.recv_timeout(STEP).expect("a stdout line in time");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }
}

impl Drop for SubCli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn cli_prints_members_counts_and_join_leave_lines() {
    let srv = Server::start(CONFIG, &[]);
    let url = srv.ws_url();
    let mut a = member(&srv, "room.c").await;
    let _b = member(&srv, "room.c").await;
    let _c = member(&srv, "room.c").await;

    let out = run_tether(&["presence", &url, "room.c"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let members: Vec<Value> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(members.len(), 3, "every page, one line per member: {members:?}");
    assert!(members.iter().all(|m| m["client"].is_string() && m.get("user").is_none()), "{members:?}");
    let out = run_tether(&["presence", &url, "room.c", "--stats"]);
    let stats: Value = serde_json::from_slice(&out.stdout).expect("stats line");
    assert_eq!(stats, json!({"ch": "room.c", "clients": 3, "users": 0}));
    // A refusal: exit 1, the server's answer on stderr, nothing on stdout.
    let out = run_tether(&["presence", &url, "plain.c"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    let first: Value = serde_json::from_str(err.lines().next().expect("a line")).expect("JSON");
    assert_eq!((first["code"].as_str(), first["ch"].as_str()), (Some("presence_off"), Some("plain.c")), "{err}");

    // `tether sub --join-leave`: diffs on stdout, in order with the messages.
    let sub = SubCli::spawn(&["sub", &url, "room.c", "--join-leave"]);
    let own = sub.next();
    assert_eq!(own["op"], "presence_diff", "its own join: {own}");
    assert!(own["joins"].as_array().is_some_and(|j| !j.is_empty()), "{own}");
    srv.publish("room.c", r#"{"n":1}"#).await;
    assert_eq!(sub.next(), json!({"op": "msg", "ch": "room.c", "seq": 1, "data": {"n": 1}}));
    send(&mut a, json!({"op": "unsub", "ch": "room.c"})).await;
    let diff = sub.next();
    assert_eq!((diff["op"].as_str(), diff["leaves"].as_array().map(Vec::len)), (Some("presence_diff"), Some(1)));
}
