//! The feed lease store (docs/feeds.md, DESIGN §6 "Upstream feeds") on `MemoryLeaseStore` and
//! on `RedisLeaseStore` against a real `redis-server` started by the test (one per test, Unix
//! socket, killed by PID on drop): the shared contract of `tests/lease_contract` (racing
//! acquirers, takeovers and fencing, release and its notification, replacing a definition,
//! 1,000 feeds, argument checks) once per store, then what only Redis has:
//! - `get_many` of 1,000 feeds is one command from the client (one round trip), counted with
//!   `INFO commandstats` and `INFO stats` `total_commands_processed`;
//! - `renew_many` of 1,000 leases is two script calls (chunks of 500), counted as two requests;
//! - the layout is readable with `redis-cli` and survives a script cache flush.
//!
//! The DynamoDB store runs the same contract in `tests/feed_leases_dynamodb.rs`.

mod common;
#[macro_use]
mod lease_contract;

use std::sync::Arc;

use common::redis::RedisProc;
use lease_contract::{def, RACERS, T0};
use tether::config::{Broker as BrokerConfig, BrokerKind};
use tether::feeds::metrics::StoreOp;
use tether::feeds::{AnyStore, LeaseError, LeaseStore, LeaseTerm, MemoryLeaseStore, RedisLeaseStore, Renewal};

async fn redis_store(r: &RedisProc) -> RedisLeaseStore {
    let cfg = BrokerConfig { kind: BrokerKind::Redis, url: r.url(), ..BrokerConfig::default() };
    RedisLeaseStore::connect(&cfg).await.expect("connect the lease store to redis")
}

/// The contract runs through the front door ([`AnyStore`]), as the runtime calls a store:
/// it checks the arguments, the backend stores.
async fn memory_start() -> ((), Arc<AnyStore>) {
    ((), Arc::new(AnyStore::from(MemoryLeaseStore::new())))
}

/// One process, one store: every racer shares it.
async fn memory_racers(_: &(), s: &Arc<AnyStore>) -> Vec<Arc<AnyStore>> {
    vec![s.clone(); RACERS]
}

async fn redis_start() -> (RedisProc, Arc<AnyStore>) {
    let r = RedisProc::start();
    let s = Arc::new(AnyStore::from(redis_store(&r).await));
    (r, s)
}

/// One connection per racer, as separate nodes would have.
async fn redis_racers(r: &RedisProc, _: &Arc<AnyStore>) -> Vec<Arc<AnyStore>> {
    let mut nodes = Vec::with_capacity(RACERS);
    for _ in 0..RACERS {
        nodes.push(Arc::new(AnyStore::from(redis_store(r).await)));
    }
    nodes
}

lease_contract_tests!(memory, memory_start, memory_racers);
lease_contract_tests!(redis, redis_start, redis_racers);

/// A numeric field of `INFO` output, e.g. `total_commands_processed` or, inside a
/// `cmdstat_evalsha:calls=3,…` line, `calls` of that command (`cmdstat_evalsha`).
fn info_field(info: &str, line_key: &str, field: Option<&str>) -> u64 {
    let line = info
        .lines()
        .find_map(|l| l.trim().strip_prefix(line_key).and_then(|r| r.strip_prefix(':')))
        .unwrap_or_else(|| panic!("no {line_key} in INFO:\n{info}"));
    let text = match field {
        None => line,
        Some(f) => line
            .split(',')
            .find_map(|kv| kv.strip_prefix(f).and_then(|r| r.strip_prefix('=')))
            .unwrap_or_else(|| panic!("no {f} in {line_key}:{line}")),
    };
    text.trim().parse().unwrap_or_else(|e| panic!("{line_key} {text:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_get_many_of_1000_feeds_is_one_command() {
    let r = RedisProc::start();
    let s = redis_store(&r).await;
    let ids: Vec<String> = (0..1_000).map(|i| format!("g{i}")).collect();
    for id in &ids {
        s.put(&def(id)).await.unwrap();
    }
    s.get_many(&ids[..1]).await.unwrap(); // loads the script into Redis's cache
                                          // One INFO reads both counters; it counts itself only after it answered, so the next
                                          // reading includes it: calibrate with two readings and nothing in between.
    let read = || {
        let info = r.cli(&["INFO", "stats", "commandstats"]);
        let calls = |cmd: &str| info_field(&info, cmd, Some("calls"));
        (info_field(&info, "total_commands_processed", None), calls("cmdstat_evalsha"), calls("cmdstat_hmget"))
    };
    let (a, b) = (read(), read());
    let baseline = b.0 - a.0;
    let before = read();
    let got = s.get_many(&ids).await.unwrap();
    let after = read();
    assert_eq!(got.iter().flatten().count(), 1_000);
    let (total, evalsha, hmget) = (after.0 - before.0 - baseline, after.1 - before.1, after.2 - before.2);
    eprintln!("get_many(1000): {total} commands processed: {evalsha} EVALSHA from the client, {hmget} HMGET inside it");
    assert_eq!(evalsha, 1, "get_many of 1,000 feeds is one EVALSHA");
    assert_eq!(hmget, 1_000, "the script reads each feed once");
    // Redis 7 counts a script's own calls in total_commands_processed: whatever is left is
    // what the client sent.
    assert_eq!(total - hmget, 1, "get_many of 1,000 feeds is one command, one round trip");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renew_many_of_1000_leases_is_two_script_calls() {
    let r = RedisProc::start();
    let s = redis_store(&r).await;
    let ids: Vec<String> = (0..1_000).map(|i| format!("r{i}")).collect();
    let mut tokens = Vec::new();
    for id in &ids {
        s.put(&def(id)).await.unwrap();
        tokens.push(s.acquire(id, LeaseTerm { owner: "n1", now_ms: T0, lease_ms: 20_000 }).await.unwrap());
    }
    let leases: Vec<Renewal<'_>> =
        ids.iter().zip(&tokens).map(|(id, t)| Renewal { id, token: *t, last_seq: Some("5") }).collect();
    s.renew_many(LeaseTerm { owner: "n1", now_ms: T0 + 1, lease_ms: 20_000 }, &leases[..1]).await.unwrap(); // loads the script
    let evalsha = || info_field(&r.cli(&["INFO", "commandstats"]), "cmdstat_evalsha", Some("calls"));
    let (before, counted) = (evalsha(), s.requests().get(StoreOp::RenewMany));
    let got = s.renew_many(LeaseTerm { owner: "n1", now_ms: T0 + 2, lease_ms: 20_000 }, &leases).await.unwrap();
    assert!(got.iter().all(Result::is_ok));
    assert_eq!(evalsha() - before, 2, "1,000 leases are 2 script calls of 500");
    assert_eq!(s.requests().get(StoreOp::RenewMany) - counted, 2, "and counted as 2 requests");
    assert_eq!(r.cli(&["HGET", &s.feed_key("r999"), "lease_expires_at_ms"]).trim(), (T0 + 20_002).to_string());
    assert_eq!(r.cli(&["HGET", &s.feed_key("r0"), "last_seq"]).trim(), "5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_layout_is_readable_and_survives_a_script_flush() {
    let r = RedisProc::start();
    let s = redis_store(&r).await;
    s.put(&def("btc")).await.unwrap();
    let t = s.acquire("btc", LeaseTerm { owner: "node-a", now_ms: T0, lease_ms: 20_000 }).await.unwrap();
    s.renew(
        LeaseTerm { owner: "node-a", now_ms: T0 + 1, lease_ms: 20_000 },
        Renewal { id: "btc", token: t, last_seq: Some("77") },
    )
    .await
    .unwrap();
    // An independent reader (redis-cli) sees the hash and the index under the key prefix.
    let key = "tether:{feeds}:feed:btc";
    assert_eq!(s.feed_key("btc"), key);
    let hget = |f: &str| r.cli(&["HGET", key, f]).trim().to_owned();
    assert_eq!(hget("lease_owner"), "node-a");
    assert_eq!(hget("fencing_token"), "1");
    assert_eq!(hget("lease_expires_at_ms"), (T0 + 20_001).to_string());
    assert_eq!(hget("last_seq"), "77");
    assert_eq!(hget("url"), "wss://upstream.example/btc");
    assert_eq!(hget("desired_state"), "STARTED");
    assert_eq!(r.cli(&["SMEMBERS", "tether:{feeds}:ids"]).trim(), "btc");
    // After a restart Redis's script cache is empty: the scripts are sent again, nothing fails.
    r.cli(&["SCRIPT", "FLUSH"]);
    assert_eq!(s.acquire("btc", LeaseTerm { owner: "node-b", now_ms: T0 + 20_001, lease_ms: 20_000 }).await, Ok(2));
    assert_eq!(hget("lease_owner"), "node-b");
    // A time the Lua scripts could not add exactly is refused (by the front door) before it
    // reaches Redis.
    match AnyStore::from(redis_store(&r).await)
        .acquire("btc", LeaseTerm { owner: "node-c", now_ms: u64::MAX - 1, lease_ms: 20_000 })
        .await
    {
        Err(LeaseError::Invalid(e)) => assert_eq!(e.field, "now_ms"),
        other => panic!("{other:?}"),
    }
}
