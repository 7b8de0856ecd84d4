//! Lease writes say "unknown" when the outcome is unknown (issue 26, item 2; docs/feeds.md):
//! the Redis lease store on a real `redis-server` with `request_timeout_ms = 500`:
//! - Redis asleep (`DEBUG SLEEP 3`) during an `acquire`: `LeaseError::Unknown` within
//!   `request_timeout_ms` + 1 s; when Redis wakes, the script it runs late writes nothing
//!   (no owner, fencing token unchanged), and the retry acquires with the next token;
//! - Redis busy a little over the timeout during a `renew`: `LeaseError::Store` (the script
//!   answered `LATE`), and the lease's expiry is unchanged; busy under the timeout: renewed;
//! - the store's connection killed (`CLIENT KILL`): the next write fails (unknown: it met
//!   the dead connection, or not sent), the one after it goes through on a new connection;
//! - the admin API of a real node on the Redis lease store: a `PUT /feeds/{id}` while Redis
//!   sleeps is 504 `{"error":…,"outcome":"unknown"}` within 1.5 s, and, because the late
//!   script wrote nothing, the feed does not exist once Redis wakes.

mod common;
// Only its `def` is used here, not its contract tests.
#[allow(unused_macros)]
mod lease_contract;

use std::time::{Duration, Instant};

use common::redis::RedisProc;
use common::{check, eventually, http_request, Server, STEP};
use lease_contract::def;
use serde_json::{json, Value};
use tether::config::{Broker as BrokerConfig, BrokerKind};
use tether::feeds::{LeaseError, LeaseStore, LeaseTerm, RedisLeaseStore, Renewal};

const TIMEOUT_MS: u64 = 500;
const ANSWER_LIMIT: Duration = Duration::from_millis(TIMEOUT_MS + 1000);
const LEASE_MS: u64 = 60_000;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

async fn store(r: &RedisProc) -> RedisLeaseStore {
    let cfg = BrokerConfig {
        kind: BrokerKind::Redis,
        url: r.url(),
        request_timeout_ms: TIMEOUT_MS,
        ..BrokerConfig::default()
    };
    RedisLeaseStore::connect(&cfg).await.expect("connect the lease store to redis")
}

/// A Redis, the lease store on it, and feed `id` in it; with the test's serial guard.
async fn start(id: &str) -> (tokio::sync::MutexGuard<'static, ()>, RedisProc, RedisLeaseStore) {
    let serial = common::serial().await;
    let redis = RedisProc::start();
    let s = store(&redis).await;
    s.put(&def(id)).await.expect("put");
    (serial, redis, s)
}

/// Joins the `DEBUG SLEEP` thread: Redis is awake again.
async fn woken(sleeper: std::thread::JoinHandle<()>) {
    tokio::task::spawn_blocking(move || sleeper.join().expect("DEBUG SLEEP")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_while_redis_sleeps_is_unknown_and_writes_nothing() {
    let (_serial, redis, s) = start("f1").await;

    let sleeper = redis.debug_sleep(3.0);
    let t0 = Instant::now();
    let r = s.acquire("f1", LeaseTerm { owner: "node-a", now_ms: now_ms(), lease_ms: LEASE_MS }).await;
    let took = t0.elapsed();
    eprintln!("acquire while redis sleeps 3 s: {r:?} after {took:?}");
    assert!(matches!(r, Err(LeaseError::Unknown(_))), "{r:?}");
    assert!(took <= ANSWER_LIMIT, "answered after {took:?}");
    woken(sleeper).await;

    // The store's one connection saw its request time out; a fresh store reads what Redis
    // holds after running the late script.
    let s = store(&redis).await;
    let f = s.get("f1").await.expect("get").expect("f1 exists");
    assert_eq!((f.lease.lease_owner.as_deref(), f.lease.fencing_token), (None, 0), "the late acquire wrote: {f:?}");
    assert_eq!(
        s.acquire("f1", LeaseTerm { owner: "node-a", now_ms: now_ms(), lease_ms: LEASE_MS }).await,
        Ok(1),
        "the retry takes the first token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_while_redis_is_busy() {
    let (_serial, redis, s) = start("f2").await;
    let t = now_ms();
    let token = s.acquire("f2", LeaseTerm { owner: "node-a", now_ms: t, lease_ms: LEASE_MS }).await.expect("acquire");
    let expiry = || async { store(&redis).await.get("f2").await.expect("get").expect("f2").lease.lease_expires_at_ms };
    assert_eq!(expiry().await, t + LEASE_MS);

    // Busy 0.9 s: the renew runs past its deadline and writes nothing (`LATE`), answered
    // within the 1.0 s wait: certainly not renewed.
    let sleeper = redis.debug_sleep(0.9);
    let t0 = Instant::now();
    let r = s
        .renew(
            LeaseTerm { owner: "node-a", now_ms: t + 1, lease_ms: LEASE_MS },
            Renewal { id: "f2", token, last_seq: Some("7") },
        )
        .await;
    let took = t0.elapsed();
    eprintln!("renew while redis is busy 0.9 s: {r:?} after {took:?}");
    woken(sleeper).await;
    match &r {
        Err(LeaseError::Store(e)) => assert!(e.contains("LATE"), "{e}"),
        other => panic!("renew past its deadline: {other:?}"),
    }
    assert!(took <= ANSWER_LIMIT);
    assert_eq!(expiry().await, t + LEASE_MS, "a LATE renew moved the expiry");

    // Busy 0.3 s: within the timeout, renewed.
    let sleeper = redis.debug_sleep(0.3);
    let r = s
        .renew(
            LeaseTerm { owner: "node-a", now_ms: t + 2, lease_ms: LEASE_MS },
            Renewal { id: "f2", token, last_seq: Some("8") },
        )
        .await;
    woken(sleeper).await;
    assert_eq!(r, Ok(()));
    assert_eq!(expiry().await, t + 2 + LEASE_MS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_put_while_redis_sleeps_is_504() {
    let _serial = common::serial().await;
    let redis = RedisProc::start();
    let config = format!(
        "cores = 1\n[broker]\nkind = \"redis\"\nurl = \"{}\"\nrequest_timeout_ms = {TIMEOUT_MS}\n[feeds]\nstore = \"redis\"\n",
        redis.url()
    );
    let node = Server::start(&config, &[]);
    // The feeds thread is idle once its first reconcile subscribed to release notifications
    // (else the admin request would wait behind that reconcile, which waits for Redis).
    eventually(STEP, "the node subscribed to releases", || {
        let numsub = redis.cli(&["PUBSUB", "NUMSUB", "tether:feeds:released"]);
        std::future::ready(check(numsub.lines().nth(1) == Some("1"), || numsub.clone()))
    })
    .await;
    assert_eq!(http_request(node.addr, "GET", "/feeds", &[], b"").await.0, 200);
    let body =
        json!({"url": "ws://127.0.0.1:9/x", "channel": "feed.api", "desired_state": "STOPPED", "seq_pointer": "/seq"})
            .to_string();

    let sleeper = redis.debug_sleep(3.0);
    let t0 = Instant::now();
    let (status, _, reply) = http_request(node.addr, "PUT", "/feeds/api", &[], body.as_bytes()).await;
    let took = t0.elapsed();
    let v: Value = serde_json::from_slice(&reply).unwrap_or(Value::Null);
    eprintln!("PUT /feeds/api while redis sleeps 3 s: {status} after {took:?}: {v}");
    assert_eq!((status, v["outcome"].as_str()), (504, Some("unknown")), "{v}");
    assert!(took <= ANSWER_LIMIT, "answered after {took:?}");
    woken(sleeper).await;

    let s = store(&redis).await;
    assert_eq!(s.get("api").await, Ok(None), "the late put wrote the feed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_is_opened_again() {
    let (_serial, redis, s) = start("f3").await;
    let token =
        s.acquire("f3", LeaseTerm { owner: "node-a", now_ms: now_ms(), lease_ms: LEASE_MS }).await.expect("acquire");
    redis.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    let first = s
        .renew(
            LeaseTerm { owner: "node-a", now_ms: now_ms(), lease_ms: LEASE_MS },
            Renewal { id: "f3", token, last_seq: None },
        )
        .await;
    eprintln!("renew after CLIENT KILL: {first:?}");
    assert!(matches!(first, Ok(()) | Err(LeaseError::Unknown(_) | LeaseError::Store(_))), "{first:?}");
    assert_eq!(
        s.renew(
            LeaseTerm { owner: "node-a", now_ms: now_ms(), lease_ms: LEASE_MS },
            Renewal { id: "f3", token, last_seq: None }
        )
        .await,
        Ok(()),
        "on a new connection"
    );
    assert!(s.get("f3").await.expect("get").is_some());
}
