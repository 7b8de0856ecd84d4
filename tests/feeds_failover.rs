//! Feeds owned by leases across real nodes (docs/feeds.md, issue 11): `tether serve`
//! processes sharing a real `redis-server` (Redis broker, Redis lease store), a test upstream
//! in this process that counts connections per feed, and subscribers that check every
//! channel's stream. Timings: renew 250 ms, lease 1 s, reconcile 1 s, skew margin 250 ms.
//!
//! - three nodes, thirty feeds: sampled every 50 ms, each feed has exactly one upstream
//!   connection (never two; never none for longer than one renew interval); SIGTERM of the
//!   node owning the most feeds hands all of them over within 2 s; kill -9 of the next owner
//!   hands its feeds over within lease + reconcile; every channel stays gap-free and
//!   duplicate-free for a subscriber on a surviving node;
//! - SIGSTOP of an owner past its lease, takeover, SIGCONT: the old owner's publishes are
//!   fenced out (or it closed its upstream first), it stops its upstream, and subscribers see
//!   no duplicate and no reorder;
//! - an upstream that drops every connection every 2 s: the owner reconnects with jitter and
//!   resumes from the last stored seq, gap-free.
//!
//! `FEEDS_SAMPLE_S` sets the sampling time of the first test (default 10 s; the 20 s
//! is `FEEDS_SAMPLE_S=20`). Takeover times are printed (`takeover …`).

mod common;

use std::time::{Duration, Instant};

use common::feeds::{channel, feed_ids, node_config, Recorder};
use common::redis::RedisProc;
use common::upstream::Upstream;
use common::Server;

/// Upstream message interval per feed.
const INTERVAL: Duration = Duration::from_millis(50);
/// One renew interval of the test timings.
const RENEW: Duration = Duration::from_millis(250);

fn redis_broker(redis: &RedisProc, prefix: &str) -> String {
    format!("kind = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"", redis.url())
}

async fn owned(node: &Server) -> u64 {
    node.metric("tether_feeds_owned", &[]).await as u64
}

/// Waits (bounded) until `pred` holds for the sum of `tether_feeds_owned` over `nodes`;
/// returns how long it took.
async fn wait_owned(nodes: &[&Server], limit: Duration, pred: impl Fn(u64) -> bool) -> Duration {
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
async fn wait_none(what: &str, limit: Duration, offenders: impl Fn() -> Vec<String>) {
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
async fn wait_one_connection_each(up: &Upstream, ids: &[String], limit: Duration) {
    let offenders = || ids.iter().filter(|id| up.counts(id).open != 1).cloned().collect();
    wait_none("feeds without exactly one upstream connection", limit, offenders).await;
}

/// Waits (bounded) until every channel received a new message (so the stream goes on).
async fn wait_flowing(rec: &Recorder, ids: &[String], limit: Duration) {
    let marks: Vec<usize> = ids.iter().map(|id| rec.count(&channel(id))).collect();
    let offenders =
        || ids.iter().zip(&marks).filter(|(id, m)| rec.count(&channel(id)) <= **m).map(|(id, _)| id.clone()).collect();
    wait_none("channels without new messages", limit, offenders).await;
}

/// A redis-server, an upstream of `n` feeds, their ids, and the node config (Redis broker
/// and store under `prefix`).
async fn setup(n: usize, prefix: &str) -> (RedisProc, Upstream, Vec<String>, String) {
    let redis = RedisProc::start();
    let up = Upstream::start(INTERVAL, None).await;
    let ids = feed_ids(n);
    let cfg = node_config(&redis_broker(&redis, prefix), "redis", &up, &ids);
    (redis, up, ids, cfg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_thirty_feeds_one_owner_each_and_handover() {
    let _serial = common::serial().await;
    let (_redis, up, ids, cfg) = setup(30, "ff3:").await;
    let mut nodes: Vec<Server> = (0..3).map(|_| Server::start(&cfg, &[])).collect();
    wait_one_connection_each(&up, &ids, Duration::from_secs(10)).await;
    wait_owned(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(5), |n| n == 30).await;

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
                    assert!(t.elapsed() <= RENEW, "feed {id} without an upstream connection for {:?}", t.elapsed())
                }
                _ => zero_since[i] = None,
            }
        }
        samples += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in &ids {
        assert_eq!(up.counts(id).max_open, 1, "feed {id}: two upstream connections at once");
    }
    eprintln!("sampled {samples} times over {sample_s} s: every feed had exactly one upstream connection");

    // SIGTERM the node owning the most feeds.
    let mut counts = Vec::new();
    for n in &nodes {
        counts.push(owned(n).await);
    }
    let victim = (0..3).max_by_key(|&i| counts[i]).unwrap();
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    eprintln!("owned per node {counts:?}; SIGTERM node {victim}");
    let recs = [
        Recorder::start(nodes[others[0]].addr, &ids.iter().map(|i| channel(i)).collect::<Vec<_>>()).await,
        Recorder::start(nodes[others[1]].addr, &ids.iter().map(|i| channel(i)).collect::<Vec<_>>()).await,
    ];
    wait_flowing(&recs[0], &ids, Duration::from_secs(5)).await;
    nodes[victim].signal(libc::SIGTERM);
    let t = wait_owned(&[&nodes[others[0]], &nodes[others[1]]], Duration::from_secs(5), |n| n == 30).await;
    eprintln!(
        "takeover after SIGTERM: all {} feeds of the node owned elsewhere in {} ms",
        counts[victim],
        t.as_millis()
    );
    assert!(t <= Duration::from_secs(2), "SIGTERM handover took {t:?}");
    assert!(nodes[victim].wait_exit(Duration::from_secs(10)).is_some(), "the drained node did not exit");
    wait_one_connection_each(&up, &ids, Duration::from_secs(2)).await;
    wait_flowing(&recs[0], &ids, Duration::from_secs(5)).await;
    wait_flowing(&recs[1], &ids, Duration::from_secs(5)).await;

    // kill -9 the owner of the most feeds now.
    let (a, b) = (others[0], others[1]);
    let (oa, ob) = (owned(&nodes[a]).await, owned(&nodes[b]).await);
    let (killed, survivor, lost) = if oa >= ob { (a, b, oa) } else { (b, a, ob) };
    nodes[killed].signal(libc::SIGKILL);
    let t = wait_owned(&[&nodes[survivor]], Duration::from_secs(6), |n| n == 30).await;
    eprintln!(
        "takeover after kill -9: {lost} feeds owned by the survivor in {} ms (lease 1000 + reconcile 1000)",
        t.as_millis()
    );
    assert!(t <= Duration::from_millis(2500), "kill -9 takeover took {t:?} (lease + reconcile = 2 s)");
    wait_one_connection_each(&up, &ids, Duration::from_secs(2)).await;
    let survivor_rec = if survivor == others[0] { &recs[0] } else { &recs[1] };
    wait_flowing(survivor_rec, &ids, Duration::from_secs(5)).await;
    let checked = recs[0].assert_continuous() + recs[1].assert_continuous();
    eprintln!("{checked} messages checked: every channel gap-free and duplicate-free");
    assert!(nodes[survivor].metric("tether_feed_takeovers_total", &[]).await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_owner_is_fenced_out_after_takeover() {
    let _serial = common::serial().await;
    let (_redis, up, ids, cfg) = setup(3, "ffs:").await;
    let first = Server::start(&cfg, &[]);
    wait_owned(&[&first], Duration::from_secs(5), |n| n == 3).await;
    let second = Server::start(&cfg, &[]);
    let rec = Recorder::start(second.addr, &ids.iter().map(|i| channel(i)).collect::<Vec<_>>()).await;
    wait_flowing(&rec, &ids, Duration::from_secs(5)).await;

    first.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let t = wait_owned(&[&second], Duration::from_secs(5), |n| n == 3).await;
    eprintln!("takeover of a paused owner: {} ms", t.as_millis());
    wait_flowing(&rec, &ids, Duration::from_secs(5)).await;
    // Past the old lease, and the new owner has published with its token.
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(stopped.elapsed())).await;
    let opened_before: Vec<usize> = ids.iter().map(|id| up.counts(id).opened).collect();
    first.signal(libc::SIGCONT);

    // The old owner closes its upstream connections: one connection per feed again.
    wait_one_connection_each(&up, &ids, Duration::from_secs(3)).await;
    wait_owned(&[&first], Duration::from_secs(3), |n| n == 0).await;
    let fenced = first.metric("tether_feed_fenced_total", &[]).await;
    eprintln!("old owner after SIGCONT: tether_feed_fenced_total = {fenced}");
    wait_flowing(&rec, &ids, Duration::from_secs(5)).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_drops_every_2s_owner_resumes_gap_free() {
    let _serial = common::serial().await;
    let up = Upstream::start(Duration::from_millis(20), Some(Duration::from_secs(2))).await;
    let ids = feed_ids(1);
    let node = Server::start(&node_config("", "memory", &up, &ids), &[]);
    let rec = Recorder::start(node.addr, &[channel(&ids[0])]).await;
    tokio::time::timeout(Duration::from_secs(12), async {
        while up.counts(&ids[0]).opened < 5 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("five upstream connections within 12 s");
    wait_flowing(&rec, &ids, Duration::from_secs(5)).await;
    let reconnects = node.metric("tether_feed_upstream_reconnects_total", &["feed=\"f0\""]).await;
    assert!(reconnects >= 4.0, "reconnects = {reconnects}");
    let resumes = up.resumes(&ids[0]);
    eprintln!("resume points of the upstream connections: {resumes:?}");
    assert!(resumes.windows(2).all(|w| w[1] > w[0]), "each reconnect resumes further on: {resumes:?}");
    let checked = rec.assert_continuous();
    assert!(checked > 100, "only {checked} messages");
    eprintln!("{checked} messages over {} upstream connections, gap-free", resumes.len());
}
