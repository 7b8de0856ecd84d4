//! The feed lease store (docs/feeds.md, DESIGN §6 "Upstream feeds"): the same behaviour
//! bodies run against `MemoryLeaseStore` and against `RedisLeaseStore` on a real
//! `redis-server` started by the test (one per test, Unix socket, killed by PID on drop).
//! Times are a simulated clock passed into every call.
//! - 32 concurrent acquirers of one feed (on Redis, 32 connections): exactly one wins, with fencing token 1, and every
//!   other is told who holds it;
//! - after expiry another node acquires with token + 1, and the old owner's renew and release
//!   are refused and change nothing;
//! - a release frees the lease at once (acquirable long before the old expiry), keeps
//!   `last_seq`, and notifies `released()` subscribers; a refused release notifies nobody;
//! - `put` replacing a definition keeps the lease fields (Redis: also read back with
//!   `redis-cli`);
//! - 1,000 feeds: `get_many` returns them in order with `None` for a missing id, `list` and
//!   `delete` agree; on Redis `get_many` is one command from the client (one round trip),
//!   counted with `INFO commandstats` and `INFO stats` `total_commands_processed`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis::RedisProc;
use tether::config::{Broker as BrokerConfig, BrokerKind};
use tether::feeds::{DesiredState, FeedDef, LeaseError, LeaseStore, MemoryLeaseStore, RedisLeaseStore};

/// The simulated clock's start, Unix epoch ms.
const T0: u64 = 1_700_000_000_000;
/// Bound on every wait for a notification.
const WAIT: Duration = Duration::from_secs(5);

fn def(id: &str) -> FeedDef {
    FeedDef {
        id: id.into(),
        url: format!("wss://upstream.example/{id}"),
        channel: format!("feed.{id}"),
        desired_state: DesiredState::Started,
        subscribe: r#"{"op":"sub","from":{last_seq}}"#.into(),
        resume_query: "from".into(),
        seq_pointer: "/seq".into(),
    }
}

async fn redis_store(r: &RedisProc) -> RedisLeaseStore {
    let cfg = BrokerConfig { kind: BrokerKind::Redis, url: r.url(), ..BrokerConfig::default() };
    RedisLeaseStore::connect(&cfg).await.expect("connect the lease store to redis")
}

/// Acquirers racing for one feed, one per store handle in `nodes` (with Redis, each its own
/// connection, as separate nodes would be).
const RACERS: usize = 32;

async fn one_of_many_concurrent_acquirers_wins<S: LeaseStore + 'static>(nodes: Vec<Arc<S>>) {
    const N: usize = RACERS;
    assert_eq!(nodes.len(), N);
    let s = nodes[0].clone();
    assert!(s.put(&def("race")).await.unwrap());
    let start = Arc::new(tokio::sync::Barrier::new(N));
    let mut tasks = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let (s, start) = (node.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            (i, s.acquire("race", &format!("node-{i}"), T0, 20_000).await)
        }));
    }
    let mut winners = Vec::new();
    let mut held_by = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (i, Ok(token)) => winners.push((i, token)),
            (_, Err(LeaseError::Held { owner, expires_at_ms })) => held_by.push((owner, expires_at_ms)),
            (i, Err(e)) => panic!("acquirer {i}: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one acquirer wins: {winners:?}");
    let (w, token) = winners[0];
    assert_eq!(token, 1, "the first acquire gets fencing token 1");
    let owner = format!("node-{w}");
    assert_eq!(held_by.len(), N - 1);
    assert!(held_by.iter().all(|(o, e)| *o == owner && *e == T0 + 20_000), "losers see the winner: {held_by:?}");
    let f = s.get("race").await.unwrap().expect("the feed exists");
    assert_eq!(f.lease.lease_owner.as_deref(), Some(owner.as_str()));
    assert_eq!((f.lease.fencing_token, f.lease.lease_expires_at_ms), (1, T0 + 20_000));
}

async fn takeover_after_expiry_fences_the_old_owner<S: LeaseStore>(s: Arc<S>) {
    s.put(&def("tk")).await.unwrap();
    let t1 = s.acquire("tk", "n1", T0, 1_000).await.unwrap();
    s.renew("tk", "n1", t1, T0 + 500, 1_000, Some("41")).await.unwrap();
    // Renewed to T0 + 1,500: still held 1 ms before, free at it.
    assert!(matches!(s.acquire("tk", "n2", T0 + 1_499, 1_000).await, Err(LeaseError::Held { .. })));
    let t2 = s.acquire("tk", "n2", T0 + 1_500, 1_000).await.unwrap();
    assert_eq!(t2, t1 + 1, "every acquire increments the fencing token by one");

    let lost = |r: Result<(), LeaseError>| match r {
        Err(LeaseError::Lost { owner, fencing_token, expires_at_ms }) => (owner, fencing_token, expires_at_ms),
        other => panic!("the old owner must be refused, got {other:?}"),
    };
    let now = (Some("n2".to_owned()), t2, T0 + 2_500);
    assert_eq!(lost(s.renew("tk", "n1", t1, T0 + 1_600, 1_000, Some("50")).await), now);
    assert_eq!(lost(s.release("tk", "n1", t1, Some("50")).await), now);
    // The right owner with a stale token is refused too.
    assert_eq!(lost(s.renew("tk", "n2", t1, T0 + 1_600, 1_000, None).await), now);
    assert!(matches!(s.acquire("tk", "n1", T0 + 1_600, 1_000).await, Err(LeaseError::Held { .. })));

    let f = s.get("tk").await.unwrap().unwrap();
    assert_eq!(f.lease.last_seq.as_deref(), Some("41"), "refused calls wrote nothing");
    assert_eq!((f.lease.fencing_token, f.lease.lease_expires_at_ms), (t2, T0 + 2_500));
    s.renew("tk", "n2", t2, T0 + 2_000, 1_000, Some("60")).await.unwrap();
    // A holder whose lease ran out cannot renew, even with nobody else in.
    assert_eq!(lost(s.renew("tk", "n2", t2, T0 + 3_000, 1_000, None).await), (Some("n2".into()), t2, T0 + 3_000));
    assert_eq!(s.get("tk").await.unwrap().unwrap().lease.last_seq.as_deref(), Some("60"));
}

async fn release_frees_at_once_and_notifies<S: LeaseStore>(s: Arc<S>) {
    let mut rx = s.released().await.unwrap();
    s.put(&def("rel")).await.unwrap();
    s.put(&def("other")).await.unwrap();
    let t1 = s.acquire("rel", "n1", T0, 20_000).await.unwrap();
    s.release("rel", "n1", t1, Some("99")).await.unwrap();
    let got = tokio::time::timeout(WAIT, rx.recv()).await.expect("a release notification within 5 s");
    assert_eq!(got.as_deref(), Some("rel"));

    let f = s.get("rel").await.unwrap().unwrap();
    assert_eq!(f.lease.lease_expires_at_ms, 0, "a release expires the lease at once");
    assert_eq!(f.lease.last_seq.as_deref(), Some("99"));
    // 1 ms later, 19,999 ms before the old expiry, another node takes it.
    let t2 = s.acquire("rel", "n2", T0 + 1, 20_000).await.unwrap();
    assert_eq!(t2, t1 + 1);
    assert_eq!(s.get("rel").await.unwrap().unwrap().lease.last_seq.as_deref(), Some("99"), "last_seq survives");

    // A refused release (stale token) must not notify: the next notification is the valid
    // release of another feed, not "rel" (notifications arrive in the order they were sent).
    assert!(matches!(s.release("rel", "n1", t1, None).await, Err(LeaseError::Lost { .. })));
    let t = s.acquire("other", "n1", T0, 20_000).await.unwrap();
    s.release("other", "n1", t, None).await.unwrap();
    let got = tokio::time::timeout(WAIT, rx.recv()).await.expect("a release notification within 5 s");
    assert_eq!(got.as_deref(), Some("other"));
    assert_eq!(s.get("other").await.unwrap().unwrap().lease.last_seq, None, "no last_seq given, none stored");
}

async fn put_replacing_keeps_the_lease<S: LeaseStore>(s: Arc<S>) {
    assert!(s.put(&def("rp")).await.unwrap(), "the first put creates");
    let t = s.acquire("rp", "n1", T0, 20_000).await.unwrap();
    s.renew("rp", "n1", t, T0 + 5_000, 20_000, Some("1234")).await.unwrap();
    let mut d = def("rp");
    d.url = "ws://127.0.0.1:9/other".into();
    d.channel = "moved".into();
    d.desired_state = DesiredState::Stopped;
    d.subscribe.clear();
    d.resume_query.clear();
    d.seq_pointer = "/meta/id".into();
    assert!(!s.put(&d).await.unwrap(), "a second put replaces");
    let f = s.get("rp").await.unwrap().unwrap();
    assert_eq!(f.def, d, "the definition is replaced, optional fields cleared");
    assert_eq!(f.lease.lease_owner.as_deref(), Some("n1"));
    assert_eq!((f.lease.fencing_token, f.lease.lease_expires_at_ms), (t, T0 + 25_000));
    assert_eq!(f.lease.last_seq.as_deref(), Some("1234"));
    s.renew("rp", "n1", t, T0 + 6_000, 20_000, None).await.expect("the holder keeps its lease across a replace");

    let mut bad = def("rp");
    bad.url = "http://x/".into();
    match s.put(&bad).await {
        Err(LeaseError::Invalid(e)) => assert_eq!(e.field, "url"),
        other => panic!("a bad url must be refused naming the field: {other:?}"),
    }
    assert_eq!(s.get("rp").await.unwrap().unwrap().def, d, "a refused put writes nothing");
}

async fn many_feeds<S: LeaseStore>(s: Arc<S>) {
    const N: usize = 1_000;
    let ids: Vec<String> = (0..N).map(|i| format!("f{i:04}")).collect();
    for id in &ids {
        s.put(&def(id)).await.unwrap();
    }
    let t = s.acquire("f0007", "n1", T0, 20_000).await.unwrap();
    let mut ask = ids.clone();
    ask.insert(500, "missing".into());
    let got = s.get_many(&ask).await.unwrap();
    assert_eq!(got.len(), N + 1);
    for (id, f) in ask.iter().zip(&got) {
        match f {
            None => assert_eq!(id, "missing"),
            Some(f) => assert_eq!((&f.def.id, &f.def.channel), (id, &format!("feed.{id}"))),
        }
    }
    assert_eq!(got[7].as_ref().unwrap().lease.fencing_token, t);
    assert_eq!(s.list().await.unwrap().len(), N);
    assert!(s.delete("f0007").await.unwrap());
    assert!(!s.delete("f0007").await.unwrap(), "a second delete finds nothing");
    assert_eq!(s.get("f0007").await.unwrap(), None);
    assert_eq!(s.renew("f0007", "n1", t, T0 + 1, 20_000, None).await, Err(LeaseError::NotFound));
    let mut listed: Vec<String> = s.list().await.unwrap().into_iter().map(|f| f.def.id).collect();
    listed.sort();
    assert_eq!(listed.len(), N - 1);
    assert!(!listed.contains(&"f0007".to_owned()));
    assert!(s.get_many(&[]).await.unwrap().is_empty());
}

/// One `#[tokio::test]` per store for a behaviour body.
macro_rules! both_stores {
    ($body:ident, $memory:ident, $redis:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $memory() {
            $body(Arc::new(MemoryLeaseStore::new())).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $redis() {
            let r = RedisProc::start();
            $body(Arc::new(redis_store(&r).await)).await;
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_one_acquirer_wins() {
    let s = Arc::new(MemoryLeaseStore::new());
    one_of_many_concurrent_acquirers_wins(vec![s; RACERS]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_one_acquirer_wins() {
    let r = RedisProc::start();
    let mut nodes = Vec::new();
    for _ in 0..RACERS {
        nodes.push(Arc::new(redis_store(&r).await));
    }
    one_of_many_concurrent_acquirers_wins(nodes).await;
}

both_stores!(takeover_after_expiry_fences_the_old_owner, memory_takeover_fences, redis_takeover_fences);
both_stores!(release_frees_at_once_and_notifies, memory_release_notifies, redis_release_notifies);
both_stores!(put_replacing_keeps_the_lease, memory_put_keeps_lease, redis_put_keeps_lease);
both_stores!(many_feeds, memory_many_feeds, redis_many_feeds);

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
async fn redis_layout_is_readable_and_survives_a_script_flush() {
    let r = RedisProc::start();
    let s = redis_store(&r).await;
    s.put(&def("btc")).await.unwrap();
    let t = s.acquire("btc", "node-a", T0, 20_000).await.unwrap();
    s.renew("btc", "node-a", t, T0 + 1, 20_000, Some("77")).await.unwrap();
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
    assert_eq!(s.acquire("btc", "node-b", T0 + 20_001, 20_000).await, Ok(2));
    assert_eq!(hget("lease_owner"), "node-b");
    // A time the Lua scripts could not add exactly is refused before it reaches Redis.
    match s.acquire("btc", "node-c", u64::MAX - 1, 20_000).await {
        Err(LeaseError::Invalid(e)) => assert_eq!(e.field, "now_ms"),
        other => panic!("{other:?}"),
    }
}
