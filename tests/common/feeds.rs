//! Helpers for the feed runtime tests (docs/feeds.md): node configs with test timings, a
//! subscriber that records every `msg` of many channels, the continuity check, bounded waits
//! on the nodes' `tether_feeds_owned` and the upstream's connection counts, and the three-node
//! scenario that `tests/feeds_failover.rs` (Redis store) and `tests/feeds_failover_dynamodb.rs`
//! (DynamoDB store) both run.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::redis::RedisProc;
use super::upstream::Upstream;
use super::{RawWs, Server, OP_TEXT};

/// `[feeds]` timings of a test, in milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    pub renew_ms: u64,
    pub lease_ms: u64,
    pub reconcile_ms: u64,
    pub skew_margin_ms: u64,
}

impl Timings {
    /// The `[feeds]` lines.
    pub fn toml(&self) -> String {
        format!(
            "renew_ms = {}\nlease_ms = {}\nreconcile_ms = {}\nskew_margin_ms = {}\n",
            self.renew_ms, self.lease_ms, self.reconcile_ms, self.skew_margin_ms
        )
    }

    /// One renew interval.
    pub fn renew(&self) -> Duration {
        Duration::from_millis(self.renew_ms)
    }

    /// The longest a kill -9 takeover may take: the lease runs out, then the next reconcile,
    /// plus 500 ms for polling and the acquires.
    pub fn kill9_bound(&self) -> Duration {
        Duration::from_millis(self.lease_ms + self.reconcile_ms + 500)
    }
}

/// Test timings (issue 11): renew 250 ms, lease 1 s, reconcile 1 s, skew margin 250 ms.
pub const TIMINGS: Timings = Timings { renew_ms: 250, lease_ms: 1_000, reconcile_ms: 1_000, skew_margin_ms: 250 };

/// The channel of feed `id`.
pub fn channel(id: &str) -> String {
    format!("feed.{id}")
}

/// A node config: one core, a short drain, `broker` (TOML lines of `[broker]`, empty for the
/// memory broker), `[feeds] store` = `store` with the test timings, and one
/// `[[feeds.static]]` per id, upstream `up`, resume by query parameter `from`.
pub fn node_config(broker: &str, store: &str, up: &Upstream, ids: &[String]) -> String {
    node_config_with(broker, &format!("store = \"{store}\"\n{}", TIMINGS.toml()), up, ids)
}

/// [`node_config`] with `feeds` as the lines of `[feeds]` (store, its settings, timings).
pub fn node_config_with(broker: &str, feeds: &str, up: &Upstream, ids: &[String]) -> String {
    let mut t = format!(
        "cores = 1\n[drain]\nwindow_ms = 300\n[heartbeat]\nping_interval_ms = 600000\n[broker]\n{broker}\n[feeds]\n{feeds}\n"
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

/// Upstream message interval per feed in the multi-node tests.
pub const INTERVAL: Duration = Duration::from_millis(50);

/// `[broker]` lines for the Redis broker on `redis` with key prefix `prefix`.
pub fn redis_broker(redis: &RedisProc, prefix: &str) -> String {
    format!("kind = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"", redis.url())
}

/// The node's `tether_feeds_owned`.
pub async fn owned(node: &Server) -> u64 {
    node.metric("tether_feeds_owned", &[]).await as u64
}

/// Waits (bounded) until `pred` holds for the sum of `tether_feeds_owned` over `nodes`;
/// returns how long it took.
pub async fn wait_owned(nodes: &[&Server], limit: Duration, pred: impl Fn(u64) -> bool) -> Duration {
    let start = Instant::now();
    loop {
        let mut sum = 0;
        for n in nodes {
            sum += owned(n).await;
        }
        if pred(sum) {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "owned feeds = {sum} after {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `offenders` every 20 ms until it returns none; panics after `limit` naming `what`
/// and the last offenders.
pub async fn wait_none(what: &str, limit: Duration, offenders: impl Fn() -> Vec<String>) {
    let start = Instant::now();
    loop {
        let bad = offenders();
        if bad.is_empty() {
            return;
        }
        assert!(start.elapsed() < limit, "{what} after {limit:?}: {bad:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until every feed has exactly one upstream connection.
pub async fn wait_one_connection_each(up: &Upstream, ids: &[String], limit: Duration) {
    let offenders = || ids.iter().filter(|id| up.counts(id).open != 1).cloned().collect();
    wait_none("feeds without exactly one upstream connection", limit, offenders).await;
}

/// Waits (bounded) until every channel received a new message (so the stream goes on).
pub async fn wait_flowing(rec: &Recorder, ids: &[String], limit: Duration) {
    let marks: Vec<usize> = ids.iter().map(|id| rec.count(&channel(id))).collect();
    let offenders =
        || ids.iter().zip(&marks).filter(|(id, m)| rec.count(&channel(id)) <= **m).map(|(id, _)| id.clone()).collect();
    wait_none("channels without new messages", limit, offenders).await;
}

/// Panics unless the drained `node` released and announced every lease it held (it logged no
/// `release failed` and no `not announced`): a SIGTERM handover must come from the releases,
/// not from the leases running out.
pub fn assert_released_on_drain(node: &Server) {
    let log = String::from_utf8_lossy(&node.log_bytes()).into_owned();
    let failed: Vec<&str> =
        log.lines().filter(|l| l.contains("release failed") || l.contains("not announced")).take(3).collect();
    assert!(failed.is_empty(), "the drained node did not release its leases: {failed:#?}");
}

/// The three-node scenario of issue 11 on whatever store `cfg` names (the nodes started with
/// the extra environment `env`; `timings` as in `cfg`), upstream `up` serving the feeds `ids`:
/// - sampled every 50 ms for `FEEDS_SAMPLE_S` seconds (default 10), each feed has exactly one
///   upstream connection (never two; never none for longer than one renew interval);
/// - SIGTERM of the node owning the most feeds: it releases every lease, and all of them are
///   owned elsewhere within 2 s;
/// - kill -9 of the next owner: its feeds owned by the survivor within lease + reconcile +
///   500 ms (2.5 s with [`TIMINGS`]);
/// - every channel gap-free and duplicate-free for a subscriber on each surviving node.
///
/// Returns the two takeover times (SIGTERM, kill -9).
pub async fn three_nodes_scenario(
    cfg: &str,
    env: &[(&str, &str)],
    timings: &Timings,
    up: &Upstream,
    ids: &[String],
) -> [Duration; 2] {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let mut nodes: Vec<Server> = (0..3).map(|_| Server::start_with_env(cfg, any, &[], env)).collect();
    wait_one_connection_each(up, ids, Duration::from_secs(10)).await;
    wait_owned(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(5), |n| n == ids.len() as u64).await;

    // Steady state: sample every 50 ms.
    let sample_s: u64 = std::env::var("FEEDS_SAMPLE_S").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let start = Instant::now();
    let mut zero_since: Vec<Option<Instant>> = vec![None; ids.len()];
    let mut samples = 0;
    while start.elapsed() < Duration::from_secs(sample_s) {
        for (i, id) in ids.iter().enumerate() {
            let c = up.counts(id);
            assert!(c.open <= 1, "feed {id} has {} upstream connections", c.open);
            match (c.open, zero_since[i]) {
                (0, None) => zero_since[i] = Some(Instant::now()),
                (0, Some(t)) => {
                    let gap = t.elapsed();
                    assert!(gap <= timings.renew(), "feed {id} without an upstream connection for {gap:?}")
                }
                _ => zero_since[i] = None,
            }
        }
        samples += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in ids {
        assert_eq!(up.counts(id).max_open, 1, "feed {id}: two upstream connections at once");
    }
    eprintln!("sampled {samples} times over {sample_s} s: every feed had exactly one upstream connection");

    // SIGTERM the node owning the most feeds.
    let all = ids.len() as u64;
    let mut counts = Vec::new();
    for n in &nodes {
        counts.push(owned(n).await);
    }
    let victim = (0..3).max_by_key(|&i| counts[i]).expect("three nodes");
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    eprintln!("owned per node {counts:?}; SIGTERM node {victim}");
    let channels: Vec<String> = ids.iter().map(|i| channel(i)).collect();
    let recs = [
        Recorder::start(nodes[others[0]].addr, &channels).await,
        Recorder::start(nodes[others[1]].addr, &channels).await,
    ];
    wait_flowing(&recs[0], ids, Duration::from_secs(5)).await;
    nodes[victim].signal(libc::SIGTERM);
    let sigterm = wait_owned(&[&nodes[others[0]], &nodes[others[1]]], Duration::from_secs(5), |n| n == all).await;
    eprintln!(
        "takeover after SIGTERM: all {} feeds of the node owned elsewhere in {} ms",
        counts[victim],
        sigterm.as_millis()
    );
    assert!(sigterm <= Duration::from_secs(2), "SIGTERM handover took {sigterm:?}");
    assert!(nodes[victim].wait_exit(Duration::from_secs(10)).is_some(), "the drained node did not exit");
    assert_released_on_drain(&nodes[victim]);
    wait_one_connection_each(up, ids, Duration::from_secs(2)).await;
    wait_flowing(&recs[0], ids, Duration::from_secs(5)).await;
    wait_flowing(&recs[1], ids, Duration::from_secs(5)).await;

    // kill -9 the owner of the most feeds now.
    let (a, b) = (others[0], others[1]);
    let (oa, ob) = (owned(&nodes[a]).await, owned(&nodes[b]).await);
    let (killed, survivor, lost) = if oa >= ob { (a, b, oa) } else { (b, a, ob) };
    nodes[killed].signal(libc::SIGKILL);
    let kill9 = wait_owned(&[&nodes[survivor]], timings.kill9_bound() * 3, |n| n == all).await;
    eprintln!(
        "takeover after kill -9: {lost} feeds owned by the survivor in {} ms (lease {} + reconcile {})",
        kill9.as_millis(),
        timings.lease_ms,
        timings.reconcile_ms
    );
    let bound = timings.kill9_bound();
    assert!(kill9 <= bound, "kill -9 takeover took {kill9:?} (lease + reconcile + 500 ms = {bound:?})");
    wait_one_connection_each(up, ids, Duration::from_secs(2)).await;
    let survivor_rec = if survivor == others[0] { &recs[0] } else { &recs[1] };
    wait_flowing(survivor_rec, ids, Duration::from_secs(5)).await;
    let checked = recs[0].assert_continuous() + recs[1].assert_continuous();
    eprintln!("{checked} messages checked: every channel gap-free and duplicate-free");
    assert!(nodes[survivor].metric("tether_feed_takeovers_total", &[]).await >= 1.0);
    [sigterm, kill9]
}

/// The paused-owner scenario of issue 11 on whatever store `cfg` names (nodes started with
/// the extra environment `env`), upstream `up` serving the feeds `ids`: one node owns every
/// feed, a second one subscribes; SIGSTOP of the owner past its lease, takeover by the second,
/// SIGCONT: the old owner stops its upstream connections without reconnecting (its publishes
/// fenced out, or its renew refused first), logs why, and the subscriber sees no duplicate and
/// no reorder. `timings` are those of `cfg`.
pub async fn paused_owner_scenario(cfg: &str, env: &[(&str, &str)], timings: &Timings, up: &Upstream, ids: &[String]) {
    let all = ids.len() as u64;
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let first = Server::start_with_env(cfg, any, &[], env);
    wait_owned(&[&first], Duration::from_secs(10), |n| n == all).await;
    let second = Server::start_with_env(cfg, any, &[], env);
    let rec = Recorder::start(second.addr, &ids.iter().map(|i| channel(i)).collect::<Vec<_>>()).await;
    wait_flowing(&rec, ids, Duration::from_secs(5)).await;

    first.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let t = wait_owned(&[&second], timings.kill9_bound() * 2, |n| n == all).await;
    eprintln!("takeover of a paused owner: {} ms", t.as_millis());
    wait_flowing(&rec, ids, Duration::from_secs(5)).await;
    // Past the old lease, and the new owner has published with its token.
    tokio::time::sleep(Duration::from_millis(timings.lease_ms + 500).saturating_sub(stopped.elapsed())).await;
    let opened_before: Vec<usize> = ids.iter().map(|id| up.counts(id).opened).collect();
    first.signal(libc::SIGCONT);

    // The old owner closes its upstream connections: one connection per feed again.
    wait_one_connection_each(up, ids, timings.kill9_bound()).await;
    wait_owned(&[&first], timings.kill9_bound(), |n| n == 0).await;
    let fenced = first.metric("tether_feed_fenced_total", &[]).await;
    eprintln!("old owner after SIGCONT: tether_feed_fenced_total = {fenced}");
    wait_flowing(&rec, ids, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let checked = rec.assert_continuous();
    eprintln!("{checked} messages checked: no duplicate, no reorder");
    for (id, before) in ids.iter().zip(opened_before) {
        assert_eq!(up.counts(id).opened, before, "feed {id}: the paused node reconnected upstream");
        assert_eq!(up.counts(id).open, 1, "feed {id}");
    }
    let log = first.log_tail(400);
    assert!(
        ["fenced", "lease not renewed in time", "lease lost", "lease taken over"].iter().any(|w| log.contains(w)),
        "the old owner logged no reason for stopping"
    );
}
