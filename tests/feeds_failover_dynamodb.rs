//! Feeds owned by leases across real nodes on the DynamoDB store (docs/feeds.md, issue 11;
//! cargo feature `dynamodb`): `tether serve` processes with the Redis broker on a real
//! `redis-server` and `[feeds] store = "dynamodb"` on a real moto server (`tests/common/moto.rs`),
//! the test upstream of `tests/common/upstream.rs`. Timings: renew 500 ms, lease 2 s,
//! reconcile 1 s, skew margin 500 ms ([`MOTO_TIMINGS`]: twice the test timings of
//! `tests/feeds_failover.rs` but for the reconcile, because moto is slow, see there).
//!
//! - the three-node scenario of `tests/feeds_failover.rs` on DynamoDB (shared code:
//!   `common::feeds::three_nodes_scenario`): thirty feeds sampled every 50 ms, one upstream
//!   connection each; SIGTERM handover within 2 s (every lease released and announced);
//!   kill -9 takeover within lease + reconcile;
//!   every channel gap-free and duplicate-free;
//! - the paused-owner scenario (shared too): SIGSTOP past the lease, takeover, SIGCONT: the
//!   old owner is fenced out or stops first, no duplicate, no reorder;
//! - the SIGTERM handover is announced through the broker's Redis: with a reconcile interval
//!   of 60 s, the other node still takes every released feed within 2 s.
//!
//! Run: `cargo test --release --features dynamodb --test feeds_failover_dynamodb` (about 35 s).
//!
//! The nodes get moto's dummy keys through the environment (`AWS_ACCESS_KEY_ID`, …: the AWS
//! SDK's default chain, as in production); the test creates the table first.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::feeds::{
    feed_ids, node_config_with, paused_owner_scenario, redis_broker, three_nodes_scenario, wait_owned, Timings,
    INTERVAL,
};
use common::moto::MotoProc;
use common::redis::RedisProc;
use common::upstream::Upstream;
use common::Server;
use tether::feeds::{DynamoConfig, DynamoCredentials, DynamoLeaseStore};

const TABLE: &str = "tether_feeds";

/// Renew 500 ms, lease 2 s, reconcile 1 s, skew margin 500 ms. The feed runtime bounds each
/// store call by `renew_ms`; moto is one Python process answering one request at a time, and
/// on the shared 2-core CI box its answers took 27 ms median but 300 ms at p99 while three
/// nodes renewed thirty feeds (`cargo bench --bench feed_failover`, column GetItem). With the
/// 250 ms of the test timings, renewals then fail now and then, leases pass between nodes in
/// steady state, and the test would measure moto rather than tether.
const MOTO_TIMINGS: Timings = Timings { renew_ms: 500, lease_ms: 2_000, reconcile_ms: 1_000, skew_margin_ms: 500 };

/// The environment of every node: moto accepts any keys; no instance metadata lookups.
const AWS_ENV: [(&str, &str); 3] =
    [("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_EC2_METADATA_DISABLED", "true")];

/// A moto server with the feeds table created.
async fn moto_with_table() -> MotoProc {
    let m = MotoProc::start();
    let cfg = DynamoConfig {
        endpoint: Some(m.endpoint()),
        credentials: DynamoCredentials::Static { access_key_id: "test".into(), secret_access_key: "test".into() },
        call_timeout_ms: 10_000,
        ..DynamoConfig::new(TABLE)
    };
    let store = DynamoLeaseStore::connect(&cfg).await.expect("connect to moto");
    store.ensure_table().await.expect("create the feeds table");
    m
}

/// The `[feeds]` lines of a node on the table in `moto`, with `timings`.
fn dynamodb_feeds(moto: &MotoProc, timings: &str) -> String {
    format!(
        "store = \"dynamodb\"\ndynamodb_table = \"{TABLE}\"\ndynamodb_endpoint = \"{}\"\n{timings}",
        moto.endpoint()
    )
}

/// What a test runs on: a redis-server (the broker), moto with the table, the upstream of
/// `ids`, and the node config (`[feeds]` on DynamoDB with the given timings).
struct Rig {
    redis: RedisProc,
    _moto: MotoProc,
    up: Upstream,
    ids: Vec<String>,
    cfg: String,
}

/// A [`Rig`] of `n` feeds, Redis keys under `prefix`.
async fn rig(n: usize, prefix: &str, timings: &Timings) -> Rig {
    let redis = RedisProc::start();
    let moto = moto_with_table().await;
    let up = Upstream::start(INTERVAL, None).await;
    let ids = feed_ids(n);
    let cfg = node_config_with(&redis_broker(&redis, prefix), &dynamodb_feeds(&moto, &timings.toml()), &up, &ids);
    Rig { redis, _moto: moto, up, ids, cfg }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_thirty_feeds_one_owner_each_and_handover_on_dynamodb() {
    let _serial = common::serial().await;
    let r = rig(30, "fd3:", &MOTO_TIMINGS).await;
    three_nodes_scenario(&r.cfg, &AWS_ENV, &MOTO_TIMINGS, &r.up, &r.ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_owner_is_fenced_out_after_takeover_on_dynamodb() {
    let _serial = common::serial().await;
    let r = rig(3, "fds:", &MOTO_TIMINGS).await;
    paused_owner_scenario(&r.cfg, &AWS_ENV, &MOTO_TIMINGS, &r.up, &r.ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_release_reaches_the_other_node_through_redis() {
    let _serial = common::serial().await;
    // A reconcile once a minute: only a release notification can hand over within 2 s.
    let timings = Timings { reconcile_ms: 60_000, ..MOTO_TIMINGS };
    let r = rig(4, "fdr:", &timings).await;
    let (redis, up, ids, cfg) = (&r.redis, &r.up, &r.ids, &r.cfg);
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut first = Server::start_with_env(cfg, any, &[], &AWS_ENV);
    wait_owned(&[&first], Duration::from_secs(10), |n| n == 4).await;
    let second = Server::start_with_env(cfg, any, &[], &AWS_ENV);
    // Both nodes subscribed to the release topic (each does at its first reconcile, at start).
    let topic = "fdr:feeds:released";
    let start = std::time::Instant::now();
    loop {
        let numsub = redis.cli(&["PUBSUB", "NUMSUB", topic]);
        if numsub.lines().nth(1).map(str::trim) == Some("2") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "PUBSUB NUMSUB {topic}: {numsub:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(common::feeds::owned(&second).await, 0, "the first node holds every lease");

    first.signal(libc::SIGTERM);
    let t = wait_owned(&[&second], Duration::from_secs(5), |n| n == 4).await;
    eprintln!("takeover after SIGTERM with reconcile_ms = 60000: {} ms", t.as_millis());
    assert!(t <= Duration::from_secs(2), "SIGTERM handover took {t:?}: the release notification did not arrive");
    assert!(first.wait_exit(Duration::from_secs(10)).is_some(), "the drained node did not exit");
    common::feeds::assert_released_on_drain(&first);
    let offenders = || ids.iter().filter(|id| up.counts(id).open != 1).cloned().collect();
    common::feeds::wait_none("feeds without exactly one upstream connection", timings.renew() * 8, offenders).await;
    for id in ids {
        assert_eq!(up.counts(id).max_open, 1, "feed {id}: two upstream connections at once");
    }
}
