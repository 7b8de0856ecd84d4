//! The lease store's request metrics on a real node (docs/feeds.md, "Metrics"): one `tether
//! serve` with the Redis broker and the Redis lease store (a real `redis-server`), 40 feeds
//! on the test upstream, test timings (renew 250 ms). Once every feed is owned, over a 2 s
//! window read from `/metrics`:
//! - the renews go out batched: `tether_feed_store_requests_total{op="renew_many"}` grows by
//!   one per renew interval, `op="renew"` not at all;
//! - each batch writes every owned lease once: `tether_feed_store_items_written_total` grows
//!   by 40 per `renew_many` request;
//! - the read-back is one `get_many` per renew interval;
//! - every op label is shown, 0 included.

mod common;

use std::time::{Duration, Instant};

use common::feeds::{feed_ids, node_config};
use common::redis::RedisProc;
use common::upstream::Upstream;
use common::Server;

const FEEDS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renews_are_batched_and_counted() {
    let _serial = common::serial().await;
    let redis = RedisProc::start();
    let up = Upstream::start(Duration::from_millis(200), None).await;
    let ids = feed_ids(FEEDS);
    let broker = format!("kind = \"redis\"\nurl = \"{}\"\nkey_prefix = \"fsr:\"", redis.url());
    let node = Server::start(&node_config(&broker, "redis", &up, &ids), &[]);
    node.wait_metric("tether_feeds_owned", &[], Duration::from_secs(10), |n| n == FEEDS as f64).await;

    let text = node.metrics().await;
    for op in ["acquire", "delete", "get", "get_many", "list", "put", "release", "released", "renew", "renew_many"] {
        let line = format!("tether_feed_store_requests_total{{op=\"{op}\"}} ");
        assert!(text.0.lines().any(|l| l.starts_with(&line)), "no {line:?} in /metrics");
    }
    assert!(text.sum("tether_feed_store_requests_total", &["op=\"acquire\""]) >= FEEDS as f64);

    let read = |m: &common::Metrics| {
        let op = |o: &str| m.sum("tether_feed_store_requests_total", &[&format!("op=\"{o}\"")]);
        (op("renew_many"), op("renew"), op("get_many"), m.sum("tether_feed_store_items_written_total", &[]))
    };
    let (t0, a) = (Instant::now(), read(&node.metrics().await));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (b, secs) = (read(&node.metrics().await), t0.elapsed().as_secs_f64());
    let (batches, singles, reads, written) = (b.0 - a.0, b.1 - a.1, b.2 - a.2, b.3 - a.3);
    eprintln!(
        "over {secs:.2} s: {batches} renew_many, {singles} renew, {reads} get_many requests; {written} items written"
    );
    assert_eq!(singles, 0.0, "no single renews once renew_many exists");
    // One batch per 250 ms: 8 in 2 s; a loaded box may delay a tick, and the window's edges
    // may catch one more or less.
    let expected = secs / 0.25;
    assert!(batches >= expected - 4.0 && batches <= expected + 1.0, "{batches} renew_many requests in {secs:.2} s");
    assert!((reads - batches).abs() <= 1.0, "one get_many read-back per renew: {reads} for {batches} renews");
    // Each batch renews all 40 leases; the last one's writes may be counted after the read.
    let per_batch = FEEDS as f64;
    assert!(
        (written - per_batch * batches).abs() <= per_batch,
        "{written} items written by {batches} batches of {FEEDS} leases"
    );
}
