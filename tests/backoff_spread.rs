//! Reconnect spread (issue 4, "Backoff spread"; DESIGN §3, §4): 500 `tether::client` clients
//! dropped by a drain with a short window, the server restarted on the same port, come back
//! spread out by full jitter: no 100 ms slot holds more than 10 % of the reconnects (going by
//! the clients' own `Event::Connected` timestamps).

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
    /// `Disconnected` events (failed attempts included), all clients.
    disconnects: usize,
    /// `Subscribed` events, all clients.
    subscribed: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_clients_reconnect_spread_out() {
    let _serial = serial().await;
    let srv = Server::start(CONFIG, &["--cores", "2"]);
    let addr = srv.addr;
    let log = Arc::new(Mutex::new(Log { connects: vec![Vec::new(); CLIENTS], ..Log::default() }));
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
                    Event::Connected => l.connects[i].push(Instant::now()),
                    Event::Disconnected { .. } => l.disconnects += 1,
                    Event::Subscribed { .. } => l.subscribed += 1,
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
    wait_for(&log, Duration::from_secs(40), |l| l.subscribed == 2 * CLIENTS).await;
    srv2.wait_gauge(CLIENTS as f64, STEP).await;

    let l = log.lock().unwrap();
    let back: Vec<Duration> = l.connects.iter().map(|c| {
        assert_eq!(c.len(), 2, "each client connects once before and once after the restart");
        c[1] - t0
    }).collect();
    let last = back.iter().max().copied().unwrap_or_default();
    let mut slots = vec![0usize; last.as_millis() as usize / 100 + 1];
    for d in &back {
        slots[d.as_millis() as usize / 100] += 1;
    }
    let peak = slots.iter().copied().max().unwrap_or(0);
    eprintln!(
        "drain: old process exited after {down:?}, new one listening after {up:?}; {} failed attempts; \
         reconnects per 100 ms from SIGTERM: {slots:?}; peak {peak} ({:.1} %); last back after {last:?}",
        l.disconnects - CLIENTS,
        100.0 * peak as f64 / CLIENTS as f64
    );
    assert!(peak * 10 <= CLIENTS, "a 100 ms slot holds {peak} of {CLIENTS} reconnects: {slots:?}");
    drop(l);
    for t in tasks {
        t.abort();
    }
}

async fn wait_for(log: &Mutex<Log>, limit: Duration, done: impl Fn(&Log) -> bool) {
    let end = Instant::now() + limit;
    loop {
        {
            let l = log.lock().unwrap();
            if done(&l) {
                return;
            }
            assert!(Instant::now() < end, "after {limit:?}: {} subscribed, {} disconnects", l.subscribed, l.disconnects);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
