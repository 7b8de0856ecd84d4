//! Takeover figures of upstream feeds owned by leases (issue 11, docs/feeds.md): 3 nodes own
//! 30 feeds (the Redis broker on a redis-server of the bench's own; the Redis lease store,
//! and the DynamoDB one on moto when built with `--features dynamodb`), a test upstream in
//! this process numbering each feed's messages (`tests/common/upstream.rs`), and one
//! subscriber of all 30 channels on a 4th node that owns no feed and is never stopped.
//!
//! Each round, per case (store × timings):
//! 1. SIGTERM the node owning the most feeds; the takeover time is from the signal until the
//!    other two nodes' `tether_feeds_owned` add up to 30 (polled every 10 ms); the node is
//!    restarted once it has exited;
//! 2. once all 30 feeds are owned again with one upstream connection each, kill -9 the node
//!    owning the most; timed the same way; restarted.
//!
//! The subscriber counts, per channel over all rounds, messages **duplicated** (an upstream seq
//! not above the last one received) and **lost** (upstream seqs skipped), and gaps in tether's
//! own seq. Timings: `test` = renew 250 ms, lease 1 s, reconcile 1 s, skew margin 250 ms
//! (`tests/feeds_failover.rs`); `seed` = renew 5 s, lease 20 s, reconcile 60 s, skew margin
//! 2 s (the defaults): a kill -9 takeover then waits for the lease to run out and for the next
//! reconcile, 20–80 s a round.
//!
//! `cargo bench --bench feed_failover` (add `--features dynamodb` for the DynamoDB store).
//! Env: FEED_BENCH_STORES ("redis,dynamodb"; dynamodb needs the feature and moto,
//! `python3 -m pip install 'moto[server]'`), FEED_BENCH_TIMINGS ("test,seed"),
//! FEED_BENCH_ROUNDS (10), FEED_BENCH_SEED_ROUNDS (FEED_BENCH_ROUNDS: seed rounds are slow),
//! REDIS_SERVER (`redis-server` on the PATH). Prints a table; writes every round to
//! `target/bench/feed_failover.json`.
//!
//! Everything shares the box (2 cores here) with the upstream, the subscriber, redis-server
//! and moto: the takeover times include the nodes' and the store's scheduling delays.

mod common;
#[cfg(feature = "dynamodb")]
#[allow(dead_code)]
#[path = "../tests/common/moto.rs"]
mod moto;
#[allow(dead_code)]
#[path = "../tests/common/upstream.rs"]
mod upstream;
// upstream.rs waits through `super::wait`: the harness's, in common.
use common::wait;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;
use upstream::Upstream;

/// Feeds and feed-owning nodes of every case.
const FEEDS: usize = 30;
const NODES: usize = 3;
/// Upstream message interval per feed (20 msg/s each, 600 msg/s in all).
const INTERVAL: Duration = Duration::from_millis(50);

/// One set of `[feeds]` timings.
struct Timings {
    name: &'static str,
    renew_ms: u64,
    lease_ms: u64,
    reconcile_ms: u64,
    skew_margin_ms: u64,
}

const TEST: Timings =
    Timings { name: "test", renew_ms: 250, lease_ms: 1_000, reconcile_ms: 1_000, skew_margin_ms: 250 };
const SEED: Timings =
    Timings { name: "seed", renew_ms: 5_000, lease_ms: 20_000, reconcile_ms: 60_000, skew_margin_ms: 2_000 };

impl Timings {
    fn toml(&self) -> String {
        format!(
            "renew_ms = {}\nlease_ms = {}\nreconcile_ms = {}\nskew_margin_ms = {}\n",
            self.renew_ms, self.lease_ms, self.reconcile_ms, self.skew_margin_ms
        )
    }

    /// Bound on any wait of a round: a whole lease, a whole reconcile, and 20 s of slack.
    fn limit(&self) -> Duration {
        Duration::from_millis(self.lease_ms + self.reconcile_ms + 20_000)
    }
}

/// What the subscriber saw on one channel.
#[derive(Default, Clone, Copy)]
struct Stream {
    received: u64,
    duplicated: u64,
    lost: u64,
    seq_gaps: u64,
    last_upstream: Option<u64>,
    last_seq: Option<u64>,
}

impl Stream {
    fn record(&mut self, seq: u64, upstream: u64) {
        self.received += 1;
        match self.last_upstream {
            Some(last) if upstream <= last => self.duplicated += 1,
            Some(last) => {
                self.lost += upstream - last - 1;
                self.last_upstream = Some(upstream);
            }
            None => self.last_upstream = Some(upstream),
        }
        if self.last_seq.is_some_and(|last| seq != last + 1) {
            self.seq_gaps += 1;
        }
        self.last_seq = Some(seq);
    }
}

/// Per channel; `ended` is set if the subscriber's connection ended.
#[derive(Default)]
struct Seen {
    streams: HashMap<String, Stream>,
    ended: Option<String>,
}

/// Subscribes to `channels` on `url` (again after an `unavailable` refusal) and records every
/// `msg` into `seen` until the connection ends.
async fn subscriber(url: String, channels: Vec<String>, seen: Arc<Mutex<Seen>>) {
    let (mut ws, _) = match tokio_tungstenite::connect_async(url.as_str()).await {
        Ok(c) => c,
        Err(e) => return seen.lock().unwrap().ended = Some(format!("connect {url}: {e}")),
    };
    for ch in &channels {
        let sub = json!({"op": "sub", "ch": ch}).to_string();
        if ws.send(Message::text(sub)).await.is_err() {
            return seen.lock().unwrap().ended = Some("send sub".into());
        }
    }
    while let Some(m) = ws.next().await {
        let Ok(Message::Text(t)) = m else {
            if let Err(e) = m {
                seen.lock().unwrap().ended = Some(format!("read: {e}"));
                return;
            }
            continue;
        };
        let v: Value = serde_json::from_str(&t).unwrap_or_default();
        if v["op"] == "error" && v["code"] == "unavailable" {
            tokio::time::sleep(Duration::from_millis(v["retry_after_ms"].as_u64().unwrap_or(100))).await;
            let _ = ws.send(Message::text(json!({"op": "sub", "ch": v["ch"]}).to_string())).await;
        } else if v["op"] == "msg" {
            let (Some(ch), Some(seq), Some(up)) = (v["ch"].as_str(), v["seq"].as_u64(), v["data"]["seq"].as_u64())
            else {
                continue;
            };
            seen.lock().unwrap().streams.entry(ch.to_owned()).or_default().record(seq, up);
        }
    }
    seen.lock().unwrap().ended.get_or_insert_with(|| "closed by the node".into());
}

/// The lease store of a case.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    Redis,
    Dynamodb,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Redis => "redis",
            Store::Dynamodb => "dynamodb",
        }
    }
}

/// The nodes of one case and what they share.
struct Case<'a> {
    up: &'a Upstream,
    ids: Vec<String>,
    channels: Vec<String>,
    seen: Arc<Mutex<Seen>>,
    config: String,
    nodes: Vec<Server>,
    t: &'a Timings,
    label: String,
}

impl Case<'_> {
    fn start_node(&self, i: usize) -> Server {
        serve(&format!("feed-failover-{}-n{i}", self.label), 1, &self.config)
    }

    /// `tether_feeds_owned` of each node (0 for one that does not answer).
    fn owned(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.metric_sync("tether_feeds_owned", &[]).unwrap_or(0.0) as u64).collect()
    }

    /// Messages received so far on each channel.
    fn received(&self) -> Vec<u64> {
        let s = self.seen.lock().unwrap();
        self.channels.iter().map(|c| s.streams.get(c).map_or(0, |x| x.received)).collect()
    }

    /// Waits until all feeds are owned, each has exactly one upstream connection, and every
    /// channel delivered a message since the call (so a loss at a handover shows as a gap);
    /// panics with what it saw after the case's bound.
    fn settle(&self) {
        let marks = self.received();
        eventually_sync(self.t.limit(), &format!("{}: settled", self.label), || {
            let owned = self.owned();
            let bad: Vec<&String> = self.ids.iter().filter(|id| self.up.counts(id).open != 1).collect();
            let silent = self.received().iter().zip(&marks).filter(|(n, m)| n <= m).count();
            let settled = owned.iter().sum::<u64>() == FEEDS as u64 && bad.is_empty() && silent == 0;
            check(settled, || {
                format!(
                    "owned per node {owned:?}, feeds without one upstream connection {bad:?}, {silent} channels silent"
                )
            })
        });
    }

    /// Sends `sig` to the node owning the most feeds; returns the time until the other nodes
    /// own all feeds, and how many the victim owned. The victim is reaped and restarted.
    fn takeover(&mut self, sig: i32) -> (Duration, u64) {
        self.settle();
        let owned = self.owned();
        let victim = (0..NODES).max_by_key(|&i| owned[i]).expect("nodes");
        self.nodes[victim].signal(sig);
        let start = Instant::now();
        let took = loop {
            let others: u64 = (0..NODES)
                .filter(|&i| i != victim)
                .map(|i| self.nodes[i].metric_sync("tether_feeds_owned", &[]).unwrap_or(0.0) as u64)
                .sum();
            if others == FEEDS as u64 {
                break start.elapsed();
            }
            assert!(start.elapsed() < self.t.limit(), "{}: takeover not done within {:?}", self.label, self.t.limit());
            std::thread::sleep(Duration::from_millis(10));
        };
        if self.nodes[victim].wait_exit(Duration::from_secs(15)).is_none() {
            self.nodes[victim].stop(Duration::ZERO);
            eprintln!("warning: {}: node {victim} still ran 15 s after signal {sig}; killed", self.label);
        }
        self.nodes[victim] = self.start_node(victim);
        (took, owned[victim])
    }
}

/// `median` and max of `v` in ms.
fn summary(v: &[f64]) -> (f64, f64) {
    (median(v), v.iter().copied().fold(f64::NAN, f64::max))
}

/// Runs one case; returns its JSON.
fn run_case(
    rt: &tokio::runtime::Runtime,
    redis: &RedisProc,
    up: &Upstream,
    store: Store,
    t: &Timings,
    rounds: usize,
) -> Value {
    let label = format!("{}-{}", store.name(), t.name);
    let prefix = format!("fb-{label}:");
    let ids: Vec<String> = (0..FEEDS).map(|i| format!("{label}-f{i}")).collect();
    let broker = format!("[broker]\nkind = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n", redis.url());
    let base = "[drain]\nwindow_ms = 300\n[heartbeat]\nping_interval_ms = 600000\n";
    #[cfg(feature = "dynamodb")]
    let _moto = (store == Store::Dynamodb).then(|| rt.block_on(moto_with_table()));
    let store_toml = match store {
        Store::Redis => "store = \"redis\"\n".to_string(),
        #[cfg(feature = "dynamodb")]
        Store::Dynamodb => format!(
            "store = \"dynamodb\"\ndynamodb_table = \"tether_feeds\"\ndynamodb_endpoint = \"{}\"\n",
            _moto.as_ref().expect("moto").endpoint()
        ),
        #[cfg(not(feature = "dynamodb"))]
        Store::Dynamodb => unreachable!("filtered out in main"),
    };
    let mut config = format!("{base}{broker}[feeds]\n{store_toml}{}", t.toml());
    for id in &ids {
        config.push_str(&format!(
            "[[feeds.static]]\nid = \"{id}\"\nurl = \"{}\"\nchannel = \"feed.{id}\"\nresume_query = \"from\"\nseq_pointer = \"/seq\"\n",
            up.url(id)
        ));
    }
    // The store's speed during the case: one GetItem every 100 ms from this process (DynamoDB
    // only: moto is one Python process, and its answer time is part of every takeover).
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    #[cfg(feature = "dynamodb")]
    let probe = _moto.as_ref().map(|m| rt.spawn(probe_store(m.endpoint(), ids[0].clone(), latencies.clone())));
    #[cfg(not(feature = "dynamodb"))]
    let probe: Option<tokio::task::JoinHandle<()>> = None;
    let edge = serve(&format!("feed-failover-{label}-edge"), 1, &format!("{base}{broker}"));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let channels: Vec<String> = ids.iter().map(|id| format!("feed.{id}")).collect();
    rt.spawn(subscriber(edge.ws_url(), channels.clone(), seen.clone()));
    let mut case = Case {
        up,
        ids,
        channels: channels.clone(),
        seen: seen.clone(),
        config,
        nodes: Vec::new(),
        t,
        label: label.clone(),
    };
    case.nodes = (0..NODES).map(|i| case.start_node(i)).collect();
    case.settle();

    let mut sigterm = Vec::new();
    let mut kill9 = Vec::new();
    let mut per_round = Vec::new();
    for round in 0..rounds {
        let (a, moved_a) = case.takeover(libc::SIGTERM);
        let (b, moved_b) = case.takeover(libc::SIGKILL);
        let (a_ms, b_ms) = (a.as_secs_f64() * 1e3, b.as_secs_f64() * 1e3);
        eprintln!(
            "{label} round {}/{rounds}: SIGTERM {moved_a} feeds in {a_ms:.0} ms, kill -9 {moved_b} feeds in {b_ms:.0} ms",
            round + 1
        );
        sigterm.push(a_ms);
        kill9.push(b_ms);
        per_round.push(json!({"sigterm_ms": a_ms, "sigterm_feeds": moved_a, "kill9_ms": b_ms, "kill9_feeds": moved_b}));
    }
    // Every channel delivers again after the last takeover, so a loss at its end shows as a gap.
    case.settle();
    let store_latency = probe.map(|p| {
        p.abort();
        let v = latencies.lock().unwrap().clone();
        let mut sorted = v.clone();
        sorted.sort_by(f64::total_cmp);
        let p99 = sorted.get((sorted.len() * 99 / 100).min(sorted.len().saturating_sub(1))).copied().unwrap_or(f64::NAN);
        json!({"calls": v.len(), "median_ms": median(&v), "p99_ms": p99, "max_ms": sorted.last().copied().unwrap_or(f64::NAN)})
    });
    let s = seen.lock().unwrap();
    let total = |f: fn(&Stream) -> u64| channels.iter().map(|c| s.streams.get(c).map_or(0, f)).sum::<u64>();
    let (received, duplicated, lost, seq_gaps) =
        (total(|x| x.received), total(|x| x.duplicated), total(|x| x.lost), total(|x| x.seq_gaps));
    let (st_med, st_max) = summary(&sigterm);
    let (k9_med, k9_max) = summary(&kill9);
    json!({
        "store": store.name(), "timings": t.name, "rounds": rounds,
        "renew_ms": t.renew_ms, "lease_ms": t.lease_ms, "reconcile_ms": t.reconcile_ms, "skew_margin_ms": t.skew_margin_ms,
        "sigterm_median_ms": st_med, "sigterm_max_ms": st_max, "kill9_median_ms": k9_med, "kill9_max_ms": k9_max,
        "received": received, "duplicated": duplicated, "lost": lost, "tether_seq_gaps": seq_gaps,
        "received_per_channel": channels.iter().map(|c| s.streams.get(c).map_or(0, |x| x.received)).collect::<Vec<_>>(),
        "subscriber_ended": s.ended, "store_get_latency": store_latency, "rounds_detail": per_round,
    })
}

/// A DynamoDB store on moto at `endpoint` (dummy keys, 10 s per call).
#[cfg(feature = "dynamodb")]
async fn moto_store(endpoint: String) -> tether::feeds::DynamoLeaseStore {
    use tether::feeds::{DynamoConfig, DynamoCredentials, DynamoLeaseStore};
    let cfg = DynamoConfig {
        endpoint: Some(endpoint),
        credentials: DynamoCredentials::Static { access_key_id: "test".into(), secret_access_key: "test".into() },
        call_timeout_ms: 10_000,
        ..DynamoConfig::new("tether_feeds")
    };
    DynamoLeaseStore::connect(&cfg).await.expect("connect to moto")
}

/// A moto server with the feeds table, for the DynamoDB store.
#[cfg(feature = "dynamodb")]
async fn moto_with_table() -> moto::MotoProc {
    let m = moto::MotoProc::start();
    moto_store(m.endpoint()).await.ensure_table().await.expect("create the feeds table");
    m
}

/// Reads feed `id` every 100 ms, pushing each call's time in ms to `out`, until aborted.
#[cfg(feature = "dynamodb")]
async fn probe_store(endpoint: String, id: String, out: Arc<Mutex<Vec<f64>>>) {
    use tether::feeds::LeaseStore;
    let store = moto_store(endpoint).await;
    loop {
        let start = Instant::now();
        if store.get(&id).await.is_ok() {
            out.lock().unwrap().push(start.elapsed().as_secs_f64() * 1e3);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn main() {
    if !should_run() {
        return;
    }
    // The nodes' DynamoDB store takes its keys from the SDK's chain: moto accepts any. Set
    // before any thread starts.
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    pin_binary("feed_failover");
    let stores: Vec<Store> = env_or("FEED_BENCH_STORES", "redis,dynamodb".to_string())
        .split(',')
        .filter_map(|s| match s.trim() {
            "redis" => Some(Store::Redis),
            "dynamodb" if cfg!(feature = "dynamodb") => Some(Store::Dynamodb),
            "dynamodb" => {
                eprintln!("skipping the DynamoDB store: build with --features dynamodb");
                None
            }
            other => panic!("FEED_BENCH_STORES: unknown store {other:?} (redis, dynamodb)"),
        })
        .collect();
    let timings: Vec<&Timings> = env_or("FEED_BENCH_TIMINGS", "test,seed".to_string())
        .split(',')
        .map(|s| match s.trim() {
            "test" => &TEST,
            "seed" => &SEED,
            other => panic!("FEED_BENCH_TIMINGS: unknown timings {other:?} (test, seed)"),
        })
        .collect();
    let rounds: usize = env_or("FEED_BENCH_ROUNDS", 10);
    let seed_rounds: usize = env_or("FEED_BENCH_SEED_ROUNDS", rounds);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    let redis = RedisProc::start();
    let up = rt.block_on(Upstream::start(INTERVAL, None));
    let mut cases = Vec::new();
    for t in &timings {
        for &store in &stores {
            let n = if t.name == "seed" { seed_rounds } else { rounds };
            let started = Instant::now();
            let mut case = run_case(&rt, &redis, &up, store, t, n);
            case["wall_s"] = json!(started.elapsed().as_secs_f64());
            cases.push(case);
        }
    }
    let rows: Vec<Vec<String>> = cases
        .iter()
        .map(|c| {
            let ms = |k: &str| format!("{:.0}", num(c, k));
            vec![
                c["store"].as_str().unwrap_or("").to_string(),
                c["timings"].as_str().unwrap_or("").to_string(),
                c["rounds"].to_string(),
                ms("sigterm_median_ms"),
                ms("sigterm_max_ms"),
                ms("kill9_median_ms"),
                ms("kill9_max_ms"),
                c["received"].to_string(),
                c["duplicated"].to_string(),
                c["lost"].to_string(),
                c["tether_seq_gaps"].to_string(),
                match &c["store_get_latency"] {
                    Value::Null => "-".into(),
                    l => format!("{:.0}/{:.0}", num(l, "median_ms"), num(l, "p99_ms")),
                },
            ]
        })
        .collect();
    table(
        &format!("feed takeover, {NODES} nodes x {FEEDS} feeds (times in ms from the signal until the other nodes own all feeds)"),
        &["store", "timings", "rounds", "SIGTERM med", "max", "kill -9 med", "max", "msgs", "dup", "lost", "seq gaps", "GetItem ms med/p99"],
        &rows,
    );
    write_json(
        "feed_failover",
        &json!({"feeds": FEEDS, "nodes": NODES, "interval_ms": INTERVAL.as_millis() as u64, "cases": cases}),
    );
}
