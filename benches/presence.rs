//! Presence (docs/protocol.md, "Presence"): what a member costs, what a reconnect herd costs,
//! and how fast the server API answers.
//!
//! - **Bytes per member**, memory broker: server RSS with N subscribers of a presence channel
//!   minus RSS with N subscribers of a plain one (two servers, same N), divided by N. Redis
//!   broker: Redis's `MEMORY USAGE` of the channel's three presence keys divided by N, and the
//!   node's RSS difference as for memory (its refresh list).
//! - **The herd**, memory broker: N members with `join_leave` all drop and come back at once:
//!   presence frames per member (max and mean), server CPU seconds from the drop until the last
//!   presence frame, and the time until every member's view is right (the last window's frame
//!   received, `presence_stats` showing N).
//! - **API**: `POST /api/disconnect` (of a user with no connection: the whole path, nothing
//!   to close) and `GET /api/history/{ch}?limit=100` on keep-alive connections, calls per second.
//!
//! `cargo bench --bench presence`. Env: PRESENCE_MEMBERS (10000), PRESENCE_ROUNDS (3; medians
//! are quoted), PRESENCE_CORES (2), PRESENCE_API_SECS (3), PRESENCE_API_CONNS (4). Writes
//! target/bench/presence.json.

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::RedisProc;
use common::*;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const CH: &str = "room.bench";
const WINDOW_MS: u64 = 500;

fn config(broker: &str) -> String {
    format!(
        "{broker}\n[limits]\nmax_channels = 1000\n[presence]\nwindow_ms = {WINDOW_MS}\n\
         [[channels]]\npattern = \"room.*\"\npresence = true\njoin_leave = true\n"
    )
}

/// `n` connections subscribed to `ch` (with join/leave when asked), 200 at a time.
async fn join(url: &str, ch: &str, n: usize, join_leave: bool) -> Vec<Ws> {
    let mut out = Vec::with_capacity(n);
    let url = Arc::new(url.to_owned());
    for start in (0..n).step_by(200) {
        let batch = (start..(start + 200).min(n)).map(|_| {
            let (url, ch) = (url.clone(), ch.to_owned());
            tokio::spawn(async move {
                let (mut ws, _) =
                    tokio::time::timeout(Duration::from_secs(30), tokio_tungstenite::connect_async(url.as_str()))
                        .await
                        .expect("connect timed out")
                        .expect("connect");
                let sub = json!({"op": "sub", "ch": ch, "join_leave": join_leave}).to_string();
                ws.send(Message::text(sub)).await.expect("send");
                loop {
                    match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
                        Ok(Some(Ok(Message::Text(t)))) if t.contains("\"subscribed\"") => return ws,
                        Ok(Some(Ok(Message::Text(t)))) if t.contains("presence_") => {}
                        other => panic!("expected subscribed, got {other:?}"),
                    }
                }
            })
        });
        for h in futures::future::join_all(batch).await {
            out.push(h.expect("join task"));
        }
    }
    out
}

/// Server RSS once `n` members are in: presence channel minus plain channel, per member.
fn member_bytes(
    rt: &tokio::runtime::Runtime,
    n: usize,
    cores: usize,
    broker: &str,
    redis: Option<&RedisProc>,
) -> (f64, f64) {
    let mut rss = [0u64; 2];
    let mut redis_bytes = f64::NAN;
    for (i, ch) in ["plain.bench", CH].into_iter().enumerate() {
        if let Some(r) = redis {
            r.cli(&["FLUSHALL"]);
        }
        let srv = serve("presence", cores, &config(broker));
        let members = rt.block_on(join(&srv.ws_url(), ch, n, false));
        wait_connections(&srv, n as u64, Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(3 * WINDOW_MS)); // the join windows close
        rss[i] = rss_bytes(srv.pid);
        if let (Some(r), 1) = (redis, i) {
            let key = |k: &str| format!("tether:{{{CH}}}:{k}");
            let usage: f64 = ["pz", "pl", "pu"]
                .iter()
                .map(|k| r.cli(&["MEMORY", "USAGE", &key(k), "SAMPLES", "0"]).trim().parse::<f64>().unwrap_or(0.0))
                .sum();
            redis_bytes = usage / n as f64;
        }
        drop(members);
        drop(srv);
    }
    ((rss[1] as f64 - rss[0] as f64) / n as f64, redis_bytes)
}

/// The herd: returns (frames per member max, mean; CPU s; rejoined s; settled s).
fn herd(rt: &tokio::runtime::Runtime, n: usize, cores: usize) -> (u64, f64, f64, f64, f64) {
    let srv = serve("presence-herd", cores, &config(""));
    let url = srv.ws_url();
    let first = rt.block_on(join(&url, CH, n, true));
    wait_connections(&srv, n as u64, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(3 * WINDOW_MS));
    let cpu0 = cpu_seconds(srv.pid).unwrap_or(f64::NAN);
    let t0 = Instant::now();
    drop(first);
    let second = rt.block_on(join(&url, CH, n, true));
    let rejoined = t0.elapsed().as_secs_f64();
    let frames: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let last_ns = Arc::new(AtomicU64::new(0));
    let until = tokio::time::Instant::now() + Duration::from_millis(4 * WINDOW_MS) + Duration::from_secs(2);
    let readers: Vec<_> = second
        .into_iter()
        .enumerate()
        .map(|(i, mut ws)| {
            let (frames, last_ns) = (frames.clone(), last_ns.clone());
            rt.spawn(async move {
                while let Ok(Some(Ok(m))) = tokio::time::timeout_at(until, ws.next()).await {
                    if let Message::Text(t) = m {
                        if t.contains("presence_") {
                            frames[i].fetch_add(1, Relaxed);
                            last_ns.fetch_max(t0.elapsed().as_nanos() as u64, Relaxed);
                        }
                    }
                }
                ws
            })
        })
        .collect();
    let members: Vec<Ws> = rt.block_on(async {
        let mut v = Vec::new();
        for r in readers {
            v.push(r.await.expect("reader"));
        }
        v
    });
    let settled = last_ns.load(Relaxed) as f64 / 1e9;
    let cpu = cpu_seconds(srv.pid).unwrap_or(f64::NAN) - cpu0;
    let tracked = srv.metric_sync("tether_presence_members", &[]).unwrap_or(f64::NAN);
    assert_eq!(tracked, n as f64, "every member tracked after the herd");
    let per: Vec<u64> = frames.iter().map(|f| f.load(Relaxed)).collect();
    drop(members);
    (per.iter().copied().max().unwrap_or(0), per.iter().sum::<u64>() as f64 / n as f64, cpu, rejoined, settled)
}

/// Calls per second of `request` (a whole HTTP/1.1 request) on `conns` keep-alive connections
/// for `secs`.
fn api_rate(rt: &tokio::runtime::Runtime, addr: std::net::SocketAddr, request: String, conns: usize, secs: f64) -> f64 {
    let calls = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(secs);
    rt.block_on(async {
        let tasks: Vec<_> = (0..conns)
            .map(|_| {
                let (calls, request) = (calls.clone(), request.clone());
                tokio::spawn(async move {
                    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
                    let mut buf = vec![0u8; 1 << 16];
                    while Instant::now() < end {
                        s.write_all(request.as_bytes()).await.expect("write");
                        let mut got = Vec::new();
                        loop {
                            let n = s.read(&mut buf).await.expect("read");
                            assert!(n > 0, "the server closed the connection");
                            got.extend_from_slice(&buf[..n]);
                            if let Some(head) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                                let text = String::from_utf8_lossy(&got[..head]).to_ascii_lowercase();
                                assert!(text.starts_with("http/1.1 200"), "{text}");
                                let len: usize = text
                                    .lines()
                                    .find_map(|l| {
                                        l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0))
                                    })
                                    .unwrap_or(0);
                                if got.len() >= head + 4 + len {
                                    break;
                                }
                            }
                        }
                        calls.fetch_add(1, Relaxed);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("api task");
        }
    });
    calls.load(Relaxed) as f64 / secs
}

fn main() {
    if !should_run() {
        return;
    }
    let n: usize = env_or("PRESENCE_MEMBERS", 10_000);
    let rounds: usize = env_or("PRESENCE_ROUNDS", 3).max(1);
    let cores: usize = env_or("PRESENCE_CORES", 2);
    let api_secs: f64 = env_or("PRESENCE_API_SECS", 3.0);
    let api_conns: usize = env_or("PRESENCE_API_CONNS", 4);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let redis = RedisProc::start();
    let redis_broker = format!("[broker]\nkind = \"redis\"\nurl = \"{}\"\n", redis.url());
    let mut runs = Vec::new();
    for round in 1..=rounds {
        let (mem_b, _) = member_bytes(&rt, n, cores, "", None);
        let (node_b, redis_b) = member_bytes(&rt, n, cores, &redis_broker, Some(&redis));
        let (max_f, mean_f, cpu, rejoined, settled) = herd(&rt, n, cores);
        let srv = serve("presence-api", cores, &config(""));
        for i in 0..100 {
            let body = format!("{{\"i\":{i}}}");
            let req = format!(
                "POST /publish/{CH} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                srv.addr,
                body.len()
            );
            let mut s = std::net::TcpStream::connect(srv.addr).expect("connect");
            std::io::Write::write_all(&mut s, req.as_bytes()).expect("publish");
            let mut sink = Vec::new();
            std::io::Read::read_to_end(&mut s, &mut sink).expect("answer");
        }
        let host = srv.addr;
        let disconnect_body = "{\"user\":\"nobody\"}";
        let disconnect = format!(
            "POST /api/disconnect HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n{disconnect_body}",
            disconnect_body.len()
        );
        let history = format!("GET /api/history/{CH}?limit=100 HTTP/1.1\r\nHost: {host}\r\n\r\n");
        let disc_rate = api_rate(&rt, srv.addr, disconnect, api_conns, api_secs);
        let hist_rate = api_rate(&rt, srv.addr, history, api_conns, api_secs);
        drop(srv);
        let run = json!({
            "round": round, "members": n,
            "memory_bytes_per_member": mem_b, "redis_bytes_per_member": redis_b, "redis_node_bytes_per_member": node_b,
            "herd_frames_max": max_f, "herd_frames_mean": mean_f, "herd_cpu_s": cpu,
            "herd_rejoined_s": rejoined, "herd_settled_s": settled,
            "api_disconnect_per_s": disc_rate, "api_history_per_s": hist_rate,
        });
        println!("{run}");
        runs.push(run);
    }
    let med = |k: &str| median(&runs.iter().map(|r| num(r, k)).collect::<Vec<_>>());
    let keys = [
        ("memory_bytes_per_member", "B/member (memory broker, server RSS)"),
        ("redis_bytes_per_member", "B/member (Redis MEMORY USAGE)"),
        ("redis_node_bytes_per_member", "B/member (Redis broker, node RSS)"),
        ("herd_frames_max", "herd: presence frames per member, max"),
        ("herd_frames_mean", "herd: presence frames per member, mean"),
        ("herd_cpu_s", "herd: server CPU s"),
        ("herd_rejoined_s", "herd: all rejoined after s"),
        ("herd_settled_s", "herd: last presence frame after s"),
        ("api_disconnect_per_s", "POST /api/disconnect per s"),
        ("api_history_per_s", "GET /api/history (100 msgs) per s"),
    ];
    let rows: Vec<Vec<String>> =
        keys.iter().map(|(k, what)| vec![what.to_string(), format!("{:.2}", med(k))]).collect();
    table(&format!("presence, {n} members, {cores} cores, medians of {rounds}"), &["figure", "value"], &rows);
    let summary: serde_json::Map<String, Value> = keys.iter().map(|(k, _)| (k.to_string(), json!(med(k)))).collect();
    write_json("presence", &json!({"members": n, "cores": cores, "rounds": runs, "medians": summary}));
}
