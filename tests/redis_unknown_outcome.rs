//! "Unavailable" means "not stored"; when tether cannot know, it says "unknown" (issue 26,
//! item 2; docs/redis.md, "Failures and what each answer means"). One real `tether serve`
//! with the Redis broker on one real `redis-server` (a Unix socket in a temp dir, started and
//! killed by PID), `request_timeout_ms = 500`:
//! - Redis asleep (`DEBUG SLEEP 3`) while publishes are out: every HTTP publish (with and
//!   without `Idempotency-Key`) and every WebSocket `pub` (tokio-tungstenite) is answered
//!   within `request_timeout_ms` + 1 s, by a 504 `{"error":…,"outcome":"unknown"}` naming
//!   the Idempotency-Key / an `error` `unknown_outcome` with `id`, `ch` and `retry_after_ms`,
//!   or by a 503 / `unavailable`; when Redis wakes, the scripts it runs late store nothing,
//!   no 503 publish is in the history, and after the retries the answers asked for, each
//!   publish is in the history exactly once — the one without a key too;
//! - Redis busy a little longer than the timeout: 503, and not stored; busy for less: 200;
//! - Redis killed while a publish is out: 504 at once; after a restart the retry stores it once;
//! - Redis down (refused): 503, and nothing of it in the history after Redis is back;
//! - the command link killed while idle, a publish right after: 503 (noticed at once), or
//!   504 when it raced the connection's end; a 503 is not stored.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::redis::{redis_config, RedisProc};
use common::*;
use serde_json::{json, Value};

const TIMEOUT_MS: u64 = 500;
/// The latest any publish may be answered: `request_timeout_ms` + 1 s.
const ANSWER_LIMIT: Duration = Duration::from_millis(TIMEOUT_MS + 1000);

/// Starts one node on `redis` with `request_timeout_ms = 500` and waits until it is ready.
async fn node(redis: &RedisProc) -> Server {
    let s =
        Server::start(&redis_config(&redis.url(), &format!("request_timeout_ms = {TIMEOUT_MS}")), &["--cores", "2"]);
    wait_ready(s.addr, STEP).await;
    s
}

/// One answer and how long it took.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: Value,
    took: Duration,
}

/// `POST /publish/{ch}` of `{"t":tag}` on a fresh connection, with `Idempotency-Key: tag`
/// when `keyed`.
async fn publish(addr: SocketAddr, ch: &str, tag: &str, keyed: bool) -> Answer {
    let headers: Vec<(&str, &str)> = if keyed { vec![("Idempotency-Key", tag)] } else { vec![] };
    let t0 = Instant::now();
    let body = json!({ "t": tag }).to_string();
    let (status, head, body) =
        tokio::time::timeout(STEP, http_request(addr, "POST", &format!("/publish/{ch}"), &headers, body.as_bytes()))
            .await
            .unwrap_or_else(|_| panic!("publish {tag}: no answer within {STEP:?}"));
    let body = serde_json::from_slice(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body)));
    Answer { status, head, body, took: t0.elapsed() }
}

/// Checks a 503 or 504 answer's shape (and that it came in time).
fn check_refusal(tag: &str, a: &Answer) {
    assert!(a.took <= ANSWER_LIMIT, "publish {tag} answered after {:?}: {a:?}", a.took);
    match a.status {
        504 => {
            assert_eq!(a.body["outcome"], "unknown", "{tag}: {a:?}");
            let e = a.body["error"].as_str().unwrap_or_default();
            assert!(e.contains("Idempotency-Key"), "{tag}: a 504 says to retry with the same key: {e}");
            assert_eq!(header(&a.head, "retry-after"), Some("1"), "{tag}: {a:?}");
        }
        503 => assert_eq!(header(&a.head, "retry-after"), Some("1"), "{tag}: {a:?}"),
        _ => panic!("publish {tag} while redis cannot answer: {a:?}"),
    }
}

/// Retries `tag` (same key when `keyed`) until it is stored; returns its seq.
async fn retry_until_stored(addr: SocketAddr, ch: &str, tag: &str, keyed: bool) -> u64 {
    let end = Instant::now() + STEP;
    loop {
        let a = publish(addr, ch, tag, keyed).await;
        if a.status == 200 {
            return a.body["seq"].as_u64().expect("seq");
        }
        check_refusal(tag, &a);
        assert!(Instant::now() < end, "publish {tag} not stored within {STEP:?} of retries: {a:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many entries of `ch`'s history carry `"t":tag`, read from Redis itself.
fn stored(redis: &RedisProc, ch: &str, tag: &str) -> usize {
    let out = redis.cli(&["XRANGE", &format!("tether:{{{ch}}}:s"), "-", "+"]);
    let needle = format!("\"t\":\"{tag}\"");
    out.lines().filter(|l| l.contains(&needle)).count()
}

/// A WS `pub` of `{"t":id}` with `id`; the answer naming `id` and how long it took.
async fn ws_pub(ws: &mut tung::Ws, ch: &str, id: &str) -> (Value, Duration) {
    let t0 = Instant::now();
    tung::send(ws, json!({"op": "pub", "ch": ch, "id": id, "data": {"t": id}})).await;
    let end = t0 + STEP;
    loop {
        match tung::read_within(ws, end.saturating_duration_since(Instant::now())).await {
            tung::Read::Json(v) if v["id"] == id => return (v, t0.elapsed()),
            tung::Read::Json(_) => {}
            tung::Read::Close(code, reason) => panic!("pub {id}: closed with {code} {reason}"),
        }
    }
}

/// A Redis (with an AOF when `appendonly`), a node on it, and `before` stored in `ch`.
async fn start(appendonly: bool, ch: &str) -> (RedisProc, Server) {
    let redis = RedisProc::start_with(appendonly);
    let srv = node(&redis).await;
    assert_eq!(publish(srv.addr, ch, "before", true).await.status, 200);
    (redis, srv)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_asleep_longer_than_the_timeout() {
    let _serial = serial().await;
    let ch = "sleepy";
    let (redis, srv) = start(false, ch).await;
    let mut ws = tung::connect(&srv.ws_url()).await;

    let sleeper = redis.debug_sleep(3.0);
    let slept = Instant::now();
    // Sent together, so that each goes out before the first timeout takes the link down.
    let (keyed, unkeyed, (w, w_took)) = tokio::join!(
        publish(srv.addr, ch, "keyed", true),
        publish(srv.addr, ch, "unkeyed", false),
        ws_pub(&mut ws, ch, "ws-1"),
    );
    // And one after the link is down.
    let later = publish(srv.addr, ch, "later", true).await;
    for (tag, a) in [("keyed", &keyed), ("unkeyed", &unkeyed), ("later", &later)] {
        eprintln!("redis asleep 3 s: HTTP publish {tag}: {} after {:?}: {}", a.status, a.took, a.body);
        check_refusal(tag, a);
    }
    eprintln!("redis asleep 3 s: WS pub ws-1: {w} after {w_took:?}");
    assert!(w_took <= ANSWER_LIMIT, "pub ws-1 answered after {w_took:?}");
    assert_eq!(w["op"], "error", "{w}");
    assert!(w["code"] == "unknown_outcome" || w["code"] == "unavailable", "{w}");
    assert_eq!((w["ch"].as_str(), w["retry_after_ms"].as_u64()), (Some(ch), Some(1000)), "{w}");
    assert!(
        [&keyed, &unkeyed].iter().any(|a| a.status == 504) || w["code"] == "unknown_outcome",
        "publishes sent while redis slept: some answer must be unknown, not refused (503 = not stored)"
    );
    assert!(slept.elapsed() < Duration::from_millis(2500), "the answers came before redis woke");

    tokio::task::spawn_blocking(move || sleeper.join().expect("DEBUG SLEEP")).await.unwrap();
    wait_ready(srv.addr, STEP).await;
    // Redis ran every queued script when it woke, past its deadline: none stored anything.
    for tag in ["keyed", "unkeyed", "later", "ws-1"] {
        assert_eq!(stored(&redis, ch, tag), 0, "{tag} was stored by a script Redis ran after its deadline");
    }
    let metrics = srv.metrics().await;
    let unknown = metrics.sum("tether_broker_unknown_outcomes_total", &[]);
    assert!(unknown >= 1.0, "tether_broker_unknown_outcomes_total {unknown}");

    // The retries the answers asked for (the same key, the same id; the unkeyed one without).
    retry_until_stored(srv.addr, ch, "keyed", true).await;
    retry_until_stored(srv.addr, ch, "unkeyed", false).await;
    retry_until_stored(srv.addr, ch, "later", true).await;
    let end = Instant::now() + STEP;
    loop {
        let (v, _) = ws_pub(&mut ws, ch, "ws-1").await;
        if v["op"] == "ack" {
            break;
        }
        assert!(Instant::now() < end, "pub ws-1 not acked after retries: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for tag in ["before", "keyed", "unkeyed", "later", "ws-1"] {
        assert_eq!(stored(&redis, ch, tag), 1, "{tag}: one publish, one entry");
    }
    // Seqs 1..5 with no gap: no seq was handed out to a publish that was not stored.
    let head = publish(srv.addr, ch, "after", true).await;
    assert_eq!(head.body["seq"], 6, "{head:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_busy_a_little_over_the_timeout_is_not_stored() {
    let _serial = serial().await;
    let ch = "busy";
    let (redis, srv) = start(false, ch).await;

    // Busy 0.9 s: the script runs at ~0.9 s, past its 0.5 s deadline, and answers `LATE`
    // before the 1.0 s wait ends: certainly not stored.
    let sleeper = redis.debug_sleep(0.9);
    let a = publish(srv.addr, ch, "over", true).await;
    eprintln!("redis busy 0.9 s: {} after {:?}: {}", a.status, a.took, a.body);
    tokio::task::spawn_blocking(move || sleeper.join().expect("DEBUG SLEEP")).await.unwrap();
    check_refusal("over", &a);
    if a.status == 503 {
        assert_eq!(stored(&redis, ch, "over"), 0, "a 503 publish was stored: {a:?}");
    }
    let late = srv.metrics().await.sum("tether_broker_late_calls_total", &[]);
    eprintln!("tether_broker_late_calls_total {late}");
    wait_ready(srv.addr, STEP).await;
    retry_until_stored(srv.addr, ch, "over", true).await;
    assert_eq!(stored(&redis, ch, "over"), 1);

    // Busy 0.3 s: within the timeout, stored.
    let sleeper = redis.debug_sleep(0.3);
    let a = publish(srv.addr, ch, "under", false).await;
    eprintln!("redis busy 0.3 s: {} after {:?}: {}", a.status, a.took, a.body);
    tokio::task::spawn_blocking(move || sleeper.join().expect("DEBUG SLEEP")).await.unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(stored(&redis, ch, "under"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_request_is_unknown() {
    let _serial = serial().await;
    let ch = "killed";
    let (mut redis, srv) = start(true, ch).await;
    let mut ws = tung::connect(&srv.ws_url()).await;

    // Asleep, so that the publishes are certainly out when Redis dies.
    let sleeper = redis.debug_sleep(3.0);
    let (http, ws_answer) = tokio::join!(publish(srv.addr, ch, "mid", true), async {
        let a = ws_pub(&mut ws, ch, "ws-mid");
        tokio::pin!(a);
        // Kill Redis 100 ms into the sleep, while both are out.
        tokio::select! {
            r = &mut a => panic!("pub answered before redis was killed: {r:?}"),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        tokio::task::block_in_place(|| redis.kill9());
        a.await
    });
    sleeper.join().expect("DEBUG SLEEP");
    eprintln!("redis killed mid-request: HTTP {} after {:?}: {}", http.status, http.took, http.body);
    eprintln!("redis killed mid-request: WS {} after {:?}", ws_answer.0, ws_answer.1);
    check_refusal("mid", &http);
    assert_eq!(http.status, 504, "sent, and the connection died: unknown ({http:?})");
    assert_eq!(ws_answer.0["code"], "unknown_outcome", "{}", ws_answer.0);
    assert!(ws_answer.1 <= ANSWER_LIMIT);

    tokio::task::block_in_place(|| redis.restart());
    wait_ready(srv.addr, STEP).await;
    retry_until_stored(srv.addr, ch, "mid", true).await;
    assert_eq!(stored(&redis, ch, "mid"), 1);
    assert_eq!(stored(&redis, ch, "before"), 1, "the AOF kept the acked publish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_is_unavailable_and_not_stored() {
    let _serial = serial().await;
    let ch = "down";
    let (mut redis, srv) = start(true, ch).await;
    redis.kill9();
    // Once the node saw it (its health check, within about a second: `tether_broker_up` 0),
    // it refuses publishes unsent. (Before, a publish may meet the dead connection: 504.)
    let t0 = Instant::now();
    srv.wait_metric("tether_broker_up", &[], STEP, |v| v == 0.0).await;
    eprintln!("redis killed: tether_broker_up 0 after {:?}", t0.elapsed());
    let mut ws = tung::connect(&srv.ws_url()).await;
    for tag in ["refused-1", "refused-2"] {
        let a = publish(srv.addr, ch, tag, tag.ends_with('1')).await;
        eprintln!("redis down: {} after {:?}: {}", a.status, a.took, a.body);
        assert_eq!(a.status, 503, "{a:?}");
        check_refusal(tag, &a);
    }
    let (w, took) = ws_pub(&mut ws, ch, "ws-refused").await;
    eprintln!("redis down: WS {w} after {took:?}");
    assert_eq!((w["code"].as_str(), w["ch"].as_str()), (Some("unavailable"), Some(ch)), "{w}");
    tokio::task::block_in_place(|| redis.restart());
    wait_ready(srv.addr, STEP).await;
    for tag in ["refused-1", "refused-2", "ws-refused"] {
        assert_eq!(stored(&redis, ch, tag), 0, "{tag} was answered 503 / unavailable, yet stored");
    }
    assert_eq!(stored(&redis, ch, "before"), 1);
}

/// The command link killed while idle, by Redis (`CLIENT KILL TYPE normal`) and with Redis
/// (`SIGKILL`), and a publish sent at once: the node notices the connection's end at once
/// (its disconnection push), so the publish is usually refused unsent (503: then it must
/// not be stored); one that races the connection's end (within a millisecond or so) meets
/// the dying connection and can only be answered 504. The retry stores it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_link_killed_then_a_publish() {
    let _serial = serial().await;
    let ch = "idle";
    let (mut redis, srv) = start(true, ch).await;
    redis.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    let a = publish(srv.addr, ch, "after-client-kill", true).await;
    eprintln!("command link killed idle (CLIENT KILL): {} after {:?}: {}", a.status, a.took, a.body);
    check_refusal("after-client-kill", &a);
    if a.status == 503 {
        assert_eq!(stored(&redis, ch, "after-client-kill"), 0, "{a:?}");
    }
    wait_ready(srv.addr, STEP).await;
    retry_until_stored(srv.addr, ch, "after-client-kill", true).await;
    assert_eq!(stored(&redis, ch, "after-client-kill"), 1);

    redis.kill9();
    let a = publish(srv.addr, ch, "after-kill9", true).await;
    eprintln!("redis killed with the link idle (SIGKILL): {} after {:?}: {}", a.status, a.took, a.body);
    check_refusal("after-kill9", &a);
    tokio::task::block_in_place(|| redis.restart());
    if a.status == 503 {
        assert_eq!(stored(&redis, ch, "after-kill9"), 0, "{a:?}");
    }
    wait_ready(srv.addr, STEP).await;
    retry_until_stored(srv.addr, ch, "after-kill9", true).await;
    assert_eq!(stored(&redis, ch, "after-kill9"), 1);
}
