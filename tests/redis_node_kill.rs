//! `kill -9` of a node under load (issue 9; DESIGN §6, docs/redis.md "a node dies"): two
//! tether nodes, A and B, share one real `redis-server`. 2,000 `tether::client` subscribers,
//! each given the URLs `[A, B]`, land on A, 500 on each of 4 channels; 8 more subscribers,
//! driven by tokio-tungstenite (an independent client), are on A too. A publisher per channel
//! on B (HTTP `POST /publish` with an `Idempotency-Key`, retried until acked) publishes 50
//! messages/s before, during and after the kill. Once every subscriber is receiving, A is
//! SIGKILLed: no close frame, no drain.
//!
//! Within 10 s of the kill every subscriber must be on B, resumed (`recovered: true` under the
//! same epoch, no `reset`) and receiving what is published after the kill; and each must have
//! seen every acked seq of its channel exactly once, in order, from 1 to the last one acked,
//! with the data of its ack. The tether clients are held to that at the application (what
//! `next_event` returns); the tungstenite ones, which resume by hand with `from`/`epoch` on B,
//! on the wire. The test prints the time to recovery over all subscribers.

mod common;
mod nodes;

use std::future::ready;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::{redis_config, RedisProc};
use common::traffic::{http_publisher_at, Tally, Tasks, PUBLISH_LIMIT};
use common::*;
use nodes::{wait_ready_status, Conn};
use serde_json::Value;
use tether::client::{Client, ClientConfig, Event, Stats};
use tokio::sync::watch;

const CHANNELS: usize = 4;
/// `tether::client` subscribers; subscriber `i` is on channel `i % CHANNELS`.
const CLIENTS: usize = 2_000;
/// tokio-tungstenite subscribers on each channel, after the clients.
const TUNG_PER_CHANNEL: usize = 2;
/// Publishes per second on each channel.
const RATE: u64 = 50;
/// The contract: every subscriber back on B and resumed within this of the kill.
const RECOVERY_LIMIT: Duration = Duration::from_secs(10);
/// Publishing goes on this long after every subscriber is back.
const AFTER: Duration = Duration::from_secs(2);

fn chan(k: usize) -> String {
    format!("nodekill.{k}")
}

/// The publish index `i` of message data `{"t": "h{k}-{i}"}` from channel `k`'s publisher
/// (`http_publisher_at`), whose tags start with `prefix`, `h{k}-`.
fn publish_index(tag: Option<&str>, prefix: &str) -> u64 {
    tag.and_then(|t| t.strip_prefix(prefix))
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("tag {tag:?} is not from the publisher of tags {prefix}…"))
}

/// What the subscriber tasks report while they run.
struct Board {
    /// The last seq each subscriber processed (clients first, then the tungstenite ones).
    reached: Vec<AtomicU64>,
    /// Subscribers whose first `subscribed` arrived.
    subscribed: AtomicUsize,
}

/// One received message: seq, publish index, arrival.
type Got = (u64, u64, Instant);

/// What a `tether::client` subscriber's application saw.
#[derive(Default)]
struct ClientLog {
    msgs: Vec<Got>,
    /// Each `subscribed`: arrival, head, epoch, `recovered`.
    subscribed: Vec<(Instant, u64, String, Option<bool>)>,
    /// Resets, errors, the client stopping: none is expected.
    unexpected: Vec<String>,
    stats: Stats,
}

/// A `tether::client` subscriber of channel `k` given `urls` (A first): processes and commits
/// every message, logging every event, until `stop`.
async fn client_subscriber(
    urls: Vec<String>,
    k: usize,
    idx: usize,
    board: Arc<Board>,
    mut stop: watch::Receiver<bool>,
) -> ClientLog {
    let ch = chan(k);
    let prefix = format!("h{k}-");
    let mut cfg = ClientConfig::with_urls(urls);
    cfg.seed = Some(idx as u64);
    let mut client = Client::connect(cfg).expect("client");
    client.subscribe(&ch, None).expect("subscribe");
    let mut log = ClientLog::default();
    loop {
        let ev = tokio::select! {
            ev = client.next_event() => ev,
            _ = stop.changed() => break,
        };
        let at = Instant::now();
        match ev {
            Ok(Event::Message { seq, data, .. }) => {
                let data: Value = serde_json::from_str(data.get()).expect("msg data is JSON");
                log.msgs.push((seq, publish_index(data["t"].as_str(), &prefix), at));
                client.commit(&ch, seq).await.expect("commit");
                board.reached[idx].store(seq, Relaxed);
            }
            Ok(Event::Subscribed { seq, epoch, recovered, .. }) => {
                if log.subscribed.is_empty() {
                    board.subscribed.fetch_add(1, Relaxed);
                }
                log.subscribed.push((at, seq, epoch, recovered));
            }
            Ok(Event::Connected { .. } | Event::Disconnected { .. }) => {}
            Ok(other) => log.unexpected.push(format!("{other:?}")),
            Err(e) => {
                log.unexpected.push(format!("client stopped: {e}"));
                break;
            }
        }
    }
    log.stats = client.stats();
    log
}

/// What a tungstenite subscriber saw.
struct TungLog {
    msgs: Vec<Got>,
    epoch: String,
    /// When and how its connection to A ended.
    lost_a: (Instant, String),
    /// B's answer to the resume, and when it came.
    resumed: (Instant, Value),
}

/// Reads the `msg`s of one connection into `msgs` until `stop` (`None`) or the connection
/// ends (`Some`: how).
async fn read_msgs(
    conn: &mut Conn,
    prefix: &str,
    msgs: &mut Vec<Got>,
    reached: &AtomicU64,
    stop: &mut watch::Receiver<bool>,
) -> Option<String> {
    loop {
        let v = tokio::select! {
            v = conn.recv() => v,
            _ = stop.changed() => return None,
        };
        let v = match v {
            Ok(v) => v,
            Err(how) => return Some(how),
        };
        assert_eq!(v["op"], "msg", "tungstenite subscriber: unexpected frame {v}");
        let seq = v["seq"].as_u64().expect("msg.seq");
        msgs.push((seq, publish_index(v["data"]["t"].as_str(), prefix), Instant::now()));
        reached.store(seq, Relaxed);
    }
}

/// A subscriber of channel `k` driven by tokio-tungstenite: live on A; when that connection
/// ends, on B with `sub` `from` (the last seq it processed) and `epoch`; reads until `stop`.
async fn tung_subscriber(
    a: SocketAddr,
    b: SocketAddr,
    k: usize,
    idx: usize,
    board: Arc<Board>,
    mut stop: watch::Receiver<bool>,
) -> TungLog {
    let (ch, prefix) = (chan(k), format!("h{k}-"));
    let mut conn = Conn::tung(a).await;
    let (head, epoch) = conn.sub_live(&ch).await;
    assert_eq!(head, 0, "tungstenite subscriber {idx}: {ch} is fresh");
    board.subscribed.fetch_add(1, Relaxed);
    let mut msgs = Vec::new();
    let how = read_msgs(&mut conn, &prefix, &mut msgs, &board.reached[idx], &mut stop).await;
    let lost_a = (Instant::now(), how.unwrap_or_else(|| panic!("tungstenite subscriber {idx}: stopped while on A")));
    let last = msgs.last().map_or(0, |m: &Got| m.0);
    let mut conn = Conn::tung(b).await;
    let v = conn.sub(&ch, Some((last, &epoch))).await;
    let resumed = (Instant::now(), v);
    let ended = read_msgs(&mut conn, &prefix, &mut msgs, &board.reached[idx], &mut stop).await;
    assert!(ended.is_none(), "tungstenite subscriber {idx}: its connection to B ended: {ended:?}");
    TungLog { msgs, epoch, lost_a, resumed }
}

/// Asserts that `msgs` are seq 1..=acked.len() in order, once each, each with the publish
/// index its ack recorded (`acked[seq - 1]`).
fn assert_exactly_once(who: &str, msgs: &[Got], acked: &[u64]) {
    for (i, &(seq, n, _)) in msgs.iter().enumerate() {
        let want = i as u64 + 1;
        assert_eq!(seq, want, "{who}: expected seq {want}, got {seq}");
        assert_eq!(acked.get(i), Some(&n), "{who}: seq {seq} carries publish {n}, its ack says {:?}", acked.get(i));
    }
    assert_eq!(msgs.len(), acked.len(), "{who}: got up to seq {}, {} acked", msgs.len(), acked.len());
}

/// Holds a tether client's log to the contract: its application saw every acked message of
/// its channel once (no reset, no error), `subscribed` live on A, then resumed on B after the
/// kill with `recovered: true` under the same epoch, over exactly two connections, with no
/// gap. Returns when the resume was answered.
fn check_client(who: &str, log: &ClientLog, acked: &[u64], killed: Instant) -> Instant {
    assert!(log.unexpected.is_empty(), "{who}: {:?}", log.unexpected);
    assert_exactly_once(who, &log.msgs, acked);
    let [(_, 0, epoch, None), (at, _, again, Some(true))] = &log.subscribed[..] else {
        panic!("{who}: want subscribed live, then resumed with recovered: true; got {:?}", log.subscribed)
    };
    assert_eq!(again, epoch, "{who}: the resume on B changed the epoch");
    assert!(*at > killed, "{who}: resumed before the kill");
    assert_eq!((log.stats.connects, log.stats.gaps), (2, 0), "{who}: {:?}", log.stats);
    *at
}

/// Holds a tungstenite subscriber's log to the contract: it lost A at the kill, B answered its
/// resume with `recovered: true` under the same epoch, and every acked message of its channel
/// came once on the wire.
fn check_tung(who: &str, log: &TungLog, acked: &[u64], killed: Instant) {
    assert!(log.lost_a.0 > killed, "{who}: lost A before the kill: {}", log.lost_a.1);
    let v = &log.resumed.1;
    assert_eq!(
        (v["op"].as_str(), v["recovered"].as_bool(), v["epoch"].as_str()),
        (Some("subscribed"), Some(true), Some(log.epoch.as_str())),
        "{who}: B's answer to the resume: {v}"
    );
    assert_exactly_once(who, &log.msgs, acked);
}

/// When `msgs` first reached seq `from`.
fn first_at(msgs: &[Got], from: u64) -> Instant {
    msgs.iter().find(|m| m.0 >= from).map(|m| m.2).expect("a message past the kill")
}

/// Per channel, the first seq that A cannot have delivered: the publish after the first ack
/// that came after `dead` (each channel's publisher is sequential, so that publish was sent
/// after A was gone). `None` while a channel has no such ack yet.
fn first_after(tally: &Tally, dead: Instant) -> Vec<Option<u64>> {
    let acks = tally.acks.lock().unwrap();
    (0..CHANNELS).map(|k| acks.iter().filter(|a| a.ch == chan(k) && a.at > dead).map(|a| a.seq + 1).min()).collect()
}

/// Runs a publisher per channel to `addr` on a thread and runtime of their own, until `stop`:
/// in the runtime of 2,000 subscribers a publish would wait its turn at every await, and the
/// rate would sag.
fn publishers_thread(addr: SocketAddr, tally: Arc<Tally>, stop: watch::Receiver<bool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("publishers' runtime");
        rt.block_on(async {
            let mut publishers = Tasks::default();
            for k in 0..CHANNELS {
                let ch = Arc::new(vec![chan(k)]);
                publishers.spawn(http_publisher_at(addr, k, ch, RATE, tally.clone(), stop.clone()));
            }
            publishers.join(PUBLISH_LIMIT + STEP).await;
        });
    })
}

/// `(median, p99, max)` of `d`.
fn spread(mut d: Vec<Duration>) -> (Duration, Duration, Duration) {
    d.sort();
    let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), at(1.0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_a_node_every_subscriber_resumes_on_the_other_exactly_once() {
    let _serial = serial().await;
    let t0 = Instant::now();
    let total = CLIENTS + CHANNELS * TUNG_PER_CHANNEL;
    let nofile = tether::server::raise_nofile().expect("raise RLIMIT_NOFILE");
    assert!(nofile.soft >= total as u64 + 500, "{total} sockets need a higher open-file limit: {nofile:?}");

    let redis = RedisProc::start();
    let config = redis_config(&redis.url(), "");
    let mut a = Server::start(&config, &["--cores", "2"]);
    let b = Server::start(&config, &["--cores", "2"]);
    wait_ready_status(a.addr, 200, STEP).await;
    wait_ready_status(b.addr, 200, STEP).await;

    // Every subscriber on A.
    let board =
        Arc::new(Board { reached: (0..total).map(|_| AtomicU64::new(0)).collect(), subscribed: AtomicUsize::new(0) });
    let (stop_subs, stop_rx) = watch::channel(false);
    let urls = vec![a.ws_url(), b.ws_url()];
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client_subscriber(urls.clone(), i % CHANNELS, i, board.clone(), stop_rx.clone())))
        .collect();
    let tungs: Vec<_> = (CLIENTS..total)
        .map(|i| tokio::spawn(tung_subscriber(a.addr, b.addr, i % CHANNELS, i, board.clone(), stop_rx.clone())))
        .collect();
    eventually(Duration::from_secs(30), "every subscriber subscribed", || {
        let n = board.subscribed.load(Relaxed);
        ready(check(n == total, || format!("{n} of {total}")))
    })
    .await;
    let subscribed = t0.elapsed();
    a.wait_gauge(total as f64, STEP).await;
    assert_eq!(b.gauge().await, 0.0, "every subscriber's first connection goes to A");

    // Publishers on B, one per channel, until every subscriber has processed a second of them.
    let tally = Arc::new(Tally::default());
    let (stop_pubs, pub_rx) = watch::channel(false);
    let publishers = publishers_thread(b.addr, tally.clone(), pub_rx);
    let publishing = Instant::now();
    eventually(Duration::from_secs(15), "every subscriber receiving on A", || {
        let behind = board.reached.iter().filter(|r| r.load(Relaxed) < RATE).count();
        ready(check(behind == 0, || format!("{behind} of {total} processed fewer than {RATE} messages")))
    })
    .await;

    // kill -9 A.
    let killed = Instant::now();
    a.signal(libc::SIGKILL);
    a.wait_exit(STEP).expect("A exits on SIGKILL");
    let dead = Instant::now();
    let from = eventually(RECOVERY_LIMIT + Duration::from_secs(5), "every subscriber back, past the kill", || {
        let from = first_after(&tally, dead);
        let behind: Vec<String> = (0..total)
            .filter(|&i| from[i % CHANNELS].is_none_or(|f| board.reached[i].load(Relaxed) < f))
            .map(|i| format!("#{i} at {}", board.reached[i].load(Relaxed)))
            .collect();
        ready(if behind.is_empty() {
            Ok(from.into_iter().map(|f| f.expect("a seq past the kill")).collect::<Vec<u64>>())
        } else {
            Err(format!(
                "first seqs past the kill {from:?}; {} behind: {:?}",
                behind.len(),
                &behind[..behind.len().min(10)]
            ))
        })
    })
    .await;
    let all_back = killed.elapsed();
    b.wait_gauge(total as f64, STEP).await;

    // Publish a while longer; then every subscriber reaches each channel's last acked seq.
    tokio::time::sleep(AFTER).await;
    stop_pubs.send(true).expect("stop publishers");
    let joined = tokio::task::spawn_blocking(move || publishers.join());
    let joined = tokio::time::timeout(PUBLISH_LIMIT + STEP, joined).await.expect("publishers stop in time");
    if let Err(panic) = joined.expect("join the publishers' thread") {
        std::panic::resume_unwind(panic);
    }
    let stopped = Instant::now();
    let mut acks = std::mem::take(&mut *tally.acks.lock().unwrap());
    let back = killed + all_back;
    let rate = |from: Instant, to: Instant| {
        let n = acks.iter().filter(|a| a.at >= from && a.at < to).count();
        (n as f64 / (to - from).as_secs_f64() / CHANNELS as f64).round()
    };
    let rates = [rate(publishing, killed), rate(killed, back), rate(back, stopped)];
    acks.sort_by_key(|a| a.seq);
    let acked: Vec<Vec<u64>> = (0..CHANNELS)
        .map(|k| {
            let (ch, prefix) = (chan(k), format!("h{k}-"));
            let mine: Vec<_> = acks.iter().filter(|a| a.ch == ch).collect();
            for (i, a) in mine.iter().enumerate() {
                assert_eq!(a.seq, i as u64 + 1, "{ch}: acked seqs {:?}…", mine.iter().map(|a| a.seq).take(20));
            }
            mine.iter().map(|a| publish_index(Some(&a.tag), &prefix)).collect()
        })
        .collect();
    eventually(Duration::from_secs(15), "every subscriber at its channel's last acked seq", || {
        let behind = (0..total).filter(|&i| board.reached[i].load(Relaxed) < acked[i % CHANNELS].len() as u64).count();
        ready(check(behind == 0, || format!("{behind} behind")))
    })
    .await;
    stop_subs.send(true).expect("stop subscribers");

    // Each subscriber: live on A, resumed on B under the same epoch, every acked message once.
    let (mut recovery, mut resumed, mut redelivered) = (Vec::new(), Vec::new(), 0);
    for (i, task) in clients.into_iter().enumerate() {
        let log = tokio::time::timeout(STEP, task).await.expect("subscriber stops").expect("subscriber task");
        let k = i % CHANNELS;
        let at = check_client(&format!("client {i} on {}", chan(k)), &log, &acked[k], killed);
        redelivered += log.stats.duplicates_dropped;
        resumed.push(at - killed);
        recovery.push(first_at(&log.msgs, from[k]) - killed);
    }
    for (i, task) in (CLIENTS..).zip(tungs) {
        let log = tokio::time::timeout(STEP, task).await.expect("subscriber stops").expect("subscriber task");
        let k = i % CHANNELS;
        check_tung(&format!("tungstenite subscriber {i} on {}", chan(k)), &log, &acked[k], killed);
        resumed.push(log.resumed.0 - killed);
        recovery.push(first_at(&log.msgs, from[k]) - killed);
    }

    let (med, p99, max) = spread(recovery);
    let (r_med, _, r_max) = spread(resumed);
    let published: usize = acked.iter().map(Vec::len).sum();
    println!(
        "kill -9 of node A under {total} subscribers ({CLIENTS} tether clients, {} tungstenite) on {CHANNELS} \
         channels: time to recovery (kill to the first message published after it, on B) median {med:?}, p99 \
         {p99:?}, max {max:?}; resumed on B (subscribed, recovered) median {r_med:?}, max {r_max:?}; all back \
         {all_back:?} after the kill; {published} publishes acked ({} refused, {} failed, each retried), per \
         channel {:?}/s before, during and after the recovery (target {RATE}/s); {redelivered} replays of \
         received but uncommitted messages dropped by the clients; subscribed in {subscribed:?}; {:?} in all",
        CHANNELS * TUNG_PER_CHANNEL,
        tally.refused.load(Relaxed),
        tally.failed.load(Relaxed),
        rates,
        t0.elapsed(),
    );
    assert!(max <= RECOVERY_LIMIT, "the last subscriber recovered {max:?} after the kill");
}
