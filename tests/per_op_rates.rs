//! Every client op is bounded per connection (docs/security.md, "Per-connection limits"):
//! one connection that sends 5,000 of one op in one write (`sub`/`unsub` churn, `sub` of many
//! channels, `refresh` with the token it already holds, malformed JSON, unknown ops, binary
//! frames, pings) gets `error` `limit` answers naming the key (or, far past the burst, a 1008
//! close naming it), the refusals are counted in `tether_limit_refusals_total{limit}`, and a
//! neighbour on the same core is not starved: its round-trip p99 under the flood stays within
//! [`STARVED`]× of its p99 without it, taken as at least [`QUIET_FLOOR`] (best of 5 tries; the
//! figures are printed). ES256 tokens, so a refresh costs a real signature check.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::auth::*;
use common::*;
use serde_json::json;
use tether::ws::codec::encode_client_frame;
use tokio::io::AsyncWriteExt;

const FLOOD: usize = 5000;

fn token() -> String {
    pem_token("es256.key.pem", &claims("u", now_s() + 3600, &["*"], &["*"]))
}

/// One flood: what its 5,000 frames are, and the `limit` label its refusals count under.
struct Flood {
    name: &'static str,
    limit: &'static str,
    frames: fn(&str) -> Vec<u8>,
}

fn text_frames(texts: impl Iterator<Item = String>) -> Vec<u8> {
    texts.flat_map(|t| encode_client_frame(OP_TEXT, true, t.as_bytes(), [9, 8, 7, 6])).collect()
}

const FLOODS: &[Flood] = &[
    Flood {
        name: "sub/unsub churn",
        limit: "subscribe_rate",
        frames: |_| {
            text_frames((0..FLOOD).map(|i| {
                let op = if i % 2 == 0 { "sub" } else { "unsub" };
                json!({"op": op, "ch": "flood.churn"}).to_string()
            }))
        },
    },
    Flood {
        name: "sub of many channels",
        limit: "subscribe_rate",
        frames: |_| text_frames((0..FLOOD).map(|i| json!({"op": "sub", "ch": format!("flood.{i}")}).to_string())),
    },
    Flood {
        name: "refresh (token held)",
        limit: "refresh_rate",
        frames: |t| text_frames((0..FLOOD).map(|_| json!({"op": "refresh", "token": t}).to_string())),
    },
    Flood {
        name: "malformed JSON",
        limit: "bad_request_rate",
        frames: |_| text_frames((0..FLOOD).map(|i| format!("{{\"op\":\"sub\",\"ch\":\"x{i}"))),
    },
    Flood {
        name: "unknown op",
        limit: "bad_request_rate",
        frames: |_| text_frames((0..FLOOD).map(|i| json!({"op": "frob", "ch": format!("u{i}")}).to_string())),
    },
    Flood {
        name: "binary frames",
        limit: "bad_request_rate",
        frames: |_| (0..FLOOD).flat_map(|_| encode_client_frame(OP_BINARY, true, b"\x00\x01", [1, 1, 1, 1])).collect(),
    },
    Flood {
        name: "pings",
        limit: "control_frames",
        frames: |_| (0..FLOOD).flat_map(|_| encode_client_frame(0x9, true, b"p", [1, 1, 1, 1])).collect(),
    },
];

/// Round trips of the neighbour: `pub` → `ack` on its own channel, `n` of them; their p99.
async fn neighbour_p99(ws: &mut RawWs, n: usize, tag: &str) -> Duration {
    let mut rtts = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        ws.send_json(&json!({"op": "pub", "ch": "neighbour", "id": format!("{tag}-{i}"), "data": i})).await;
        loop {
            let v = ws.frame_skip_pings(STEP).await.json();
            if v["op"] == "ack" {
                assert_eq!(v["id"], format!("{tag}-{i}"));
                break;
            }
            assert_eq!(v["op"], "msg", "neighbour got {v}");
        }
        rtts.push(t.elapsed());
    }
    rtts.sort();
    rtts[(n * 99 / 100).min(n - 1)]
}

/// What one flooding connection saw: `limit` answers naming `key`, other answers, its close.
#[derive(Debug, Default)]
struct Seen {
    limits: usize,
    others: usize,
    close: Option<u16>,
}

/// A neighbour p99 this many times its quiet p99 (at least [`QUIET_FLOOR`]) means the flood
/// starved it: the fault this test guards against (one connection's input decoded in one go,
/// an O(n²) scan of held requests) put it at 49–400× a quiet p99 of about 100 µs, i.e. 5–40 ms;
/// the bound is a starvation check, not a speed figure (benches measure speed).
const STARVED: f64 = 8.0;

/// The least quiet p99 the ratio is taken against. A quiet round trip on one core is about
/// 100–180 µs, and under the `sub of many channels` flood (2,000 new channels subscribed per
/// write, the rest refused) the neighbour's p99 read 0.36–2.6 ms in single runs on the epoll
/// driver (2026-12-07, an Intel box), i.e. up to 8.7× a quiet p99 that small; on an AMD EPYC
/// box whose loopback sends cost 1.6× as much (docs/architecture.md) the `sub/unsub churn` and
/// `sub of many channels` floods read 0.54–3.64 ms as the best of five tries (2026-12-07, four
/// runs, the CI run of 29dab00 among them), which against 400 µs failed two of the four. Against
/// 700 µs, 8× is 5.6 ms: 1.5× the most a healthy flood has shown, and under most of the
/// 5–40 ms of the starvation this test exists for (whose lowest readings, on the faster box,
/// it would now let through).
const QUIET_FLOOR: Duration = Duration::from_micros(700);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_op_flooded_is_refused_and_the_neighbour_keeps_its_p99() {
    let _serial = serial().await; // no other test's server competes for the cores
    let srv = Server::start(&pem_config("es256.pub.pem"), &["--cores", "1"]);
    let token = token();
    let mut neighbour = RawWs::connect(srv.addr, &format!("/ws?token={token}")).await;
    neighbour.subscribe("neighbour").await;
    neighbour_p99(&mut neighbour, 200, "warm").await;
    let mut table = Vec::new();
    for f in FLOODS {
        let bytes = (f.frames)(&token);
        let key = if f.limit == "control_frames" { "control_frames_rate" } else { f.limit };
        let refusals = |m: Metrics| {
            m.sum("tether_limit_refusals_total", &[&format!("limit=\"{}\"", f.limit)])
                + m.sum("tether_limit_refusals_total", &["limit=\"held_requests\""])
        };
        let before = refusals(srv.metrics().await);
        // The best of five tries: the machine is shared, a try can lose its core to others.
        let mut best: Option<(f64, Duration, Duration)> = None;
        let mut first_seen = None;
        for attempt in 0..5 {
            let quiet = neighbour_p99(&mut neighbour, 400, &format!("{}-q{attempt}", f.name)).await;
            let stop = Arc::new(AtomicBool::new(false));
            let flooder = {
                let (stop, bytes, token, addr) = (stop.clone(), bytes.clone(), token.clone(), srv.addr);
                tokio::spawn(async move {
                    // One connection writes its 5,000 again as soon as their answers pause,
                    // until the neighbour has measured or the server closed it.
                    let mut seen = Vec::new();
                    let mut ws = RawWs::connect(addr, &format!("/ws?token={token}")).await;
                    while !stop.load(Ordering::Relaxed) && seen.len() < 200 {
                        if ws.s.write_all(&bytes).await.is_err() {
                            break;
                        }
                        let s = read_answers(&mut ws, key).await;
                        let closed = s.close.is_some();
                        seen.push(s);
                        if closed {
                            break;
                        }
                    }
                    seen
                })
            };
            let loaded = neighbour_p99(&mut neighbour, 400, &format!("{}-f{attempt}", f.name)).await;
            stop.store(true, Ordering::Relaxed);
            let seen = tokio::time::timeout(STEP * 3, flooder).await.expect("flooder ends").expect("flooder");
            first_seen.get_or_insert_with(|| seen.into_iter().next().expect("one flood at least"));
            let ratio = loaded.as_secs_f64() / quiet.max(QUIET_FLOOR).as_secs_f64();
            if best.is_none_or(|b| ratio < b.0) {
                best = Some((ratio, quiet, loaded));
            }
            if ratio <= 2.0 {
                break;
            }
        }
        let (ratio, quiet, loaded) = best.unwrap();
        let seen = first_seen.unwrap();
        let after = refusals(srv.metrics().await);
        let line = format!(
            "{:<22} refusals {:>6}  first flood: {} limit answers, {} others, close {:?}  neighbour p99 {:?} → {:?} ({ratio:.2}×)",
            f.name,
            after - before,
            seen.limits,
            seen.others,
            seen.close,
            quiet,
            loaded
        );
        eprintln!("{line}");
        table.push(line);
        assert!(after > before, "{}: refusals counted under limit={} (or held_requests)", f.name, f.limit);
        if f.limit != "control_frames" {
            assert!(seen.limits > 0 || seen.close == Some(1008), "{}: {seen:?}", f.name);
        }
        assert!(
            ratio <= STARVED,
            "{}: neighbour p99 {loaded:?} vs {quiet:?} without the flood (ratio against at least {QUIET_FLOOR:?})",
            f.name
        );
    }
    eprintln!("per-op floods (5,000 in one write, one core):\n{}", table.join("\n"));
}

/// Reads a flood's answers until they pause (50 ms), the close, or the end.
async fn read_answers(ws: &mut RawWs, key: &str) -> Seen {
    let mut seen = Seen::default();
    let quiet = Duration::from_millis(50);
    loop {
        match tokio::time::timeout(quiet, ws.next(STEP)).await {
            Err(_) | Ok(Err(_)) => return seen,
            Ok(Ok(f)) if f.opcode == OP_CLOSE => {
                seen.close = Some(f.close_code());
                let reason = String::from_utf8_lossy(&f.payload[2.min(f.payload.len())..]).into_owned();
                // Requests piled up behind a `sub` still unanswered close it first, sometimes.
                assert!(reason.contains(key) || reason.contains("held_requests"), "close names {key}: {reason}");
                return seen;
            }
            Ok(Ok(f)) if f.opcode == OP_TEXT => {
                let v = f.json();
                if v["code"] == "limit" && v["reason"].as_str().is_some_and(|r| r.contains(key)) {
                    assert!(v["retry_after_ms"].as_u64().is_some(), "{v}");
                    seen.limits += 1;
                } else {
                    seen.others += 1;
                }
            }
            Ok(Ok(_)) => seen.others += 1, // pongs
        }
    }
}

#[tokio::test]
async fn an_honest_client_never_meets_the_defaults() {
    let _serial = serial().await;
    // Reconnect-style: 1,024 subscriptions at once, all dropped and taken again, a refresh,
    // and a few mistakes: no `limit` answer.
    let srv = Server::start(&pem_config("es256.pub.pem"), &["--cores", "1"]);
    let token = token();
    let mut ws = RawWs::connect(srv.addr, &format!("/ws?token={token}")).await;
    let mut texts: Vec<String> = (0..1024).map(|i| json!({"op": "sub", "ch": format!("h.{i}")}).to_string()).collect();
    texts.extend((0..1024).map(|i| json!({"op": "unsub", "ch": format!("h.{i}")}).to_string()));
    texts.push(json!({"op": "refresh", "token": token}).to_string());
    texts.extend((0..5).map(|_| "{nope".to_owned()));
    ws.s.write_all(&text_frames(texts.iter().cloned())).await.expect("write");
    let mut n = 0;
    while n < texts.len() {
        let v = ws.frame_skip_pings(STEP).await.json();
        assert_ne!(v["code"], "limit", "an honest burst was refused: {v}");
        n += 1;
    }
    assert_eq!(srv.metrics().await.sum("tether_limit_refusals_total", &[]), 0.0);
}
