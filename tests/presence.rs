//! Presence on one node (memory broker; docs/protocol.md, "Presence"), through
//! tokio-tungstenite, the independent client: who is in a channel (paged), how many, joins and
//! leaves coalesced per window and shared, `presence_reset` past `presence.max_diff`, members
//! past `presence_max_members` untracked, JWT `sub` and `info` as member identity, and the
//! refusals (`presence_off`, `forbidden`). The herd bound is `presence_herd.rs`.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::auth::{claims, hs256, hs256_config, now_s};
use common::tung::{self, connect, next_json, quiet, send, Ws};
use common::Server;
use serde_json::{json, Value};

/// A presence room with join/leave (window 300 ms, pages of 2) and a plain channel.
fn config(extra: &str) -> String {
    format!(
        "[presence]\nwindow_ms = 300\npage_size = 2\nmax_diff = 4\n\
         [[channels]]\npattern = \"room.*\"\npresence = true\njoin_leave = true\npresence_max_members = 6\n\
         [[channels]]\npattern = \"quiet.*\"\npresence = true\n\
         {extra}"
    )
}

/// Subscribes `ws` to `ch` (with join/leave when asked) and returns the `subscribed` answer.
async fn sub(ws: &mut Ws, ch: &str, join_leave: bool) -> Value {
    send(ws, json!({"op": "sub", "ch": ch, "join_leave": join_leave})).await;
    let v = next_json(ws).await;
    assert_eq!(v["op"], "subscribed", "{v}");
    v
}

/// Every member of `ch`, following `next` page by page.
async fn all_members(ws: &mut Ws, ch: &str) -> Vec<Value> {
    let mut members = Vec::new();
    let mut cursor = Value::Null;
    for _ in 0..100 {
        send(ws, json!({"op": "presence", "ch": ch, "cursor": cursor})).await;
        let page = next_json(ws).await;
        assert_eq!((page["op"].as_str(), page["ch"].as_str()), (Some("presence"), Some(ch)), "{page}");
        let list = page["members"].as_array().expect("members").clone();
        assert!(list.len() <= 2, "a page holds at most presence.page_size members: {page}");
        members.extend(list);
        match page.get("next") {
            Some(n) => cursor = n.clone(),
            None => return members,
        }
    }
    panic!("more than 100 pages");
}

async fn stats(ws: &mut Ws, ch: &str) -> (u64, u64) {
    send(ws, json!({"op": "presence_stats", "ch": ch})).await;
    let v = next_json(ws).await;
    assert_eq!(v["op"], "presence_stats", "{v}");
    (v["clients"].as_u64().expect("clients"), v["users"].as_u64().expect("users"))
}

/// The next presence frame (`presence_diff` or `presence_reset`) of `ch` within `limit`.
async fn next_presence(ws: &mut Ws, limit: Duration) -> Value {
    match tung::read_within(ws, limit).await {
        tung::Read::Json(v) if v["op"] == "presence_diff" || v["op"] == "presence_reset" => v,
        other => panic!("expected a presence frame, got {other:?}"),
    }
}

fn clients(list: &Value) -> BTreeSet<String> {
    list.as_array().expect("array").iter().map(|m| m["client"].as_str().expect("client").to_owned()).collect()
}

#[tokio::test]
async fn members_are_listed_paged_and_counted() {
    let srv = Server::start(&config(""), &[]);
    let mut ws = Vec::new();
    for _ in 0..5 {
        let mut w = connect(&srv.ws_url()).await;
        sub(&mut w, "room.a", false).await;
        ws.push(w);
    }
    let mut asker = connect(&srv.ws_url()).await;
    // Not subscribed itself: presence needs the channel's sub right, not a subscription.
    let members = all_members(&mut asker, "room.a").await;
    assert_eq!(members.len(), 5, "{members:?}");
    let ids: BTreeSet<&str> = members.iter().map(|m| m["client"].as_str().expect("client")).collect();
    assert_eq!(ids.len(), 5, "client ids are unique: {members:?}");
    assert!(
        members.iter().all(|m| m.get("user").is_none() && m.get("info").is_none()),
        "no auth: no user: {members:?}"
    );
    assert_eq!(stats(&mut asker, "room.a").await, (5, 0));
    // A member that leaves (TCP closed without a close frame) is gone from the list.
    drop(ws.pop());
    common::eventually(Duration::from_secs(5), "the member that left is gone", || async {
        let n = all_members(&mut connect(&srv.ws_url()).await, "room.a").await.len();
        common::check(n == 4, || format!("{n} members"))
    })
    .await;
    // The server API answers the same (GET /api/presence…, from loopback without an admin
    // token), pages and counts alike.
    let api = |path: String| async move {
        let (status, _, body) = common::http_request(srv.addr, "GET", &path, &[], b"").await;
        (status, serde_json::from_slice::<Value>(&body).expect("JSON body"))
    };
    let (status, page) = api("/api/presence/room.a".into()).await;
    assert_eq!((status, page["members"].as_array().map(Vec::len)), (200, Some(2)), "{page}");
    let (_, rest) = api(format!("/api/presence/room.a?cursor={}", page["next"].as_str().expect("next"))).await;
    assert_eq!(rest["members"].as_array().map(Vec::len), Some(2), "{rest}");
    let (status, stats_body) = api("/api/presence_stats/room.a".into()).await;
    assert_eq!((status, stats_body), (200, json!({"ch": "room.a", "clients": 4, "users": 0})));
    let (status, refused) = api("/api/presence/plain".into()).await;
    assert_eq!((status, refused["field"].as_str()), (400, Some("ch")), "{refused}");
    // An unknown channel of a presence rule is empty, not an error.
    assert_eq!(all_members(&mut asker, "room.nobody").await, Vec::<Value>::new());
    assert_eq!(stats(&mut asker, "room.nobody").await, (0, 0));
}

#[tokio::test]
async fn joins_and_leaves_arrive_coalesced_in_one_diff_per_window() {
    let srv = Server::start(&config(""), &[]);
    let mut watcher = connect(&srv.ws_url()).await;
    sub(&mut watcher, "room.b", true).await;
    // The watcher's own join is announced to it in the first window.
    let first = next_presence(&mut watcher, Duration::from_secs(5)).await;
    assert_eq!((first["op"].as_str(), first["joins"].as_array().map(Vec::len)), (Some("presence_diff"), Some(1)));
    let me = clients(&first["joins"]);

    // Within one window: two join, and one of them leaves again (it never shows).
    let mut a = connect(&srv.ws_url()).await;
    let mut b = connect(&srv.ws_url()).await;
    sub(&mut a, "room.b", false).await;
    sub(&mut b, "room.b", false).await;
    send(&mut b, json!({"op": "unsub", "ch": "room.b"})).await;
    assert_eq!(next_json(&mut b).await["op"], "unsubscribed");
    let diff = next_presence(&mut watcher, Duration::from_secs(5)).await;
    assert_eq!(diff["op"], "presence_diff", "{diff}");
    assert_eq!(diff["leaves"], json!([]), "b joined and left within the window: {diff}");
    let joined = clients(&diff["joins"]);
    assert_eq!(joined.len(), 1, "{diff}");
    let members: BTreeSet<String> =
        all_members(&mut b, "room.b").await.iter().map(|m| m["client"].as_str().unwrap().to_owned()).collect();
    assert_eq!(members, me.union(&joined).cloned().collect(), "the diffs add up to the list");

    // a's connection drops: its leave arrives, and a subscriber without join_leave gets none.
    let mut plain = connect(&srv.ws_url()).await;
    sub(&mut plain, "room.b", false).await;
    let diff = next_presence(&mut watcher, Duration::from_secs(5)).await; // plain's join
    assert_eq!(diff["joins"].as_array().map(Vec::len), Some(1), "{diff}");
    drop(a);
    let diff = next_presence(&mut watcher, Duration::from_secs(5)).await;
    assert_eq!(clients(&diff["leaves"]), joined, "{diff}");
    assert_eq!(diff["joins"], json!([]));
    quiet(&mut plain, Duration::from_millis(700)).await;
}

#[tokio::test]
async fn a_window_past_max_diff_sends_one_reset() {
    let srv = Server::start(&config(""), &[]);
    let mut watcher = connect(&srv.ws_url()).await;
    sub(&mut watcher, "room.c", true).await;
    next_presence(&mut watcher, Duration::from_secs(5)).await; // its own join
                                                               // Six subscribe in one window: five are tracked (presence_max_members = 6 with the
                                                               // watcher), and five changes are more than max_diff = 4: one presence_reset, then quiet.
    let mut others = Vec::new();
    for _ in 0..6 {
        let mut w = connect(&srv.ws_url()).await;
        sub(&mut w, "room.c", false).await;
        others.push(w);
    }
    let reset = next_presence(&mut watcher, Duration::from_secs(5)).await;
    assert_eq!(reset, json!({"op": "presence_reset", "ch": "room.c"}));
    quiet(&mut watcher, Duration::from_millis(700)).await;
    // presence_max_members = 6: the watcher and five others are tracked, one is not.
    assert_eq!(stats(&mut watcher, "room.c").await, (6, 0));
    let untracked = srv.metric("tether_presence_untracked_total", &[]).await;
    assert_eq!(untracked, 1.0);
    let resets = srv.metric("tether_presence_windows_total", &["kind=\"reset\""]).await;
    assert_eq!(resets, 1.0);
}

#[tokio::test]
async fn tokens_give_members_their_user_and_info_and_rights_apply() {
    let srv = Server::start(&config(&hs256_config(5000)), &[]);
    let exp = now_s() + 600;
    let mut ada = claims("ada", exp, &["room.*"], &[]);
    ada.info = Some(json!({"name": "Ada", "color": "#f00"}));
    let bob = claims("bob", exp, &["room.*"], &[]);
    let outsider = claims("eve", exp, &["other.*"], &[]);
    let url = |t: &str| format!("{}?token={t}", srv.ws_url());
    let mut a1 = connect(&url(&hs256(&ada))).await;
    let mut a2 = connect(&url(&hs256(&ada))).await;
    let mut b = connect(&url(&hs256(&bob))).await;
    for w in [&mut a1, &mut a2, &mut b] {
        sub(w, "room.d", false).await;
    }
    let members = all_members(&mut b, "room.d").await;
    let mut seen: Vec<(String, Value)> = members
        .iter()
        .map(|m| (m["user"].as_str().expect("user").to_owned(), m.get("info").cloned().unwrap_or(Value::Null)))
        .collect();
    seen.sort_by(|x, y| x.0.cmp(&y.0));
    let info = json!({"name": "Ada", "color": "#f00"});
    assert_eq!(seen, vec![("ada".into(), info.clone()), ("ada".into(), info), ("bob".into(), Value::Null)]);
    assert_eq!(stats(&mut b, "room.d").await, (3, 2), "3 connections, 2 users");
    // No sub right on the channel: forbidden, and the connection stays.
    let mut e = connect(&url(&hs256(&outsider))).await;
    send(&mut e, json!({"op": "presence", "ch": "room.d"})).await;
    let v = next_json(&mut e).await;
    assert_eq!((v["code"].as_str(), v["ch"].as_str()), (Some("forbidden"), Some("room.d")), "{v}");
    // An info claim larger than presence.info_max_bytes (1024) is refused at the upgrade.
    let mut big = claims("big", exp, &["room.*"], &[]);
    big.info = Some(json!({"pad": "x".repeat(2000)}));
    let err = tokio_tungstenite::connect_async(url(&hs256(&big))).await.expect_err("refused");
    assert!(err.to_string().contains("401"), "{err}");
}

#[tokio::test]
async fn presence_off_and_join_leave_off_are_refused_by_name() {
    let srv = Server::start(&config(""), &[]);
    let mut ws = connect(&srv.ws_url()).await;
    send(&mut ws, json!({"op": "presence", "ch": "plain"})).await;
    let v = next_json(&mut ws).await;
    assert_eq!((v["code"].as_str(), v["ch"].as_str()), (Some("presence_off"), Some("plain")), "{v}");
    send(&mut ws, json!({"op": "presence_stats", "ch": "plain"})).await;
    assert_eq!(next_json(&mut ws).await["code"], "presence_off");
    // quiet.* has presence but no join_leave: a sub asking for it is refused, not subscribed.
    send(&mut ws, json!({"op": "sub", "ch": "quiet.x", "join_leave": true})).await;
    let v = next_json(&mut ws).await;
    assert_eq!((v["code"].as_str(), v["ch"].as_str()), (Some("presence_off"), Some("quiet.x")), "{v}");
    assert_eq!(stats(&mut ws, "quiet.x").await, (0, 0));
    // A cursor this server did not give is a bad request naming the channel.
    send(&mut ws, json!({"op": "presence", "ch": "quiet.x", "cursor": "not-a-cursor"})).await;
    let v = next_json(&mut ws).await;
    assert_eq!((v["code"].as_str(), v["ch"].as_str()), (Some("bad_request"), Some("quiet.x")), "{v}");
}

#[tokio::test]
async fn answers_about_a_channel_keep_their_order_behind_a_presence_query() {
    // 30 presence requests in a few ms: past the default presence_rate (10/s).
    let srv = Server::start(&config("[limits.per_connection]\npresence_rate = 0\n"), &["--cores", "2"]);
    let mut ws = connect(&srv.ws_url()).await;
    for round in 0..10 {
        let ch = format!("room.o{round}");
        sub(&mut ws, &ch, false).await;
        // Each request is its own write; the presence queries go to the channel's home core,
        // the unsub and sub are answered from here: the answers still come in request order.
        for op in ["presence", "unsub", "presence_stats", "sub", "presence"] {
            send(&mut ws, json!({"op": op, "ch": ch})).await;
        }
        let mut ops = Vec::new();
        for _ in 0..5 {
            let v = next_json(&mut ws).await;
            assert_eq!(v["ch"].as_str(), Some(ch.as_str()), "{v}");
            ops.push(v["op"].as_str().expect("op").to_owned());
        }
        assert_eq!(ops, ["presence", "unsubscribed", "presence_stats", "subscribed", "presence"], "round {round}");
        send(&mut ws, json!({"op": "unsub", "ch": ch})).await;
        assert_eq!(next_json(&mut ws).await["op"], "unsubscribed");
    }
}

#[tokio::test]
async fn a_connection_the_server_closes_leaves_its_channels_at_once() {
    // The close handshake may take close_timeout_ms (30 s here) when the peer never answers;
    // the member must not stay listed that long.
    let srv = Server::start(&config(&format!("[limits]\nclose_timeout_ms = 30000\n{}", hs256_config(5000))), &[]);
    let exp = now_s() + 600;
    let url = |user: &str| format!("{}?token={}", srv.ws_url(), hs256(&claims(user, exp, &["room.*"], &[])));
    let mut watcher = connect(&url("watcher")).await;
    sub(&mut watcher, "room.k", true).await;
    let joined = next_presence(&mut watcher, Duration::from_secs(3)).await;
    assert_eq!(joined["op"], "presence_diff", "{joined}");
    let mut victim = connect(&url("victim")).await;
    sub(&mut victim, "room.k", false).await;
    let joined = next_presence(&mut watcher, Duration::from_secs(3)).await;
    assert_eq!(joined["joins"][0]["user"], "victim", "{joined}");
    // The server closes the victim's connection; the victim never reads, so never answers.
    let answer = common::api::post_ok(srv.addr, "/api/disconnect", json!({"user": "victim"})).await;
    assert_eq!(answer["closed"], 1, "{answer}");
    let left = next_presence(&mut watcher, Duration::from_secs(3)).await;
    assert_eq!(
        (left["joins"].as_array().map(Vec::len), left["leaves"][0]["user"].as_str()),
        (Some(0), Some("victim")),
        "{left}"
    );
    assert_eq!(stats(&mut watcher, "room.k").await, (1, 1));
    drop(victim);
}

#[tokio::test]
async fn large_infos_make_shorter_pages_and_a_reset_never_a_1013() {
    // queue_max_bytes 64 KiB: no presence frame may take more than 16 KiB. 30 members with
    // 1.5 KB of info each are 45 KB: several pages, and their joins in one window a reset.
    let cfg = format!(
        "[limits]\nqueue_max_bytes = 65536\nmax_publish_bytes = 8192\nmax_message_bytes = 8192\n\
         [presence]\nwindow_ms = 300\npage_size = 1000\nmax_diff = 1000\ninfo_max_bytes = 2048\n\
         [[channels]]\npattern = \"room.*\"\npresence = true\njoin_leave = true\n{}",
        hs256_config(5000)
    );
    let srv = Server::start(&cfg, &[]);
    let exp = now_s() + 600;
    let url = |user: &str, info: Option<Value>| {
        let mut c = claims(user, exp, &["room.*"], &[]);
        c.info = info;
        format!("{}?token={}", srv.ws_url(), hs256(&c))
    };
    let mut watcher = connect(&url("watcher", None)).await;
    sub(&mut watcher, "room.big", true).await;
    assert_eq!(next_presence(&mut watcher, Duration::from_secs(3)).await["op"], "presence_diff");
    let mut members = Vec::new();
    for i in 0..30 {
        let mut w = connect(&url(&format!("m{i}"), Some(json!({"bio": "é".repeat(700), "n": i})))).await;
        sub(&mut w, "room.big", false).await;
        members.push(w);
    }
    let reset = next_presence(&mut watcher, Duration::from_secs(3)).await;
    assert_eq!(reset["op"], "presence_reset", "30 joins of 45 KB pass the 16 KiB bound: {reset}");
    let mut seen = BTreeSet::new();
    let mut pages = 0;
    let mut cursor = Value::Null;
    loop {
        send(&mut watcher, json!({"op": "presence", "ch": "room.big", "cursor": cursor})).await;
        let page = match tung::read_within(&mut watcher, Duration::from_secs(5)).await {
            tung::Read::Json(v) if v["op"] == "presence" => v,
            other => panic!("expected a page, got {other:?}"),
        };
        pages += 1;
        assert!(pages <= 31, "pages end");
        seen.extend(clients(&page["members"]));
        match page.get("next") {
            Some(n) => cursor = n.clone(),
            None => break,
        }
    }
    assert_eq!(seen.len(), 31, "every member once, the watcher included");
    assert!(pages >= 3, "45 KB of members in pages of at most 16 KiB: {pages} pages");
    quiet(&mut watcher, Duration::from_millis(200)).await;
}
