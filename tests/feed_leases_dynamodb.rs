//! The DynamoDB lease store (docs/feeds.md, "The DynamoDB store"; cargo feature `dynamodb`)
//! against a real DynamoDB-compatible server: moto's server mode, one per test, on a free port
//! of 127.0.0.1, killed by PID on drop (`tests/common/moto.rs`). First the shared contract of
//! `tests/lease_contract` (as for memory and Redis in `tests/feed_leases.rs`; racers are 32
//! separate SDK clients), then what only DynamoDB has:
//! - `ensure_table` creates the table once, and refuses a table whose key is not `id`;
//! - the item layout, read back with a plain `GetItem` (numbers N, `last_seq` S);
//! - the reconcile read: `get_many` of 1,000 feeds is 10 `BatchGetItem` requests (timed);
//! - the batched renew: `renew_many` of 1,000 leases is 10 `TransactWriteItems` (timed), and a
//!   taken-over lease costs one more;
//! - `list` follows `Scan` pages past DynamoDB's 1 MB page;
//! - failures are short `Store` errors within the call bound: a dead endpoint, an endpoint
//!   that never answers, a missing table;
//! - with the Redis broker (`with_redis_releases`), a release is announced on the Redis store's
//!   topic and reaches every node's `released()` (without it, only this process's), and a
//!   release is still written when that Redis is down.

mod common;
#[macro_use]
mod lease_contract;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use common::moto::MotoProc;
use common::redis::RedisProc;
use lease_contract::{def, RACERS, T0, WAIT};
use tether::config::{Broker, BrokerKind};
use tether::feeds::dynamodb::DynamoCalls;
use tether::feeds::metrics::StoreOp;
use tether::feeds::releases::RedisReleases;
use tether::feeds::{
    AnyStore, DynamoConfig, DynamoCredentials, DynamoLeaseStore, LeaseError, LeaseStore, LeaseTerm, RedisLeaseStore,
    Renewal,
};
use tokio::sync::mpsc::UnboundedReceiver;

const TABLE: &str = "tether_feeds";

/// A config for `endpoint`: moto accepts any keys; no AWS chain, so nothing leaves the box.
/// Calls are bounded by 10 s, not the default 2 s: moto is one Python process answering one
/// request at a time (about 200 ms for a `BatchGetItem` of 100 keys here), on a 2-core box
/// shared with the other tests, so the 8th request of a `get_many` in flight can wait 2 s.
fn config(endpoint: String) -> DynamoConfig {
    DynamoConfig {
        endpoint: Some(endpoint),
        credentials: DynamoCredentials::Static { access_key_id: "test".into(), secret_access_key: "test".into() },
        call_timeout_ms: 10_000,
        ..DynamoConfig::new(TABLE)
    }
}

async fn connect(m: &MotoProc) -> DynamoLeaseStore {
    DynamoLeaseStore::connect(&config(m.endpoint())).await.expect("connect the lease store to moto")
}

async fn dynamo_start() -> (MotoProc, Arc<DynamoLeaseStore>) {
    let m = MotoProc::start();
    let s = connect(&m).await;
    assert!(s.ensure_table().await.expect("create the table"), "a fresh moto has no table");
    (m, Arc::new(s))
}

/// The contract runs through the front door ([`AnyStore`]), as the runtime calls a store.
async fn contract_start() -> (MotoProc, Arc<AnyStore>) {
    let (m, s) = dynamo_start().await;
    let s = Arc::into_inner(s).expect("the only handle");
    (m, Arc::new(AnyStore::from(s)))
}

/// One SDK client (its own connection pool) per racer, as separate nodes would have.
async fn dynamo_racers(m: &MotoProc, _: &Arc<AnyStore>) -> Vec<Arc<AnyStore>> {
    let mut nodes = Vec::with_capacity(RACERS);
    for _ in 0..RACERS {
        nodes.push(Arc::new(AnyStore::from(connect(m).await)));
    }
    nodes
}

lease_contract_tests!(dynamodb, contract_start, dynamo_racers);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_table_creates_once_and_checks_the_key() {
    let (m, s) = dynamo_start().await;
    assert!(!s.ensure_table().await.unwrap(), "the second call finds the table");
    assert!(!connect(&m).await.ensure_table().await.unwrap(), "so does another node");

    // A table of the same name with another key is not taken for a feeds table.
    let other =
        DynamoLeaseStore::connect(&DynamoConfig { table: "not_feeds".into(), ..config(m.endpoint()) }).await.unwrap();
    other
        .sdk_client()
        .create_table()
        .table_name("not_feeds")
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(KeySchemaElement::builder().attribute_name("pk").key_type(KeyType::Hash).build().unwrap())
        .attribute_definitions(
            AttributeDefinition::builder().attribute_name("pk").attribute_type(ScalarAttributeType::S).build().unwrap(),
        )
        .send()
        .await
        .expect("create a table with another key");
    match other.ensure_table().await {
        Err(LeaseError::Store(m)) => assert!(m.contains("not_feeds") && m.contains("`id` (S)"), "{m}"),
        r => panic!("a table keyed on pk must be refused: {r:?}"),
    }
    let calls = other.calls();
    assert_eq!((calls.describe_table, calls.create_table), (1, 0), "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_layout_is_one_item_per_feed() {
    let (_m, s) = dynamo_start().await;
    s.put(&def("btc")).await.unwrap();
    let t = s.acquire("btc", LeaseTerm { owner: "node-a", now_ms: T0, lease_ms: 20_000 }).await.unwrap();
    s.renew(
        LeaseTerm { owner: "node-a", now_ms: T0 + 1, lease_ms: 20_000 },
        Renewal { id: "btc", token: t, last_seq: Some("77") },
    )
    .await
    .unwrap();
    // An independent reader (a plain GetItem) sees the documented attributes and types.
    let out = s
        .sdk_client()
        .get_item()
        .table_name(TABLE)
        .key("id", AttributeValue::S("btc".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let item = out.item().expect("the item exists");
    let attr = |k: &str| item.get(k).unwrap_or_else(|| panic!("no {k} in {item:?}")).clone();
    assert_eq!(attr("lease_owner"), AttributeValue::S("node-a".into()));
    assert_eq!(attr("fencing_token"), AttributeValue::N("1".into()));
    assert_eq!(attr("lease_expires_at_ms"), AttributeValue::N((T0 + 20_001).to_string()));
    assert_eq!(attr("last_seq"), AttributeValue::S("77".into()));
    assert_eq!(attr("url"), AttributeValue::S("wss://upstream.example/btc".into()));
    assert_eq!(attr("desired_state"), AttributeValue::S("STARTED".into()));
    assert_eq!(item.len(), 11, "id, 6 definition and 4 lease attributes: {item:?}");
    // A new feed has no owner and no last_seq attribute, and token 0.
    s.put(&def("eth")).await.unwrap();
    let f = s.get("eth").await.unwrap().unwrap();
    assert_eq!((f.lease.lease_owner, f.lease.fencing_token, f.lease.last_seq), (None, 0, None));
}

/// The reconcile's read at 1,000 feeds: how many requests and how long, on moto (one Python
/// process answering one request at a time, so the time is moto's more than DynamoDB's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_many_of_1000_feeds_is_10_batch_requests() {
    let (_m, s) = dynamo_start().await;
    let ids: Vec<String> = (0..1_000).map(|i| format!("g{i:04}")).collect();
    for id in &ids {
        s.put(&def(id)).await.unwrap();
    }
    let mut times = Vec::new();
    for _ in 0..3 {
        let before = s.calls();
        let t = Instant::now();
        let got = s.get_many(&ids).await.unwrap();
        times.push(t.elapsed());
        assert_eq!(got.iter().flatten().count(), 1_000);
        let after = s.calls();
        let ten_batches = DynamoCalls { batch_get_item: before.batch_get_item + 10, ..before };
        assert_eq!(after, ten_batches, "1,000 ids are 10 BatchGetItem requests of 100 keys, and nothing else");
    }
    eprintln!("get_many(1000) on moto: 10 BatchGetItem requests each, times {times:?}");
}

/// The batched renew: 1,000 leases are 10 `TransactWriteItems` of 100 `Update`s (and nothing
/// else); one feed taken over cancels its transaction, which costs one more request for the
/// other 99 (its refusal comes with the item, so no `GetItem`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_of_1000_leases_is_10_transactions() {
    let (_m, s) = dynamo_start().await;
    let ids: Vec<String> = (0..1_000).map(|i| format!("r{i:04}")).collect();
    let mut tokens = Vec::new();
    for id in &ids {
        s.put(&def(id)).await.unwrap();
        tokens.push(s.acquire(id, LeaseTerm { owner: "n1", now_ms: T0, lease_ms: 20_000 }).await.unwrap());
    }
    let leases: Vec<Renewal<'_>> =
        ids.iter().zip(&tokens).map(|(id, t)| Renewal { id, token: *t, last_seq: Some("9") }).collect();
    let (before, t) = (s.calls(), Instant::now());
    let got = s.renew_many(LeaseTerm { owner: "n1", now_ms: T0 + 5_000, lease_ms: 20_000 }, &leases).await.unwrap();
    let took = t.elapsed();
    assert!(got.iter().all(Result::is_ok), "every lease renewed: {:?}", got.iter().find(|r| r.is_err()));
    let ten = DynamoCalls { transact_write_items: before.transact_write_items + 10, ..before };
    assert_eq!(s.calls(), ten, "1,000 leases are 10 TransactWriteItems requests, and nothing else");
    assert_eq!(s.requests().get(StoreOp::RenewMany), 10);

    // r0150 is taken over: its transaction is cancelled, and its 99 others go again.
    s.release("r0150", "n1", tokens[150], None).await.unwrap();
    let t2 = s.acquire("r0150", LeaseTerm { owner: "n2", now_ms: T0 + 5_001, lease_ms: 20_000 }).await.unwrap();
    let before = s.calls();
    let got = s.renew_many(LeaseTerm { owner: "n1", now_ms: T0 + 6_000, lease_ms: 20_000 }, &leases).await.unwrap();
    let lost = LeaseError::Lost { owner: Some("n2".into()), fencing_token: t2, expires_at_ms: T0 + 25_001 };
    assert_eq!(got[150], Err(lost));
    assert_eq!(got.iter().filter(|r| r.is_ok()).count(), 999);
    let eleven = DynamoCalls { transact_write_items: before.transact_write_items + 11, ..before };
    assert_eq!(s.calls(), eleven, "one cancelled transaction costs one retry");
    let f = s.get("r0151").await.unwrap().unwrap();
    assert_eq!(f.lease.lease_expires_at_ms, T0 + 26_000, "a neighbour in the cancelled transaction is renewed");
    eprintln!("renew_many(1000) on moto: 10 TransactWriteItems requests in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_follows_scan_pages() {
    let (_m, s) = dynamo_start().await;
    // 200 feeds of about 16 KB (url and subscribe near their 8 KiB limit) are about 3.2 MB:
    // more than three of DynamoDB's 1 MB Scan pages.
    const N: usize = 200;
    for i in 0..N {
        let mut d = def(&format!("big{i:03}"));
        d.url = format!("wss://upstream.example/{}", "u".repeat(8_000));
        d.subscribe = "s".repeat(8_000);
        s.put(&d).await.unwrap();
    }
    let before = s.calls().scan;
    let feeds = s.list().await.unwrap();
    let pages = s.calls().scan - before;
    assert_eq!(feeds.len(), N);
    assert!(pages >= 4, "3.2 MB must take at least 4 Scan pages, took {pages}");
    let mut ids: Vec<String> = feeds.into_iter().map(|f| f.def.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), N, "no feed twice across pages");
}

fn store_err<T: std::fmt::Debug>(r: Result<T, LeaseError>) -> String {
    match r {
        Err(LeaseError::Store(m)) => m,
        other => panic!("expected a Store error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_short_store_errors_within_the_bound() {
    // Nothing listens: connection refused, said in one short line.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dead = DynamoLeaseStore::connect(&config(format!("http://127.0.0.1:{port}"))).await.unwrap();
    let m = store_err(dead.get("a").await);
    assert!(m.starts_with("DynamoDB GetItem: cannot reach DynamoDB: ") && m.contains("refused"), "{m}");
    assert!(m.len() < 250, "{m}");

    // Accepts connections and never answers: the call ends at its bound, 300 ms.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = DynamoConfig { call_timeout_ms: 300, ..config(format!("http://{}", mute.local_addr().unwrap())) };
    let slow = DynamoLeaseStore::connect(&cfg).await.unwrap();
    let t = Instant::now();
    let m = store_err(slow.acquire("a", LeaseTerm { owner: "n", now_ms: T0, lease_ms: 1_000 }).await);
    let took = t.elapsed();
    assert_eq!(m, "DynamoDB UpdateItem: no answer within 300 ms");
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(2), "took {took:?}");
    drop(mute);

    // A missing table: the service's code and message.
    let m = MotoProc::start();
    let s = connect(&m).await;
    let msg = store_err(s.put(&def("a")).await);
    assert!(msg.starts_with("DynamoDB UpdateItem: ResourceNotFoundException"), "{msg}");

    // A bad field is refused before anything is sent, naming it.
    let bad = DynamoConfig { table: "x".into(), ..config(m.endpoint()) };
    match DynamoLeaseStore::connect(&bad).await {
        Err(LeaseError::Invalid(e)) => assert_eq!(e.field, "dynamodb_table"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a 1-byte table name must be refused"),
    }
}

/// The next release announced to `rx`, waited for at most [`WAIT`].
async fn next_release(rx: &mut UnboundedReceiver<String>, who: &str) -> String {
    let got = tokio::time::timeout(WAIT, rx.recv()).await;
    got.unwrap_or_else(|_| panic!("{who}: no release notification within {WAIT:?}")).expect("subscription ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_reach_every_node_through_redis() {
    let (m, _) = dynamo_start().await;
    let redis = RedisProc::start();
    let broker = Broker { kind: BrokerKind::Redis, url: redis.url(), key_prefix: "rel:".into(), ..Broker::default() };
    // The Redis store's topic: both stores may share one broker.
    let redis_store = RedisLeaseStore::connect(&broker).await.expect("connect the Redis store");
    assert_eq!(RedisReleases::new(&broker).topic(), redis_store.released_topic());
    assert_eq!(redis_store.released_topic(), "rel:feeds:released");

    // Two nodes on the Redis broker, one without (the memory broker: one node).
    let a = connect(&m).await.with_redis_releases(RedisReleases::new(&broker));
    let b = connect(&m).await.with_redis_releases(RedisReleases::new(&broker));
    let alone = connect(&m).await;
    let (mut on_a, mut on_b) = (a.released().await.unwrap(), b.released().await.unwrap());
    let mut on_redis_store = redis_store.released().await.unwrap();
    let mut on_alone = alone.released().await.unwrap();
    for id in ["x", "y", "z"] {
        a.put(&def(id)).await.unwrap();
    }

    let t = a.acquire("x", LeaseTerm { owner: "node-a", now_ms: T0, lease_ms: 20_000 }).await.unwrap();
    a.release("x", "node-a", t, Some("7")).await.unwrap();
    assert_eq!(next_release(&mut on_b, "the other node").await, "x");
    assert_eq!(next_release(&mut on_a, "the releasing node").await, "x");
    assert_eq!(next_release(&mut on_redis_store, "a Redis store subscriber").await, "x");

    // Without Redis the release stays in the process: `alone` hears its own, nobody else does.
    let t = alone.acquire("z", LeaseTerm { owner: "node-c", now_ms: T0, lease_ms: 20_000 }).await.unwrap();
    alone.release("z", "node-c", t, None).await.unwrap();
    assert_eq!(next_release(&mut on_alone, "the node without Redis").await, "z");
    // A refused release announces nothing either.
    let t = b.acquire("y", LeaseTerm { owner: "node-b", now_ms: T0, lease_ms: 20_000 }).await.unwrap();
    assert!(matches!(b.release("y", "node-z", t, None).await, Err(LeaseError::Lost { .. })));
    b.release("y", "node-b", t, None).await.unwrap();
    assert_eq!(next_release(&mut on_a, "the other node").await, "y", "z stayed local, the refused y went nowhere");
    assert_eq!(next_release(&mut on_b, "the releasing node").await, "y");
    assert!(on_alone.try_recv().is_err(), "the node without Redis heard another node's release");
    let f = b.get("y").await.unwrap().unwrap();
    assert_eq!(f.lease.lease_expires_at_ms, 0, "released in the table");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_written_when_redis_is_down() {
    let (m, _) = dynamo_start().await;
    let dead = Broker {
        kind: BrokerKind::Redis,
        url: "unix:///nonexistent/tether-feeds-test.sock".into(),
        request_timeout_ms: 500,
        ..Broker::default()
    };
    let err = RedisReleases::new(&dead).publish("x").await.expect_err("no Redis there");
    assert!(matches!(err, LeaseError::Store(_)), "{err:?}");

    let s = connect(&m).await.with_redis_releases(RedisReleases::new(&dead));
    s.put(&def("x")).await.unwrap();
    let t = s.acquire("x", LeaseTerm { owner: "n1", now_ms: T0, lease_ms: 20_000 }).await.unwrap();
    let start = Instant::now();
    s.release("x", "n1", t, Some("5")).await.expect("the release itself does not need Redis");
    assert!(start.elapsed() < Duration::from_secs(3), "release took {:?}", start.elapsed());
    let f = s.get("x").await.unwrap().unwrap();
    assert_eq!((f.lease.lease_expires_at_ms, f.lease.last_seq.as_deref()), (0, Some("5")));
    assert!(s.released().await.is_err(), "no subscription without Redis");
}
