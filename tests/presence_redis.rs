//! Presence across nodes (Redis broker; docs/redis.md, "Presence"): two tether nodes on one
//! real `redis-server`. Members on either node are listed and counted from either; a join on
//! one node reaches a `join_leave` subscriber on the other as a coalesced `presence_diff`; and
//! when a node is killed with `kill -9`, its members disappear within `presence.member_ttl_ms`
//! (3 s here) and the other node's subscribers see their leaves. Pages never exceed
//! `page_size` and paging through a changing channel lists each member present throughout
//! exactly once (both encodings of Redis's sorted set); a cursor the server did not give is
//! `bad_request` / 400, never Redis's error; users are counted whatever their `info` holds.
//! When changes may have been lost (Redis restarted empty, a node's calls failed while Redis
//! stalled), `join_leave` subscribers get `presence_reset` and the members are written back.
//! Through tokio-tungstenite and the HTTP API.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use base64::Engine;
use common::api::{call, get_ok};
use common::auth::{claims, hs256, hs256_config, now_s, SECRET};
use common::redis::RedisProc;
use common::tung::{self, connect, next_json, send, Ws};
use common::{wait_ready, Server, STEP};
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

/// A token for `user` on `room.*` whose `info` is `info`, raw JSON text that a
/// `serde_json::Value` cannot hold (a lone surrogate escape), signed by hand (RFC 7519 §7.1).
fn token_with_raw_info(user: &str, info: &str) -> String {
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let header = b64(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims =
        format!(r#"{{"sub":"{user}","exp":{},"channels":{{"sub":["room.*"],"pub":[]}},"info":{info}}}"#, now_s() + 600);
    let input = format!("{header}.{}", b64(claims.as_bytes()));
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).expect("key");
    let sig = jsonwebtoken::crypto::sign(input.as_bytes(), &key, jsonwebtoken::Algorithm::HS256).expect("sign");
    format!("{input}.{sig}")
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

/// Two nodes on `redis` with [`config`], both ready.
async fn two_nodes(redis: &RedisProc) -> (Server, Server) {
    let cfg = config(&redis.url());
    let (a, b) = (Server::start(&cfg, &[]), Server::start(&cfg, &[]));
    wait_ready(a.addr, STEP).await;
    wait_ready(b.addr, STEP).await;
    (a, b)
}

/// The WebSocket URL of `srv` with a token of `user` (sub on `room.*`, ten minutes).
fn member_url(srv: &Server, user: &str) -> String {
    format!("{}?token={}", srv.ws_url(), hs256(&claims(user, now_s() + 600, &["room.*"], &[])))
}

/// The pages of `ch` from `cursor` on (`Null`: from the first), each as `(client, user)`.
async fn pages(ws: &mut Ws, ch: &str, mut cursor: Value) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    for _ in 0..1000 {
        send(ws, json!({"op": "presence", "ch": ch, "cursor": cursor})).await;
        let page = next_json(ws).await;
        assert_eq!(page["op"], "presence", "{page}");
        out.push(
            page["members"]
                .as_array()
                .expect("members")
                .iter()
                .map(|m| (m["client"].as_str().unwrap().to_owned(), m["user"].as_str().unwrap_or("").to_owned()))
                .collect(),
        );
        match page.get("next") {
            Some(n) => cursor = n.clone(),
            None => return out,
        }
    }
    panic!("more than 1000 pages");
}

/// Every member of `ch` through `GET /api/presence/{ch}` on `srv`, following `next`, as
/// `user → client` (the tests give each member its own user).
async fn api_members(srv: &Server, ch: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut path = format!("/api/presence/{ch}");
    for _ in 0..1000 {
        let page = get_ok(srv.addr, &path).await;
        for m in page["members"].as_array().unwrap_or_else(|| panic!("GET {path}: {page}")) {
            out.insert(m["user"].as_str().unwrap().to_owned(), m["client"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some(n) => path = format!("/api/presence/{ch}?cursor={n}"),
            None => return out,
        }
    }
    panic!("more than 1000 pages");
}

/// `(clients, users)` of `ch` through `GET /api/presence_stats/{ch}` on `srv`.
async fn api_stats(srv: &Server, ch: &str) -> (u64, u64) {
    let v = get_ok(srv.addr, &format!("/api/presence_stats/{ch}")).await;
    (v["clients"].as_u64().unwrap(), v["users"].as_u64().unwrap())
}

/// Waits until `srv` lists exactly the users `want` in `ch`, within `limit`.
async fn wait_members(srv: &Server, ch: &str, want: &[&str], limit: Duration) -> BTreeMap<String, String> {
    let want: BTreeSet<String> = want.iter().map(|u| u.to_string()).collect();
    common::eventually(limit, &format!("{ch} listing {want:?}"), || async {
        let got = api_members(srv, ch).await;
        if got.keys().cloned().collect::<BTreeSet<_>>() == want {
            Ok(got)
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await
}

/// Reads frames of `ws` until a `presence_reset` of `ch` arrives within `limit` (the channel's
/// `reset`s and `presence_diff`s meanwhile are passed over).
async fn until_presence_reset(ws: &mut Ws, ch: &str, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        let rest = end.checked_duration_since(Instant::now()).unwrap_or_else(|| panic!("no presence_reset"));
        match tung::read_within(ws, rest).await {
            tung::Read::Json(v) if v["op"] == "presence_reset" => {
                assert_eq!(v, json!({"op": "presence_reset", "ch": ch}));
                return;
            }
            tung::Read::Json(v) if v["op"] == "presence_diff" || v["op"] == "reset" => {}
            other => panic!("expected presence frames, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn pages_hold_at_most_page_size_and_list_every_member_present_throughout_once() {
    let redis = RedisProc::start();
    let (a, b) = two_nodes(&redis).await;
    let url = |srv: &Server, token: &str| format!("{}?token={token}", srv.ws_url());
    let errors = a.metric("tether_broker_errors_total", &["kind=\"server\""]).await
        + b.metric("tether_broker_errors_total", &["kind=\"server\""]).await;

    // Both encodings of the entries' sorted set: a listpack (small) and a skiplist.
    for (ch, encoding, max_value) in [("room.lp", "listpack", "4096"), ("room.sk", "skiplist", "0")] {
        redis.cli(&["CONFIG", "SET", "zset-max-listpack-value", max_value]);
        // Nine members over both nodes, each its own user.
        let mut ws: BTreeMap<String, Ws> = BTreeMap::new();
        for i in 0..9 {
            let user = format!("u{i}");
            let mut w = connect(&member_url(if i % 2 == 0 { &a } else { &b }, &user)).await;
            sub(&mut w, ch, false).await;
            ws.insert(user, w);
        }
        let all: Vec<String> = ws.keys().cloned().collect();
        wait_members(&a, ch, &all.iter().map(String::as_str).collect::<Vec<_>>(), Duration::from_secs(5)).await;
        assert_eq!(api_stats(&a, ch).await, (9, 9), "{ch}");
        assert_eq!(redis.cli(&["OBJECT", "ENCODING", &format!("tether:{{{ch}}}:pl")]).trim(), encoding);

        // Pages of at most 3 (`page_size`), nobody twice.
        let listed = pages(ws.get_mut("u0").unwrap(), ch, Value::Null).await;
        assert!(listed.iter().all(|p| p.len() <= 3), "{ch}: {listed:?}");
        let flat: Vec<&String> = listed.iter().flatten().map(|(_, u)| u).collect();
        assert_eq!(flat.len(), 9, "{ch}: {listed:?}");
        assert_eq!(flat.into_iter().cloned().collect::<BTreeSet<_>>(), all.iter().cloned().collect());

        // Paging while the channel changes: after the first page, a member listed on it and
        // one not listed yet leave, two newcomers join; the rest follow from its cursor.
        send(ws.get_mut("u0").unwrap(), json!({"op": "presence", "ch": ch})).await;
        let first = next_json(ws.get_mut("u0").unwrap()).await;
        let first_users: Vec<String> =
            first["members"].as_array().unwrap().iter().map(|m| m["user"].as_str().unwrap().to_owned()).collect();
        assert_eq!(first_users.len(), 3, "{first}");
        let gone_listed = first_users.iter().find(|u| *u != "u0").unwrap().clone();
        let gone_unlisted = all.iter().find(|u| !first_users.contains(u) && *u != "u0").unwrap().clone();
        drop(ws.remove(&gone_listed));
        drop(ws.remove(&gone_unlisted));
        for (user, srv) in [("n0", &a), ("n1", &b)] {
            let mut w = connect(&member_url(srv, user)).await;
            sub(&mut w, ch, false).await;
            ws.insert(user.into(), w);
        }
        let now: Vec<String> = ws.keys().cloned().collect();
        wait_members(&b, ch, &now.iter().map(String::as_str).collect::<Vec<_>>(), Duration::from_secs(5)).await;
        let rest = pages(ws.get_mut("u0").unwrap(), ch, first["next"].clone()).await;
        assert!(rest.iter().all(|p| p.len() <= 3), "{ch}: {rest:?}");
        let mut seen: BTreeMap<String, usize> = first_users.iter().map(|u| (u.clone(), 1)).collect();
        for (_, u) in rest.iter().flatten() {
            *seen.entry(u.clone()).or_default() += 1;
        }
        assert!(seen.values().all(|n| *n == 1), "{ch}: listed twice: {seen:?}");
        for u in all.iter().filter(|u| **u != gone_listed && **u != gone_unlisted) {
            assert!(seen.contains_key(u), "{ch}: {u}, present throughout, missed: {seen:?}");
        }
        assert!(!seen.contains_key(&gone_unlisted), "{ch}: {gone_unlisted} left before its page");
    }

    // A member whose `info` holds a lone surrogate escape (JSON text the token's parser takes
    // and Redis's cjson refuses) is counted as a user, and counted down when it leaves.
    let mut plain = connect(&member_url(&a, "plain")).await;
    sub(&mut plain, "room.u", false).await;
    let mut odd = connect(&url(&b, &token_with_raw_info("odd", r#"{"n":"\ud800"}"#))).await;
    sub(&mut odd, "room.u", false).await;
    let stats = |want| {
        let a = &a;
        common::eventually(Duration::from_secs(5), "room.u's stats", move || async move {
            let got = api_stats(a, "room.u").await;
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        })
    };
    stats((2, 2)).await;
    drop(odd);
    stats((1, 1)).await;

    // Cursors the server did not give: `bad_request` naming `cursor` (WebSocket) and 400 with
    // field `cursor` (API), not Redis's error as `unavailable`.
    let mut ws = connect(&member_url(&a, "asker")).await;
    for cursor in
        ["18446744073709551616", "99999999999999999999", "0", "x", "n-0-1-18446744073709551616", "n\u{0}-0-1-1"]
    {
        send(&mut ws, json!({"op": "presence", "ch": "room.lp", "cursor": cursor})).await;
        let v = next_json(&mut ws).await;
        assert_eq!(
            (v["op"].as_str(), v["code"].as_str(), v["ch"].as_str()),
            (Some("error"), Some("bad_request"), Some("room.lp")),
            "{cursor:?}: {v}"
        );
        assert!(v.get("retry_after_ms").is_none(), "{v}");
        assert!(v["reason"].as_str().unwrap().contains("cursor"), "{v}");
    }
    for cursor in ["18446744073709551616", "99999999999999999999", "0", "x", "n-0-1-18446744073709551616", "n%00-0-1-1"]
    {
        let r = call(a.addr, "GET", &format!("/api/presence/room.lp?cursor={cursor}"), &[], "").await;
        assert_eq!((r.status, r.field()), (400, "cursor"), "{cursor}: {r:?}");
    }
    let after = a.metric("tether_broker_errors_total", &["kind=\"server\""]).await
        + b.metric("tether_broker_errors_total", &["kind=\"server\""]).await;
    assert_eq!(after, errors, "no request failed in redis");
}

#[tokio::test]
async fn redis_restarting_empty_resets_join_leave_subscribers_and_members_are_written_back() {
    let mut redis = RedisProc::start();
    let (a, b) = two_nodes(&redis).await;
    let mut watcher = connect(&member_url(&a, "watcher")).await;
    sub(&mut watcher, "room.r", true).await;
    let mut members = BTreeMap::new();
    for (user, srv) in [("a1", &a), ("a2", &a), ("b1", &b), ("b2", &b)] {
        let mut w = connect(&member_url(srv, user)).await;
        sub(&mut w, "room.r", false).await;
        members.insert(user, w);
    }
    watch_until(&mut watcher, Duration::from_secs(5), |j, _| j.len() == 5).await;

    // Redis dies; while it is down a2 unsubscribes and b1's connection closes: their leaves
    // cannot be written, and Redis comes back with nothing.
    redis.kill9();
    for srv in [&a, &b] {
        srv.wait_metric("tether_broker_up", &[], Duration::from_secs(5), |v| v == 0.0).await;
    }
    let a2 = members.get_mut("a2").unwrap();
    send(a2, json!({"op": "unsub", "ch": "room.r"})).await;
    assert_eq!(next_json(a2).await["op"], "unsubscribed");
    drop(members.remove("b1"));
    b.wait_gauge(1.0, Duration::from_secs(5)).await;
    redis.restart();

    // The watcher is told to fetch again, and what it fetches is right: the nodes wrote their
    // live members back, and the two that left are not among them.
    until_presence_reset(&mut watcher, "room.r", Duration::from_secs(10)).await;
    for srv in [&a, &b] {
        wait_members(srv, "room.r", &["watcher", "a1", "b2"], Duration::from_secs(5)).await;
    }
    assert_eq!(api_stats(&a, "room.r").await, (3, 3));
}

#[tokio::test]
async fn a_node_whose_leave_failed_has_every_node_reset_its_join_leave_subscribers() {
    let redis = RedisProc::start();
    let (a, b) = two_nodes(&redis).await;
    let mut watcher = connect(&member_url(&a, "watcher")).await;
    sub(&mut watcher, "room.s", true).await;
    let mut m1 = connect(&member_url(&b, "m1")).await;
    sub(&mut m1, "room.s", false).await;
    let mut m2 = connect(&member_url(&b, "m2")).await;
    sub(&mut m2, "room.s", false).await;
    watch_until(&mut watcher, Duration::from_secs(5), |j, _| j.len() == 3).await;

    // Redis loses the channel's presence and a key of the wrong type takes its place (an
    // operator's mistake under `key_prefix`): B's call writing m1's leave fails in Redis, and
    // so does every refresh, with both links up and the channel's epoch unchanged.
    let [pz, pl, pu] = ["pz", "pl", "pu"].map(|k| format!("tether:{{room.s}}:{k}"));
    redis.cli(&["DEL", &pz, &pl, &pu]);
    redis.cli(&["SET", &pz, "not a sorted set"]);
    drop(m1);
    b.wait_metric("tether_presence_members", &[], Duration::from_secs(5), |v| v == 1.0).await;
    assert!(b.metric("tether_broker_errors_total", &["kind=\"server\""]).await >= 1.0);
    // Asked meanwhile: 503, with Redis's own error (its script hash, its line) left to the log.
    let r = call(a.addr, "GET", "/api/presence_stats/room.s", &[], "").await;
    assert_eq!(r.status, 503, "{r:?}");
    let text = r.body.to_string();
    assert!(!text.contains("WRONGTYPE") && !text.contains("f_") && !text.contains("script"), "{text}");
    redis.cli(&["DEL", &pz]);

    // Once the nodes write again, they write their members back and B, which could not write
    // m1's leave, says so: the watcher is told to fetch again, and m1 is gone.
    until_presence_reset(&mut watcher, "room.s", Duration::from_secs(5)).await;
    wait_members(&a, "room.s", &["watcher", "m2"], Duration::from_secs(5)).await;
    assert_eq!(api_stats(&a, "room.s").await, (2, 2));
    drop(m2);
}

#[tokio::test]
async fn large_infos_make_shorter_pages() {
    // queue_max_bytes 64 KiB: no page may hold more than 16 KiB of members. 14 members with
    // about 1.5 KB of info each are about 21 KB: at least two pages of at most 16 KiB, where
    // page_size alone would allow one.
    let redis = RedisProc::start();
    let cfg = format!(
        "[broker]\nkind = \"redis\"\nurl = \"{}\"\n\
         [limits]\nqueue_max_bytes = 65536\nmax_publish_bytes = 8192\nmax_message_bytes = 8192\n\
         [presence]\npage_size = 1000\ninfo_max_bytes = 2048\n\
         [[channels]]\npattern = \"room.*\"\npresence = true\n{}",
        redis.url(),
        hs256_config(5000)
    );
    let srv = Server::start(&cfg, &[]);
    wait_ready(srv.addr, STEP).await;
    let mut members = Vec::new();
    for i in 0..14 {
        let mut c = claims(&format!("m{i}"), now_s() + 600, &["room.*"], &[]);
        c.info = Some(json!({"bio": "é".repeat(700), "n": i}));
        let mut w = connect(&format!("{}?token={}", srv.ws_url(), hs256(&c))).await;
        sub(&mut w, "room.big", false).await;
        members.push(w);
    }
    common::eventually(Duration::from_secs(5), "14 members counted", || async {
        match api_stats(&srv, "room.big").await {
            (14, 14) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let listed = pages(&mut members[0], "room.big", Value::Null).await;
    let users: BTreeSet<&String> = listed.iter().flatten().map(|(_, u)| u).collect();
    assert_eq!(users.len(), 14, "every member once");
    assert!(listed.len() >= 2, "about 21 KB of members in pages of at most 16 KiB: {} pages", listed.len());
    // Each member's JSON is about 1,480 bytes (700 two-byte characters and its fields): at
    // most 11 fit 16 KiB.
    assert!(listed.iter().all(|p| p.len() <= 11), "{:?}", listed.iter().map(Vec::len).collect::<Vec<_>>());
}
