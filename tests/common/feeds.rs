//! Helpers for the feed runtime tests (docs/feeds.md): node configs with test timings, a
//! subscriber that records every `msg` of many channels, and the continuity check.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::upstream::Upstream;
use super::{RawWs, OP_TEXT};

/// Test timings (issue 11): renew 250 ms, lease 1 s, reconcile 1 s, skew margin 250 ms.
pub const TIMINGS: &str = "renew_ms = 250\nlease_ms = 1000\nreconcile_ms = 1000\nskew_margin_ms = 250\n";

/// The channel of feed `id`.
pub fn channel(id: &str) -> String {
    format!("feed.{id}")
}

/// A node config: one core, a short drain, `broker` (TOML lines of `[broker]`, empty for the
/// memory broker), `[feeds] store` = `store` with the test timings, and one
/// `[[feeds.static]]` per id, upstream `up`, resume by query parameter `from`.
pub fn node_config(broker: &str, store: &str, up: &Upstream, ids: &[String]) -> String {
    let mut t = format!(
        "cores = 1\n[drain]\nwindow_ms = 300\n[heartbeat]\nping_interval_ms = 600000\n[broker]\n{broker}\n[feeds]\nstore = \"{store}\"\n{TIMINGS}"
    );
    for id in ids {
        t.push_str(&format!(
            "[[feeds.static]]\nid = \"{id}\"\nurl = \"{}\"\nchannel = \"{}\"\nresume_query = \"from\"\nseq_pointer = \"/seq\"\n",
            up.url(id),
            channel(id)
        ));
    }
    t
}

/// `f0`, `f1`, … `f{n-1}`.
pub fn feed_ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("f{i}")).collect()
}

/// Every `msg` one connection received, per channel: (tether seq, upstream seq).
pub type Received = Arc<Mutex<HashMap<String, Vec<(u64, u64)>>>>;

/// A subscriber of many channels on one node, recording in the background until dropped.
pub struct Recorder {
    pub got: Received,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    /// Connects to `addr`, subscribes to `channels` (again after an `unavailable` refusal),
    /// and records every `msg` from then on.
    pub async fn start(addr: SocketAddr, channels: &[String]) -> Recorder {
        let mut ws = RawWs::connect(addr, "/ws").await;
        for ch in channels {
            ws.send_json(&serde_json::json!({"op": "sub", "ch": ch})).await;
        }
        let got: Received = Arc::default();
        let g = got.clone();
        let task = tokio::spawn(async move {
            while let Ok(f) = ws.next(Duration::from_secs(3600)).await {
                if f.opcode != OP_TEXT {
                    continue;
                }
                let v = f.json();
                if v["op"] == "error" && v["code"] == "unavailable" {
                    // The node's broker is not connected yet: subscribe again after its hint.
                    let wait = v["retry_after_ms"].as_u64().unwrap_or(100);
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    ws.send_json(&serde_json::json!({"op": "sub", "ch": v["ch"]})).await;
                    continue;
                }
                if v["op"] == "msg" {
                    let ch = v["ch"].as_str().unwrap_or_default().to_owned();
                    let up = v["data"]["seq"].as_u64().expect("upstream seq in data");
                    g.lock().unwrap().entry(ch).or_default().push((v["seq"].as_u64().unwrap(), up));
                }
            }
        });
        Recorder { got, task }
    }

    /// Messages received on `ch` so far.
    pub fn count(&self, ch: &str) -> usize {
        self.got.lock().unwrap().get(ch).map_or(0, Vec::len)
    }

    /// Panics unless every channel's messages are gap-free and duplicate-free: tether seqs
    /// and upstream seqs each go up by exactly one. Returns the messages checked.
    pub fn assert_continuous(&self) -> usize {
        let got = self.got.lock().unwrap();
        let mut n = 0;
        for (ch, msgs) in got.iter() {
            for w in msgs.windows(2) {
                assert!(
                    w[1].0 == w[0].0 + 1 && w[1].1 == w[0].1 + 1,
                    "{ch}: (tether seq, upstream seq) {:?} then {:?}: a gap, a duplicate or a reorder",
                    w[0],
                    w[1]
                );
            }
            n += msgs.len();
        }
        n
    }
}
