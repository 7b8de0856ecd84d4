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
//! The first two scenarios live in `common::feeds`, shared with `tests/feeds_failover_dynamodb.rs`
//! (the same on the DynamoDB store). `FEEDS_SAMPLE_S` sets the sampling time of the first test (default 10 s; the 20 s
//! is `FEEDS_SAMPLE_S=20`). Takeover times are printed (`takeover …`).

mod common;

use std::time::Duration;

use common::feeds::{
    channel, feed_ids, node_config, paused_owner_scenario, redis_broker, three_nodes_scenario, wait_flowing, Recorder,
    INTERVAL, TIMINGS,
};
use common::redis::RedisProc;
use common::upstream::Upstream;
use common::Server;

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
    three_nodes_scenario(&cfg, &[], &TIMINGS, &up, &ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_owner_is_fenced_out_after_takeover() {
    let _serial = common::serial().await;
    let (_redis, up, ids, cfg) = setup(3, "ffs:").await;
    paused_owner_scenario(&cfg, &[], &TIMINGS, &up, &ids).await;
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
