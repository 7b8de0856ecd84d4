//! Presence across nodes (Redis broker; docs/redis.md, "Presence"): two tether nodes on one
//! real `redis-server`. Members on either node are listed and counted from either; a join on
//! one node reaches a `join_leave` subscriber on the other as a coalesced `presence_diff`; and
//! when a node is killed with `kill -9`, its members disappear within `presence.member_ttl_ms`
//! (3 s here) and the other node's subscribers see their leaves. Through tokio-tungstenite.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::auth::{claims, hs256, hs256_config, now_s};
use common::redis::RedisProc;
use common::tung::{self, connect, next_json, send, Ws};
use common::Server;
use serde_json::{json, Value};

fn config(url: &str) -> String {
    format!(
        "[broker]\nkind = \"redis\"\nurl = \"{url}\"\n\
         [presence]\nwindow_ms = 200\nmember_ttl_ms = 3000\npage_size = 3\n\
         [[channels]]\npattern = \"room.*\"\npresence = true\njoin_leave = true\n\
         {}",
        hs256_config(5000)
    )
}

async fn sub(ws: &mut Ws, ch: &str, join_leave: bool) {
    send(ws, json!({"op": "sub", "ch": ch, "join_leave": join_leave})).await;
    let v = next_json(ws).await;
    assert_eq!(v["op"], "subscribed", "{v}");
}

/// Every member of `ch` as `(client, user)`, following `next` page by page.
async fn members(ws: &mut Ws, ch: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut cursor = Value::Null;
    for _ in 0..1000 {
        send(ws, json!({"op": "presence", "ch": ch, "cursor": cursor})).await;
        let page = next_json(ws).await;
        assert_eq!(page["op"], "presence", "{page}");
        for m in page["members"].as_array().expect("members") {
            out.insert((m["client"].as_str().unwrap().to_owned(), m["user"].as_str().unwrap_or("").to_owned()));
        }
        match page.get("next") {
            Some(n) => cursor = n.clone(),
            None => return out,
        }
    }
    panic!("more than 1000 pages");
}

async fn stats(ws: &mut Ws, ch: &str) -> (u64, u64) {
    send(ws, json!({"op": "presence_stats", "ch": ch})).await;
    let v = next_json(ws).await;
    assert_eq!(v["op"], "presence_stats", "{v}");
    (v["clients"].as_u64().unwrap(), v["users"].as_u64().unwrap())
}

/// Reads presence frames of `ws` until `done` says the joins and leaves seen so far are what
/// it waits for, within `limit`; returns (joined clients, left clients).
async fn watch_until(
    ws: &mut Ws,
    limit: Duration,
    done: impl Fn(&BTreeSet<String>, &BTreeSet<String>) -> bool,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let end = Instant::now() + limit;
    let (mut joined, mut left) = (BTreeSet::new(), BTreeSet::new());
    while !done(&joined, &left) {
        let rest = end
            .checked_duration_since(Instant::now())
            .unwrap_or_else(|| panic!("saw joins {joined:?}, leaves {left:?}"));
        match tung::read_within(ws, rest).await {
            tung::Read::Json(v) if v["op"] == "presence_diff" => {
                for m in v["joins"].as_array().unwrap() {
                    joined.insert(m["client"].as_str().unwrap().to_owned());
                }
                for m in v["leaves"].as_array().unwrap() {
                    left.insert(m["client"].as_str().unwrap().to_owned());
                }
            }
            other => panic!("expected presence_diff, got {other:?}"),
        }
    }
    (joined, left)
}

#[tokio::test]
async fn members_of_both_nodes_are_one_presence_and_a_killed_node_leaves_within_the_ttl() {
    let redis = RedisProc::start();
    let cfg = config(&redis.url());
    let a = Server::start(&cfg, &[]);
    let b = Server::start(&cfg, &[]);
    let exp = now_s() + 600;
    let token = |user: &str| hs256(&claims(user, exp, &["room.*"], &[]));
    let url = |srv: &Server, user: &str| format!("{}?token={}", srv.ws_url(), token(user));

    // A watcher on A asks for joins and leaves.
    let mut watcher = connect(&url(&a, "watcher")).await;
    sub(&mut watcher, "room.x", true).await;
    let (me, _) = watch_until(&mut watcher, Duration::from_secs(5), |j, _| !j.is_empty()).await;

    // Four members on B (two users), one more on A.
    let mut on_b = Vec::new();
    for user in ["bob", "bob", "carol", "carol"] {
        let mut w = connect(&url(&b, user)).await;
        sub(&mut w, "room.x", false).await;
        on_b.push(w);
    }
    let mut on_a = connect(&url(&a, "dave")).await;
    sub(&mut on_a, "room.x", false).await;
    let (joined, _) = watch_until(&mut watcher, Duration::from_secs(5), |j, _| j.len() == 5).await;
    assert!(joined.is_disjoint(&me));

    // Either node lists and counts all six (pages of 3 through Redis's cursor).
    let from_a = members(&mut on_a, "room.x").await;
    let from_b = members(&mut on_b[0], "room.x").await;
    assert_eq!(from_a.len(), 6, "{from_a:?}");
    assert_eq!(from_a, from_b);
    let users: BTreeSet<&str> = from_a.iter().map(|(_, u)| u.as_str()).collect();
    assert_eq!(users, ["bob", "carol", "dave", "watcher"].into_iter().collect());
    assert_eq!(stats(&mut on_a, "room.x").await, (6, 4));
    let b_clients: BTreeSet<String> =
        from_a.iter().filter(|(_, u)| u == "bob" || u == "carol").map(|(c, _)| c.clone()).collect();

    // B dies without a word: its four members leave within the TTL (3 s, refreshed every 1 s).
    b.signal(libc::SIGKILL);
    let killed = Instant::now();
    let (_, left) = watch_until(&mut watcher, Duration::from_secs(8), |_, l| l.len() == 4).await;
    let took = killed.elapsed();
    assert_eq!(left, b_clients);
    eprintln!("a killed node's 4 members left after {took:?} (member_ttl_ms 3000)");
    assert!(took < Duration::from_millis(3000 + 1000 + 1500), "{took:?}");
    assert_eq!(stats(&mut on_a, "room.x").await, (2, 2));
    drop(on_b);
}
