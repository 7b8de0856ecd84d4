//! The reconnect herd on a presence room (docs/protocol.md, "Presence"): 2,000 members with
//! join/leave all drop and come back at once. Each member must receive a bounded number of
//! presence frames (one per `presence.window_ms` window at most: coalesced diffs, or one
//! `presence_reset` per window past `presence.max_diff`), not one per member that moved, and
//! the room's view must settle to exactly the 2,000 members that came back.

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tung::{connect, next_json, send, Ws};
use common::Server;
use futures::StreamExt;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

const MEMBERS: usize = 2_000;
const WINDOW_MS: u64 = 500;

/// Connects and subscribes `n` members with join/leave, `parallel` at a time.
async fn join(url: &str, n: usize, parallel: usize) -> Vec<Ws> {
    let url = Arc::new(url.to_owned());
    let mut out = Vec::with_capacity(n);
    for chunk in 0..n.div_ceil(parallel) {
        let batch = (chunk * parallel..((chunk + 1) * parallel).min(n)).map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut ws = connect(&url).await;
                send(&mut ws, json!({"op": "sub", "ch": "room.herd", "join_leave": true})).await;
                let v = next_json(&mut ws).await;
                assert_eq!(v["op"], "subscribed", "{v}");
                ws
            })
        });
        for h in futures::future::join_all(batch).await {
            out.push(h.expect("join task"));
        }
    }
    out
}

/// Reads every member's frames until `until`, counting presence frames into `frames[i]`.
fn count_frames(
    members: Vec<Ws>,
    until: tokio::time::Instant,
    frames: Arc<Vec<AtomicU64>>,
) -> Vec<tokio::task::JoinHandle<Ws>> {
    members
        .into_iter()
        .enumerate()
        .map(|(i, mut ws)| {
            let frames = frames.clone();
            tokio::spawn(async move {
                while let Ok(Some(m)) = tokio::time::timeout_at(until, ws.next()).await {
                    match m.expect("websocket error") {
                        Message::Text(t) if t.contains("\"presence_diff\"") || t.contains("\"presence_reset\"") => {
                            frames[i].fetch_add(1, Relaxed);
                        }
                        Message::Text(t) => panic!("unexpected frame {t}"),
                        Message::Close(f) => panic!("closed: {f:?}"),
                        _ => {}
                    }
                }
                ws
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_herd_costs_each_member_one_frame_per_window() {
    let _serial = common::serial().await;
    let cfg = format!(
        "cores = 2\n[presence]\nwindow_ms = {WINDOW_MS}\nmax_diff = 100\n\
         [[channels]]\npattern = \"room.*\"\npresence = true\njoin_leave = true\n"
    );
    let srv = Server::start(&cfg, &[]);
    let url = srv.ws_url();
    let first = join(&url, MEMBERS, 200).await;
    srv.wait_metric("tether_presence_members", &[], Duration::from_secs(10), |n| n == MEMBERS as f64).await;
    // Everyone drops at once and comes back (a window of the first herd still open counts
    // against the bound like any other).
    drop(first);
    let herd_start = Instant::now();
    let second = join(&url, MEMBERS, 200).await;
    let rejoined_ms = herd_start.elapsed().as_millis() as u64;
    let members =
        srv.wait_metric("tether_presence_members", &[], Duration::from_secs(20), |n| n == MEMBERS as f64).await;
    assert_eq!(members, MEMBERS as f64);
    // Count what each new member receives from its subscribe until two windows after the
    // herd's last change: every window of the herd has closed by then.
    let until = tokio::time::Instant::now() + Duration::from_millis(2 * WINDOW_MS + 200);
    let frames: Arc<Vec<AtomicU64>> = Arc::new((0..MEMBERS).map(|_| AtomicU64::new(0)).collect());
    let tasks = count_frames(second, until, frames.clone());
    let mut second = Vec::with_capacity(MEMBERS);
    for t in tasks {
        second.push(t.await.expect("reader task"));
    }
    let elapsed_ms = herd_start.elapsed().as_millis() as u64;
    // A member hears at most one frame per window that closed while it was subscribed; the
    // whole herd spans ceil(elapsed / window) windows at most (+1 for a window straddling
    // the start).
    let windows = elapsed_ms.div_ceil(WINDOW_MS) + 1;
    let per_member: Vec<u64> = frames.iter().map(|f| f.load(Relaxed)).collect();
    let (max, total) = (per_member.iter().max().copied().unwrap_or(0), per_member.iter().sum::<u64>());
    eprintln!(
        "herd of {MEMBERS}: rejoined in {rejoined_ms} ms; frames per member max {max}, total {total}, bound {windows} ({elapsed_ms} ms)"
    );
    assert!(max <= windows, "a member received {max} presence frames in {windows} windows");
    assert!(per_member.iter().all(|&n| n >= 1), "every member heard the herd at least once");
    // Without coalescing, each member would get a frame per join and per leave: ~4,000 each.
    assert!(total <= MEMBERS as u64 * windows, "{total} frames in all");
    let resets = srv.metric("tether_presence_windows_total", &["kind=\"reset\""]).await;
    assert!(resets >= 1.0, "a window of the herd held more than max_diff changes: a reset");
    // The view is right: exactly the members that came back.
    let mut asker = second.pop().expect("a member");
    send(&mut asker, json!({"op": "presence_stats", "ch": "room.herd"})).await;
    let v = next_json(&mut asker).await;
    assert_eq!((v["clients"].as_u64(), v["users"].as_u64()), (Some(MEMBERS as u64), Some(0)), "{v}");
}
