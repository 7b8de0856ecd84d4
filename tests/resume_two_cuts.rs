//! Resume after cuts (issue 4, "Two cuts"; docs/protocol.md): a subscriber whose TCP path is reset
//! twice mid-stream while seq 1..20000 is published still records every seq exactly once, by
//! resubscribing with `from` = the last seq it recorded.

mod common;
mod delivery;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use delivery::*;

const CONFIG: &str = "[[channels]]\npattern = \"*\"\nhistory = 100000\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_cut_twice_records_every_seq_once() {
    let _serial = serial().await;
    const N: u64 = 20_000;
    let ch = "resume.two-cuts";
    let srv = Server::start(CONFIG, &["--cores", "2"]);
    let relay = Relay::start(srv.addr).await;
    let file = temp_path("two-cuts");
    let mut sub = SubProc::start(&relay.ws_url(), ch, &file);
    relay.wait_accepts(1, STEP).await;
    // The subscription is in place once the server counts the connection.
    srv.wait_gauge(1.0, STEP).await;

    let progress = Arc::new(AtomicU64::new(0));
    let publisher = tokio::spawn(publish_paced(srv.addr, ch, N, 4000.0, progress.clone()));

    let mut resumes = Vec::new();
    for (k, at) in [6_000u64, 13_000].into_iter().enumerate() {
        eventually_reaches(&progress, at, Duration::from_secs(30), "the publisher").await;
        // Cut only while messages are flowing to a subscriber that is connected.
        relay.wait_accepts(k + 1, Duration::from_secs(10)).await;
        let before = last_seq(&file);
        let cut = relay.cut();
        relay.wait_accepts(k + 2, Duration::from_secs(10)).await;
        let resumed =
            eventually(Duration::from_secs(10), &format!("a msg crossing the relay after cut {}", k + 1), || async {
                relay.resume_after(cut).ok_or("none yet")
            })
            .await;
        eprintln!("cut {} at published seq {at} (file at {before}): first msg again after {resumed:?}", k + 1);
        resumes.push(resumed);
        sub.assert_running(&file);
    }
    tokio::time::timeout(Duration::from_secs(60), publisher).await.expect("publisher timed out").expect("publisher");
    wait_last_seq(&file, N, Duration::from_secs(30)).await;
    sub.stop(libc::SIGTERM);

    let seqs = read_seqs(&file, ch);
    assert_exactly_once(&seqs, N);
    assert!(relay.accepts() >= 3, "expected at least 3 connections, saw {}", relay.accepts());
    eprintln!("two cuts: {} connections; resume after cut (default backoff): {resumes:?}", relay.accepts());
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(file.with_extension("stderr"));
}

/// The tether client through a relay cut 10 times while 2,000 msg/s are published: every seq
/// arrives once, in order, and each cut is recovered. With `stable_after` 0 every cut is
/// treated like the first one after a long quiet connection (delay uniform in [0, 500 ms]),
/// so the median printed is the typical time to resume after one cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_resumes_after_each_cut_without_gap_or_duplicate() {
    use tether::client::{BackoffConfig, Client, ClientConfig, Event};
    let _serial = serial().await;
    const CUTS: usize = 10;
    let ch = "resume.client-cuts";
    let srv = Server::start(CONFIG, &["--cores", "2"]);
    let relay = Relay::start(srv.addr).await;
    let mut cfg = ClientConfig::new(relay.ws_url());
    cfg.backoff = BackoffConfig { stable_after: Duration::ZERO, ..BackoffConfig::default() };
    cfg.seed = Some(4);
    let mut client = Client::connect(cfg).expect("client");
    client.subscribe(ch, Some(0)).expect("subscribe");
    let first = async {
        loop {
            match client.next_event().await.expect("event") {
                Event::Subscribed { .. } => break,
                Event::Connected { .. } => {}
                other => panic!("before subscribed: {other:?}"),
            }
        }
    };
    tokio::time::timeout(STEP, first).await.expect("no subscribed in time");

    let progress = Arc::new(AtomicU64::new(0));
    // A cut every 700 messages (0.35 s), then 1,000 more after the last one.
    let total = 400 + 700 * CUTS as u64 + 1_000;
    let publisher = tokio::spawn(publish_paced(srv.addr, ch, total, 2000.0, progress.clone()));

    // The cutter runs beside the consumer so that consuming never waits on it.
    let relay = Arc::new(relay);
    let cutter = {
        let (relay, progress) = (relay.clone(), progress.clone());
        tokio::spawn(async move {
            let mut cuts = Vec::new();
            for k in 0..CUTS {
                eventually_reaches(&progress, 400 + 700 * k as u64, Duration::from_secs(30), "the publisher").await;
                relay.wait_accepts(k + 1, Duration::from_secs(10)).await;
                cuts.push(relay.cut());
            }
            cuts
        })
    };

    let mut next = 1u64;
    let mut retries = Vec::new();
    let mut connects = Vec::new();
    let end = Instant::now() + Duration::from_secs(60);
    while next <= total {
        let left = end.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, client.next_event())
            .await
            .unwrap_or_else(|_| panic!("stuck at seq {next}"))
            .expect("event");
        match ev {
            Event::Message { ch: c, seq, .. } => {
                assert_eq!(c, ch);
                assert_eq!(seq, next, "gap or duplicate");
                client.commit(ch, seq).await.expect("commit");
                next += 1;
            }
            Event::Disconnected { retry_in, .. } => retries.push(retry_in),
            Event::Connected { .. } => connects.push(Instant::now()),
            Event::Subscribed { recovered, .. } => assert_eq!(recovered, Some(true), "resume refused"),
            other => panic!("unexpected {other:?}"),
        }
    }
    let cuts = tokio::time::timeout(STEP, cutter).await.expect("cutter timed out").expect("cutter");
    tokio::time::timeout(STEP, publisher).await.expect("publisher timed out").expect("publisher");
    let resumes: Vec<Duration> = cuts.iter().map(|&c| relay.resume_after(c).expect("resumed")).collect();
    let overhead: Vec<Duration> = resumes.iter().zip(&retries).map(|(r, b)| r.saturating_sub(*b)).collect();
    eprintln!(
        "client, {CUTS} cuts: median time to resume {:?} (min {:?}, max {:?}); median without the backoff sleep {:?}; backoff sleeps {retries:?}",
        median(resumes.clone()),
        resumes.iter().min().unwrap(),
        resumes.iter().max().unwrap(),
        median(overhead),
    );
    // `Connected` events are informational and dropped while the application lags behind
    // (the client keeps at most 64 queued); the counter is exact.
    assert!(connects.len() <= CUTS);
    // A cut that lands while the client is between attempts finds nothing to cut, and one
    // that lands mid-handshake costs an extra attempt: the count is one per cut, give or take.
    let connects = client.stats().connects;
    assert!((CUTS as u64 / 2..=2 * CUTS as u64 + 1).contains(&connects), "{connects} connections for {CUTS} cuts");
    assert_eq!(client.stats().gaps, 0);
}
