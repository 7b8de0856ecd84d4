//! Lease-store requests per node at 1,000 feeds (issue 11, docs/feeds.md "Metrics"): three
//! `tether serve` nodes (one core each, the Redis broker on a redis-server of the bench's own)
//! share 1,000 feeds of a test upstream WebSocket server in this process
//! (`tests/common/upstream.rs`: one numbered message per feed per `FEED_BENCH_MSG_MS`), with
//! the seed timings (renew 5 s, lease 20 s, reconcile 60 s, skew margin 2 s). First with the
//! Redis lease store, then with the DynamoDB store on moto (`tests/common/moto.rs`; needs
//! `--features dynamodb` and `python3 -m pip install 'moto[server]'`).
//!
//! Once all feeds are owned (and one more renew interval has passed, so the start's acquires
//! are over), it reads every node's `/metrics` (`tether_feed_store_requests_total{op}`,
//! `tether_feed_store_items_written_total`, `tether_feeds_owned`) at the start and the end of
//! a window, and prints per node: store requests per second by op, items written per second,
//! and items written and requests per owned feed per renew interval. On DynamoDB it also
//! counts the requests moto logged in the window, as a check of the metric from the other
//! side. Writes `target/bench/feed_leases.json`.
//!
//! ```text
//! cargo bench --features dynamodb --bench feed_leases
//! FEED_BENCH_WINDOW_S=60 FEED_BENCH_ROUNDS=3 FEED_BENCH_STORES=redis,dynamodb \
//!   FEED_BENCH_FEEDS=1000 FEED_BENCH_MSG_MS=1000 cargo bench --features dynamodb --bench feed_leases
//! ```

mod common;
#[cfg(feature = "dynamodb")]
#[path = "../tests/common/moto.rs"]
#[allow(dead_code)]
mod moto;
#[path = "../tests/common/upstream.rs"]
#[allow(dead_code)]
mod upstream;
// upstream.rs waits through `super::wait`: the harness's, in common.
use common::wait;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// The seed timings, ms.
const RENEW_MS: u64 = 5_000;
const TIMINGS: &str = "renew_ms = 5000\nlease_ms = 20000\nreconcile_ms = 60000\nskew_margin_ms = 2000\n";
/// The ops of `tether_feed_store_requests_total`, in its label order.
const OPS: [&str; 10] =
    ["acquire", "delete", "get", "get_many", "list", "put", "release", "released", "renew", "renew_many"];
/// Nodes sharing the feeds.
const NODES: usize = 3;
/// How long the nodes may take to own every feed.
const OWN_LIMIT: Duration = Duration::from_secs(300);

/// One node's counters at one moment.
#[derive(Clone, Debug, Default)]
struct Reading {
    requests: [f64; OPS.len()],
    written: f64,
    owned: f64,
    renew_failures: f64,
    takeovers: f64,
}

fn read(node: &Server) -> Reading {
    let m = node.scrape().unwrap_or_else(|| panic!("node {} did not answer /metrics", node.addr));
    let mut r = Reading {
        written: m.sum("tether_feed_store_items_written_total", &[]),
        owned: m.sum("tether_feeds_owned", &[]),
        renew_failures: m.sum("tether_feed_lease_renew_failures_total", &[]),
        takeovers: m.sum("tether_feed_takeovers_total", &[]),
        ..Reading::default()
    };
    for (i, op) in OPS.iter().enumerate() {
        r.requests[i] = m.sum("tether_feed_store_requests_total", &[&format!("op=\"{op}\"")]);
    }
    r
}

/// The node config: one core, the Redis broker at `url` (`unix://…`), `store_toml` (the `[feeds]` store
/// lines), the seed timings, and one `[[feeds.static]]` per feed of `up`.
fn node_config(url: &str, store_toml: &str, up: &upstream::Upstream, feeds: usize) -> String {
    let mut t = format!(
        "cores = 1\n[drain]\nwindow_ms = 1000\n\
         [broker]\nkind = \"redis\"\nurl = \"{url}\"\n[feeds]\n{store_toml}{TIMINGS}"
    );
    for i in 0..feeds {
        let id = format!("f{i:04}");
        t.push_str(&format!(
            "[[feeds.static]]\nid = \"{id}\"\nurl = \"{}\"\nchannel = \"feed.{id}\"\nresume_query = \"from\"\nseq_pointer = \"/seq\"\n",
            up.url(&id)
        ));
    }
    t
}

/// A store under test, and what keeps its server alive.
enum Backend {
    Redis,
    #[cfg(feature = "dynamodb")]
    Dynamo(moto::MotoProc),
}

impl Backend {
    fn start(name: &str, rt: &tokio::runtime::Runtime) -> Option<Backend> {
        match name {
            "redis" => Some(Backend::Redis),
            #[cfg(feature = "dynamodb")]
            "dynamodb" => {
                let m = moto::MotoProc::start();
                let cfg = tether::feeds::DynamoConfig {
                    endpoint: Some(m.endpoint()),
                    credentials: tether::feeds::DynamoCredentials::Static {
                        access_key_id: "bench".into(),
                        secret_access_key: "bench".into(),
                    },
                    call_timeout_ms: 10_000,
                    ..tether::feeds::DynamoConfig::new("tether_feeds")
                };
                rt.block_on(async {
                    let s = tether::feeds::DynamoLeaseStore::connect(&cfg).await.expect("connect to moto");
                    s.ensure_table().await.expect("create the table on moto");
                });
                Some(Backend::Dynamo(m))
            }
            other => {
                let _ = rt;
                println!("skipping store {other:?}: not known to this build (DynamoDB needs --features dynamodb)");
                None
            }
        }
    }

    fn store_toml(&self) -> String {
        match self {
            Backend::Redis => "store = \"redis\"\n".into(),
            #[cfg(feature = "dynamodb")]
            Backend::Dynamo(m) => format!("store = \"dynamodb\"\ndynamodb_endpoint = \"{}\"\n", m.endpoint()),
        }
    }

    /// Requests the store's server logged so far, when it logs them (moto: one line each).
    fn logged_requests(&self) -> Option<u64> {
        match self {
            Backend::Redis => None,
            #[cfg(feature = "dynamodb")]
            Backend::Dynamo(m) => {
                Some(m.log_tail(usize::MAX).lines().filter(|l| l.contains("\"POST / HTTP")).count() as u64)
            }
        }
    }
}

/// Waits until the nodes own `feeds` together; returns the time taken.
fn wait_owned(nodes: &[Server], feeds: usize, limit: Duration) -> Duration {
    let start = Instant::now();
    eventually_sync(limit, &format!("the nodes owning {feeds} feeds"), || {
        let owned: f64 = nodes.iter().map(|n| n.metric_sync("tether_feeds_owned", &[]).unwrap_or(0.0)).sum();
        check(owned as usize == feeds, || format!("{owned} owned"))
    });
    start.elapsed()
}

/// One round on one store: start the store's server, the broker and three nodes, wait for
/// ownership, measure over `window`, stop everything. One JSON row per node.
fn round(
    store: &str,
    n: usize,
    feeds: usize,
    window: Duration,
    up: &upstream::Upstream,
    rt: &tokio::runtime::Runtime,
) -> Vec<Value> {
    let Some(backend) = Backend::start(store, rt) else { return Vec::new() };
    let redis = RedisProc::start();
    let cfg = node_config(&redis.url(), &backend.store_toml(), up, feeds);
    let mut nodes: Vec<Server> = (0..NODES).map(|i| serve(&format!("feed_leases_{i}"), 1, &cfg)).collect();
    let took = wait_owned(&nodes, feeds, OWN_LIMIT);
    println!("{store} round {n}: {feeds} feeds owned {took:.1?} after start; settling one renew interval");
    std::thread::sleep(Duration::from_millis(RENEW_MS));

    let (t0, logged0) = (Instant::now(), backend.logged_requests());
    let before: Vec<Reading> = nodes.iter().map(read).collect();
    std::thread::sleep(window);
    let after: Vec<Reading> = nodes.iter().map(read).collect();
    let (secs, logged1) = (t0.elapsed().as_secs_f64(), backend.logged_requests());
    let intervals = secs * 1000.0 / RENEW_MS as f64;

    let mut rows = Vec::new();
    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
        let by_op: serde_json::Map<String, Value> = OPS
            .iter()
            .enumerate()
            .map(|(k, op)| (op.to_string(), json!((b.requests[k] - a.requests[k]) / secs)))
            .collect();
        let requests: f64 = (0..OPS.len()).map(|k| b.requests[k] - a.requests[k]).sum();
        let written = b.written - a.written;
        let owned = b.owned;
        let per_feed = |v: f64| if owned > 0.0 { v / owned / intervals } else { 0.0 };
        rows.push(json!({
            "store": store,
            "round": n,
            "node": i,
            "feeds_owned": owned,
            "window_s": secs,
            "requests": requests,
            "requests_per_s": requests / secs,
            "requests_per_s_by_op": by_op,
            "items_written": written,
            "items_written_per_s": written / secs,
            "writes_per_feed_per_renew_interval": per_feed(written),
            "requests_per_feed_per_renew_interval": per_feed(requests),
            "renew_failures": b.renew_failures - a.renew_failures,
            "takeovers": b.takeovers - a.takeovers,
            "owned_at_start": a.owned,
        }));
    }
    if let (Some(l0), Some(l1)) = (logged0, logged1) {
        let counted: f64 = rows.iter().map(|r| num(r, "requests")).sum();
        println!(
            "{store} round {n}: moto logged {} requests in the window; the nodes' metrics counted {counted}",
            l1 - l0
        );
        for r in &mut rows {
            r["server_logged_requests_all_nodes"] = json!(l1 - l0);
        }
    }
    for node in &mut nodes {
        node.stop(STOP_GRACE);
    }
    // Redis, then the lease store, stop as they go out of scope (reverse order of declaration).
    rows
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn main() {
    if !should_run() {
        return;
    }
    pin_binary("feed_leases");
    let window = Duration::from_secs(env_or("FEED_BENCH_WINDOW_S", 60));
    let rounds: usize = env_or("FEED_BENCH_ROUNDS", 1);
    let feeds: usize = env_or("FEED_BENCH_FEEDS", 1_000);
    let msg_ms: u64 = env_or("FEED_BENCH_MSG_MS", 1_000);
    let stores: String = env_or("FEED_BENCH_STORES", "redis,dynamodb".to_string());
    // The nodes' DynamoDB store takes its credentials from the SDK's chain: moto accepts any
    // keys; no instance metadata lookup leaves the machine.
    std::env::set_var("AWS_ACCESS_KEY_ID", "bench");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "bench");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("the upstream's runtime");
    let up = rt.block_on(upstream::Upstream::start(Duration::from_millis(msg_ms), None));
    println!(
        "feed_leases: {NODES} nodes, {feeds} feeds (one message per {msg_ms} ms each), seed timings, window {window:?}, \
         {rounds} round(s), stores {stores}"
    );

    let mut rows = Vec::new();
    for store in stores.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        for n in 1..=rounds {
            rows.extend(round(store, n, feeds, window, &up, &rt));
        }
    }

    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let op = |o: &str| fmt(r["requests_per_s_by_op"][o].as_f64().unwrap_or(0.0));
            vec![
                r["store"].as_str().unwrap_or("").to_string(),
                r["round"].to_string(),
                r["node"].to_string(),
                fmt(num(r, "feeds_owned")),
                fmt(num(r, "requests_per_s")),
                op("renew_many"),
                op("get_many"),
                op("list"),
                op("acquire"),
                op("renew"),
                fmt(num(r, "items_written_per_s")),
                fmt(num(r, "writes_per_feed_per_renew_interval")),
                fmt(num(r, "requests_per_feed_per_renew_interval")),
                fmt(num(r, "renew_failures")),
            ]
        })
        .collect();
    table(
        &format!("lease store requests per node, {feeds} feeds, renew every {} s, window {window:?}", RENEW_MS / 1000),
        &[
            "store",
            "round",
            "node",
            "owned",
            "req/s",
            "renew_many/s",
            "get_many/s",
            "list/s",
            "acquire/s",
            "renew/s",
            "writes/s",
            "writes/feed/renew",
            "req/feed/renew",
            "renew fails",
        ],
        &table_rows,
    );
    write_json(
        "feed_leases",
        &json!({
            "nodes": NODES,
            "feeds": feeds,
            "message_interval_ms": msg_ms,
            "timings": {"renew_ms": RENEW_MS, "lease_ms": 20_000, "reconcile_ms": 60_000, "skew_margin_ms": 2_000},
            "window_s": window.as_secs_f64(),
            "rounds": rounds,
            "loadavg_at_end": loadavg(),
            "rows": rows,
        }),
    );
}
