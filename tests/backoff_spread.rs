//! Reconnect spread (issue 4, "Backoff spread"; docs/protocol.md): 500 `tether::client` clients
//! dropped by a drain with a short window, the server restarted on the same port, come back
//! spread out by full jitter: no 100 ms slot holds more than 10 % of the reconnects (going by
//! the clients' own `Event::Connected { .. }` timestamps).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use tether::client::{Client, ClientConfig, Event};

const CLIENTS: usize = 500;
const CONFIG: &str = "[drain]\nwindow_ms = 200\n";

#[derive(Default)]
struct Log {
    /// Every `Connected`, per client.
    connects: Vec<Vec<Instant>>,
    /// When each client was first disconnected (the drain's close).
    closes: Vec<Option<Instant>>,
    /// `Disconnected` events (failed attempts included), all clients.
    disconnects: usize,
    /// `Subscribed` events, all clients.
    subscribed: usize,
    /// `Reset` events, all clients.
    resets: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_clients_reconnect_spread_out() {
    let _serial = serial().await;
    let srv = Server::start(CONFIG, &["--cores", "2"]);
    let addr = srv.addr;
    let log = Arc::new(Mutex::new(Log {
        connects: vec![Vec::new(); CLIENTS],
        closes: vec![None; CLIENTS],
        ..Log::default()
    }));
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let mut cfg = ClientConfig::new(srv.ws_url());
        cfg.seed = Some(1000 + i as u64);
        let mut client = Client::connect(cfg).expect("client");
        client.subscribe("spread", None).expect("subscribe");
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            while let Ok(ev) = client.next_event().await {
                let mut l = log.lock().unwrap();
                match ev {
                    Event::Connected { .. } => l.connects[i].push(Instant::now()),
                    Event::Disconnected { .. } => {
                        l.disconnects += 1;
                        l.closes[i].get_or_insert_with(Instant::now);
                    }
                    Event::Subscribed { .. } => l.subscribed += 1,
                    // The restarted process has a new epoch: the resume is answered by a reset.
                    Event::Reset { .. } => l.resets += 1,
                    _ => {}
                }
            }
        }));
    }
    wait_for(&log, Duration::from_secs(30), |l| l.subscribed == CLIENTS).await;
    srv.wait_gauge(CLIENTS as f64, STEP).await;

    let t0 = Instant::now();
    let mut srv = srv;
    srv.signal(libc::SIGTERM);
    let st = srv.wait_exit(Duration::from_secs(5)).expect("old server did not exit within 5 s");
    assert!(st.success(), "{st:?}");
    let down = t0.elapsed();
    let srv2 = Server::start_at(CONFIG, addr, &["--cores", "2"]);
    let up = t0.elapsed();
    wait_for(&log, Duration::from_secs(40), |l| l.subscribed + l.resets == 2 * CLIENTS).await;
    srv2.wait_gauge(CLIENTS as f64, STEP).await;

    for t in &tasks {
        t.abort();
    }
    let (connects, closes, failed) = {
        let l = log.lock().unwrap();
        (l.connects.clone(), l.closes.clone(), l.disconnects - CLIENTS)
    };
    let back: Vec<Duration> = connects
        .iter()
        .map(|c| {
            assert_eq!(c.len(), 2, "each client connects once before and once after the restart");
            c[1] - t0
        })
        .collect();
    // Each client's own wait: from its drain close to its reconnect.
    let mut waits: Vec<Duration> = connects.iter().zip(&closes).map(|(c, d)| c[1] - d.expect("closed")).collect();
    waits.sort();
    let last = back.iter().max().copied().unwrap_or_default();
    let mut slots = vec![0usize; last.as_millis() as usize / 100 + 1];
    for d in &back {
        slots[d.as_millis() as usize / 100] += 1;
    }
    let peak = slots.iter().copied().max().unwrap_or(0);
    eprintln!(
        "drain: old process exited after {down:?}, new one listening after {up:?}; {failed} failed attempts; \
         close-to-reconnect wait min {:?} median {:?} max {:?}; reconnects per 100 ms from SIGTERM: {slots:?}; \
         peak {peak} ({:.1} %); last back after {last:?}",
        waits[0],
        waits[waits.len() / 2],
        waits[waits.len() - 1],
        100.0 * peak as f64 / CLIENTS as f64
    );
    assert!(peak * 10 <= CLIENTS, "a 100 ms slot holds {peak} of {CLIENTS} reconnects: {slots:?}");
}

async fn wait_for(log: &Mutex<Log>, limit: Duration, done: impl Fn(&Log) -> bool) {
    eventually(limit, "the clients' log", || {
        let l = log.lock().unwrap();
        let seen = || format!("{} subscribed, {} resets, {} disconnects", l.subscribed, l.resets, l.disconnects);
        std::future::ready(check(done(&l), seen))
    })
    .await
}
