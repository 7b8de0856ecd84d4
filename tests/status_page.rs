//! The live status page (docs/operations.md, "Status page"; docs/http.md): `GET /status` and
//! its assets are served from the binary with the right types and headers, HEAD and 405
//! follow the rules of the other endpoints, the page and `/status.json` sit behind the admin
//! guard (token, or local peers), and `/status.json` says what `/metrics` says after known
//! traffic: N connections, M publishes, overflows under two policies, presence members and
//! windows, and lists the presence channels with the most members. Real server, real sockets;
//! the browser side is `tests/status_page_browser.rs`.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::raw_http::{ask, RawHttp, Response};
use common::*;
use serde_json::Value;

const ADMIN: &str = "adm-5c1e0f9a7b3d2e64";

fn request(addr: std::net::SocketAddr, method: &str, path: &str, bearer: Option<&str>) -> String {
    let auth = bearer.map(|b| format!("Authorization: Bearer {b}\r\n")).unwrap_or_default();
    format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}\r\n")
}

/// `GET /status.json` (loopback, no token), parsed.
fn status_json(srv: &Server, query: &str) -> Value {
    let r = ask(srv.addr, &request(srv.addr, "GET", &format!("/status.json{query}"), None));
    assert_eq!(r.status, 200, "GET /status.json: {}", r.body_text());
    assert_eq!(r.header("content-type"), "application/json");
    assert_eq!(r.header("cache-control"), "no-store");
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("/status.json is not JSON ({e}): {}", r.body_text()))
}

#[test]
fn page_and_assets_are_served_with_their_types_head_and_405() {
    let srv = Server::start("", &["--cores", "1"]);
    let page = ask(srv.addr, &request(srv.addr, "GET", "/status", None));
    assert_eq!(page.status, 200, "{page:?}");
    assert_eq!(page.header("content-type"), "text/html; charset=utf-8");
    assert!(page.header("content-security-policy").contains("default-src 'none'"), "{}", page.head);
    assert_eq!(page.header("cache-control"), "no-store");
    let html = page.body_text();
    assert!(html.starts_with("<!doctype html>"), "{}", &html[..80.min(html.len())]);
    for linked in ["src=\"status/status.js\"", "href=\"status/status.css\""] {
        assert!(html.contains(linked), "the page links {linked}");
    }
    assert!(!html.contains("http://") && !html.contains("https://"), "nothing is loaded from elsewhere");
    for (path, ctype) in
        [("/status/status.js", "text/javascript; charset=utf-8"), ("/status/status.css", "text/css; charset=utf-8")]
    {
        let r = ask(srv.addr, &request(srv.addr, "GET", path, None));
        assert_eq!((r.status, r.header("content-type")), (200, ctype), "{path}");
        assert_eq!(r.header("x-content-type-options"), "nosniff", "{path}");
        assert!(!r.body.is_empty() && !r.body_text().contains("https://"), "{path}");
    }

    // HEAD: the GET's head, no content, and the connection goes on (RFC 9110 §9.3.2).
    for path in ["/status", "/status.json", "/status/status.js", "/status/status.css"] {
        let get = ask(srv.addr, &request(srv.addr, "GET", path, None));
        let mut c = RawHttp::connect(srv.addr);
        c.send(request(srv.addr, "HEAD", path, None));
        let head = c.response_to(true);
        assert_eq!((head.status, get.status), (200, 200), "HEAD {path}");
        assert_eq!(head.header("content-type"), get.header("content-type"), "HEAD {path}");
        if path != "/status.json" {
            // (The JSON's uptime and counters may change its length between two requests.)
            assert_eq!(head.header("content-length"), get.header("content-length"), "HEAD {path}");
        }
        c.send(request(srv.addr, "GET", "/healthz", None));
        assert_eq!(c.response().body_text(), r#"{"status":"ok"}"#, "after HEAD {path}");
    }

    // Methods other than GET and HEAD: 405 with Allow (RFC 9110 §15.5.6); unknown ones 501.
    for path in ["/status", "/status.json", "/status/status.js"] {
        let r = ask(srv.addr, &format!("POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n", srv.addr));
        assert_eq!((r.status, r.header("allow")), (405, "GET, HEAD"), "POST {path}");
        let r = ask(srv.addr, &request(srv.addr, "DELETE", path, None));
        assert_eq!((r.status, r.header("allow")), (405, "GET, HEAD"), "DELETE {path}");
        assert_eq!(ask(srv.addr, &request(srv.addr, "BREW", path, None)).status, 501, "BREW {path}");
    }
    assert_eq!(ask(srv.addr, &request(srv.addr, "GET", "/status/other.js", None)).status, 404);
}

#[test]
fn page_and_json_sit_behind_the_admin_token() {
    let srv = Server::start(&format!("[admin]\ntoken = \"{ADMIN}\"\n"), &["--cores", "2"]);
    let get = |path: &str, bearer: Option<&str>| ask(srv.addr, &request(srv.addr, "GET", path, bearer));

    // The page, refused, is still the page (a browser cannot send a header with a navigation;
    // the page takes the token from #token=…), with 401 and the Bearer challenge.
    let page = get("/status", None);
    assert_eq!(page.status, 401);
    assert_eq!(page.header("www-authenticate"), "Bearer realm=\"tether\"");
    assert_eq!(page.header("content-type"), "text/html; charset=utf-8");
    assert!(page.body_text().contains("id=\"auth\""), "the refused page explains the token");
    let wrong = get("/status", Some("adm-5c1e0f9a7b3d2e65"));
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("www-authenticate").contains("invalid_token"), "{}", wrong.head);
    assert_eq!(get("/status", Some(ADMIN)).status, 200);

    // The data: 401 with a JSON reason without the token or with a wrong one.
    let refused = get("/status.json", None);
    assert_eq!(refused.status, 401);
    assert_eq!(refused.header("content-type"), "application/json");
    let reason: Value = serde_json::from_slice(&refused.body).unwrap();
    assert!(reason["error"].as_str().unwrap().contains("missing bearer token"), "{reason}");
    assert_eq!(get("/status.json", Some("nope-0123456789abcdef")).status, 401);
    let ok = get("/status.json", Some(ADMIN));
    assert_eq!(ok.status, 200, "{}", ok.body_text());
    let mut c = RawHttp::connect(srv.addr);
    c.send(request(srv.addr, "HEAD", "/status.json", None));
    assert_eq!(c.response_to(true).status, 401, "HEAD is guarded like GET");

    // The assets hold no data: open.
    for path in ["/status/status.js", "/status/status.css"] {
        assert_eq!(get(path, None).status, 200, "{path}");
    }
    // Refusals of the data count as admin auth failures; the page's own 401 does not (every
    // browser that opens it gets one).
    let m = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(srv.metrics());
    assert_eq!(m.sum("tether_http_auth_failures_total", &["endpoint=\"admin\""]), 3.0);
}

#[test]
fn without_a_token_only_local_peers_get_the_data() {
    // Only 127.0.0.1 counts as local: a client bound to 127.0.0.2 stands for a remote peer.
    let srv = Server::start("[admin]\nlocal_peers = [\"127.0.0.1\"]\n", &["--cores", "1"]);
    let from = |ip: &str, path: &str| -> Response {
        let mut c = RawHttp::connect_from(ip.parse::<IpAddr>().unwrap(), srv.addr);
        c.send(request(srv.addr, "GET", path, None));
        c.response()
    };
    for path in ["/status", "/status.json"] {
        assert_eq!(from("127.0.0.2", path).status, 401, "{path} from a remote peer");
        assert_eq!(from("127.0.0.1", path).status, 200, "{path} from a local peer");
    }
    let r = from("127.0.0.2", "/status.json");
    assert!(r.body_text().contains("only local peers"), "{}", r.body_text());
    assert_eq!(from("127.0.0.2", "/status/status.js").status, 200);
}

/// `(key, value in /status.json, value in /metrics)` for every number both report.
fn pairs(s: &Value, m: &Metrics) -> Vec<(String, f64, f64)> {
    let num = |v: &Value| v.as_f64().or_else(|| v.as_bool().map(|b| b as u8 as f64)).unwrap_or(f64::NAN);
    let mut out = Vec::new();
    let mut pair = |key: String, v: &Value, metric: &str, labels: &[&str]| {
        out.push((key, num(v), m.sum(metric, labels)));
    };
    for (key, metric) in [
        ("connections", "tether_connections"),
        ("channels", "tether_channels"),
        ("published_total", "tether_messages_published_total"),
        ("delivered_total", "tether_messages_delivered_total"),
        ("publish_duplicates_total", "tether_publish_duplicates_total"),
        ("pings_sent_total", "tether_pings_sent_total"),
    ] {
        pair(key.into(), &s[key], metric, &[]);
    }
    for (k, v) in s["overflow_total"].as_object().expect("overflow_total") {
        pair(format!("overflow_total.{k}"), v, "tether_overflow_total", &[&format!("policy=\"{k}\"")]);
    }
    for (k, v) in s["reaped_total"].as_object().expect("reaped_total") {
        pair(format!("reaped_total.{k}"), v, "tether_reaped_total", &[&format!("reason=\"{k}\"")]);
    }
    for c in s["cores"].as_array().expect("cores") {
        let core = format!("core=\"{}\"", c["core"]);
        for (key, metric) in [
            ("connections", "tether_connections"),
            ("published_total", "tether_messages_published_total"),
            ("delivered_total", "tether_messages_delivered_total"),
            ("drain_remaining", "tether_drain_remaining"),
            ("bus_spilled", "tether_bus_spilled"),
        ] {
            pair(format!("cores[{}].{key}", c["core"]), &c[key], metric, &[&core]);
        }
    }
    pair("drain.draining".into(), &s["drain"]["draining"], "tether_draining", &[]);
    pair("drain.remaining".into(), &s["drain"]["remaining"], "tether_drain_remaining", &[]);
    pair("broker.up".into(), &s["broker"]["up"], "tether_broker_up", &["kind=\"memory\""]);
    pair("broker.pubsub_up".into(), &s["broker"]["pubsub_up"], "tether_broker_pubsub_up", &["kind=\"memory\""]);
    let p = &s["presence"];
    pair("presence.members".into(), &p["members"], "tether_presence_members", &[]);
    pair("presence.untracked_total".into(), &p["untracked_total"], "tether_presence_untracked_total", &[]);
    for kind in ["diff", "reset"] {
        let label = format!("kind=\"{kind}\"");
        pair(
            format!("presence.windows_total.{kind}"),
            &p["windows_total"][kind],
            "tether_presence_windows_total",
            &[&label],
        );
    }
    let z = &s["compression"];
    pair("compression.deflate_connections".into(), &z["deflate_connections"], "tether_deflate_connections", &[]);
    for (key, metric, label, k) in [
        ("messages_total", "tether_deflate_messages_total", "result", "compressed"),
        ("messages_total", "tether_deflate_messages_total", "result", "plain"),
        ("bytes_total", "tether_deflate_bytes_total", "form", "plain"),
        ("bytes_total", "tether_deflate_bytes_total", "form", "deflated"),
    ] {
        let label = format!("{label}=\"{k}\"");
        pair(format!("compression.{key}.{k}"), &z[key][k], metric, &[&label]);
    }
    out
}

/// Reads `/metrics`, `/status.json`, `/metrics` until the two scrapes agree, checking each
/// time that the JSON lies between them; then every number must equal `/metrics` exactly.
async fn status_equal_to_metrics(srv: &Server) -> Value {
    for _ in 0..20 {
        let before = srv.metrics().await;
        let s = status_json(srv, "");
        let after = srv.metrics().await;
        let (b, a) = (pairs(&s, &before), pairs(&s, &after));
        assert!(b.len() > 30, "{b:?}");
        for ((key, v, lo), (_, _, hi)) in b.iter().zip(&a) {
            assert!(lo.min(*hi) <= *v && *v <= lo.max(*hi), "{key} = {v} in /status.json, /metrics {lo} then {hi}");
        }
        if b.iter().zip(&a).all(|(x, y)| x.2 == y.2) {
            for (key, v, want) in &a {
                assert_eq!(v, want, "{key}: /status.json {v}, /metrics {want}");
            }
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("/metrics never stood still for one /status.json");
}

/// Publishes `bytes`-byte bodies to `ch` until `tether_overflow_total{policy}` moves; returns
/// how many were published. Bounded: at most 4,000 publishes.
async fn publish_until_overflow(srv: &Server, http: &mut HttpConn, ch: &str, policy: &str) -> u64 {
    let body = format!("\"{}\"", "x".repeat(15_000));
    let label = format!("policy=\"{policy}\"");
    for n in 1..=4000u64 {
        http.publish(ch, body.as_bytes()).await;
        if n % 20 == 0 && srv.metric("tether_overflow_total", &[&label]).await >= 1.0 {
            return n;
        }
    }
    panic!("no {policy} overflow after 4000 publishes of 15 kB to a subscriber that does not read");
}

#[tokio::test]
async fn status_json_says_what_metrics_says_after_known_traffic() {
    // Small queues so the non-readers overflow soon; no heartbeat during the test, so pings
    // do not keep /metrics moving (they would only make the comparison retry).
    let config = "[limits]\nmax_publish_bytes = 16384\nmax_message_bytes = 16384\nqueue_max_bytes = 65536\n\n\
                  [heartbeat]\nping_interval_ms = 600000\n\n\
                  [[channels]]\npattern = \"drop.*\"\noverflow = \"drop-oldest\"\n\n\
                  [[channels]]\npattern = \"*\"\noverflow = \"disconnect\"\n";
    let srv = Server::start(config, &["--cores", "2"]);
    const READERS: usize = 5;
    const NEWS: u64 = 25;
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let mut ws = RawWs::connect(srv.addr, "/ws").await;
        ws.subscribe("news").await;
        readers.push(ws);
    }
    let mut dropper = RawWs::upgrade(connect_small_rcvbuf(srv.addr, 4096).await, srv.addr, "/ws").await;
    dropper.subscribe("drop.x").await;
    let mut slow = RawWs::upgrade(connect_small_rcvbuf(srv.addr, 4096).await, srv.addr, "/ws").await;
    slow.subscribe("slow.x").await;
    srv.wait_gauge((READERS + 2) as f64, STEP).await;

    let mut http = HttpConn::new(srv.addr).await;
    for k in 1..=NEWS {
        assert_eq!(http.publish("news", br#"{"n":1}"#).await, k);
    }
    for r in &mut readers {
        for k in 1..=NEWS {
            assert_eq!(msg_seq(&r.frame_skip_pings(STEP).await.payload), k);
        }
    }
    let dropped = publish_until_overflow(&srv, &mut http, "drop.x", "drop-oldest").await;
    let closed = publish_until_overflow(&srv, &mut http, "slow.x", "disconnect").await;

    let s = status_equal_to_metrics(&srv).await;
    assert_eq!(s["published_total"], NEWS + dropped + closed);
    assert!(s["delivered_total"].as_u64().unwrap() >= NEWS * READERS as u64 + dropped, "{s}");
    assert!(s["overflow_total"]["drop-oldest"].as_u64() >= Some(1), "{s}");
    assert!(s["overflow_total"]["disconnect"].as_u64() >= Some(1), "{s}");
    let conns = s["connections"].as_u64().unwrap();
    // The 1013'd subscriber stays counted until its close handshake ends or times out.
    assert!(conns == READERS as u64 + 2 || conns == READERS as u64 + 1, "{conns}");
    // news, drop.x, slow.x (the last may already be forgotten: no subscriber left).
    assert!((2..=3).contains(&s["channels"].as_u64().unwrap()), "{s}");
    assert_eq!(s["broker"], serde_json::json!({"kind": "memory", "up": true, "pubsub_up": true}));
    assert_eq!(s["drain"], serde_json::json!({"draining": false, "close_code": null, "remaining": 0}));
    assert_eq!(s["heartbeat"]["ping_interval_ms"], 600000);
    assert_eq!(s["max_connections"], 1_000_000);
    assert!(s["uptime_ms"].as_u64() > Some(0));
    let cores = s["cores"].as_array().unwrap();
    assert_eq!(cores.iter().map(|c| c["core"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(cores.iter().map(|c| c["connections"].as_u64().unwrap()).sum::<u64>(), conns);

    // The top connections by queued bytes. (How much the non-readers still hold depends on
    // how much the kernel took meanwhile, so only bounds are checked.)
    let top = s["top"].as_array().unwrap();
    assert_eq!(top.len(), conns as usize, "fewer connections than top=10: all of them");
    let queued: Vec<u64> = top.iter().map(|r| r["queued_bytes"].as_u64().unwrap()).collect();
    assert!(queued.windows(2).all(|w| w[0] >= w[1]), "sorted by queued bytes: {queued:?}");
    assert!(queued[0] <= 65536 + 16384, "a queue past queue_max_bytes: {queued:?}");
    let dropper_row = top.iter().find(|r| r["subscriptions"] == serde_json::json!(["drop.x"]));
    assert!(dropper_row.is_some_and(|r| r["peer"].as_str().unwrap().starts_with("127.0.0.1:")), "{top:?}");
    let summed: u64 = cores.iter().map(|c| c["queued_bytes"].as_u64().unwrap()).sum();
    assert!(summed >= queued[0], "per-core queued bytes {summed} < the top row's {}", queued[0]);
    let backlogged: u64 = cores.iter().map(|c| c["backlogged"].as_u64().unwrap()).sum();
    assert_eq!(backlogged, queued.iter().filter(|&&b| b > 0).count() as u64, "{s}");
    assert_eq!(status_json(&srv, "?top=2")["top"].as_array().unwrap().len(), 2);
    // `/connections` shares the gathering: the same rows, largest queue first.
    let listed = ask(srv.addr, &request(srv.addr, "GET", "/connections?top=3", None));
    let listed: Value = serde_json::from_slice(&listed.body).unwrap();
    let rows = listed["connections"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{listed}");
    let bytes: Vec<u64> = rows.iter().map(|r| r["queued_bytes"].as_u64().unwrap()).collect();
    assert!(bytes.windows(2).all(|w| w[0] >= w[1]), "{bytes:?}");
    let later = status_json(&srv, "");
    assert!(later["uptime_ms"].as_u64() >= s["uptime_ms"].as_u64(), "uptime goes forward");
    drop((dropper, slow));
}

#[tokio::test]
async fn heartbeat_reaps_show_on_the_status() {
    // A peer that never answers pings is reaped for pong timeout (close 1006 on our side).
    let srv = Server::start("[heartbeat]\nping_interval_ms = 200\npong_timeout_ms = 300\n", &["--cores", "1"]);
    let mut silent = RawWs::connect(srv.addr, "/ws").await;
    silent.subscribe("hb").await;
    srv.wait_metric("tether_reaped_total", &["reason=\"pong_timeout\""], STEP, |v| v >= 1.0).await;
    let s = status_json(&srv, "");
    let m = srv.metrics().await;
    assert!(s["reaped_total"]["pong_timeout"].as_u64() >= Some(1), "{s}");
    assert!(
        s["reaped_total"]["pong_timeout"].as_f64().unwrap()
            <= m.sum("tether_reaped_total", &["reason=\"pong_timeout\""])
    );
    assert_eq!(s["heartbeat"], serde_json::json!({"ping_interval_ms": 200, "pong_timeout_ms": 300}));
    drop(silent);
}

#[tokio::test]
async fn presence_channels_show_on_the_status() {
    // Two cores, so the channels' homes may differ: the list is gathered from both. At most 2
    // members tracked per channel, so one subscriber of room.big is untracked.
    let config = "[presence]\nwindow_ms = 100\n\n\
                  [heartbeat]\nping_interval_ms = 600000\n\n\
                  [[channels]]\npattern = \"room.*\"\npresence = true\njoin_leave = true\npresence_max_members = 3\n";
    let srv = Server::start(config, &["--cores", "2"]);
    let mut members = Vec::new();
    for (ch, n) in [("room.big", 4), ("room.small", 1), ("plain", 2)] {
        for _ in 0..n {
            let mut ws = RawWs::connect(srv.addr, "/ws").await;
            ws.send_json(&serde_json::json!({"op": "sub", "ch": ch, "join_leave": ch == "room.small"})).await;
            let answer = ws.frame(STEP).await;
            assert!(answer.text().contains("\"subscribed\""), "{}", answer.text());
            members.push(ws);
        }
    }
    // room.small's subscriber asked for join/leave: its own join is announced in one window.
    srv.wait_metric("tether_presence_windows_total", &["kind=\"diff\""], STEP, |v| v >= 2.0).await;
    let s = status_equal_to_metrics(&srv).await;
    let p = &s["presence"];
    assert_eq!(p["members"], 4, "3 of room.big (its max), 1 of room.small: {p}");
    assert_eq!(p["untracked_total"], 1, "{p}");
    assert_eq!(p["windows_total"]["reset"], 0, "{p}");
    assert_eq!(
        p["channels"],
        serde_json::json!([{"ch": "room.big", "members": 3, "users": 0}, {"ch": "room.small", "members": 1, "users": 0}]),
        "largest first; channels without presence are not listed"
    );
    // Members leave: the list follows. The gauge and the list are read at different moments
    // of one /status.json (the list is gathered from the cores first), so one answer may
    // show the gauge at 0 beside a list gathered just before the last leave: wait for both.
    members.truncate(0);
    eventually(STEP, "every member gone from the status", || async {
        let s = status_json(&srv, "");
        let p = &s["presence"];
        check(p["members"] == 0 && p["channels"] == serde_json::json!([]), || p.to_string())
    })
    .await;
}
