//! Memory that comes back (issue 26, item 7): cycles of connect / subscribe / fan-out / churn /
//! disconnect against one `tether serve` child process, with the server's RSS, open file
//! descriptors and gauges after each cycle, once every client has left. Steady cycles must not
//! grow the RSS: the bench says PASS when cycle 5 (the last) is at most 5 % above cycle 2 (the
//! first cycles fill caches and pools that later cycles reuse).
//!
//! `cargo bench --bench soak`. Env: SOAK_CYCLES (5), SOAK_CONNS (3000), SOAK_ROOMS (100 shared
//! channels), SOAK_MSGS (5 messages per room per fan-out), SOAK_CHURN_PCT (10: the share of
//! clients that disconnect and reconnect in the churn), SOAK_DEDUP_MS (3000: the server's
//! `dedup.window_ms`, how long an idle channel and its history are kept), SOAK_SETTLE_MS (2500:
//! the wait after the gauges read 0, longer than the 2 s heartbeat), SOAK_CORES (2),
//! SOAK_MAX_GROWTH_PCT (5).
//!
//! The server is a child process (so the RSS is the server's alone; `heartbeat.ping_interval_ms
//! = 2000`); the clients are raw RFC 6455 connections in this process, one tokio task each
//! (they answer pings, count `subscribed` and `msg` frames). One cycle:
//! 1. connect SOAK_CONNS clients; client `i` subscribes to `room{i % ROOMS}` and `u{i}`;
//! 2. fan-out: SOAK_MSGS `POST /publish` per room and one per `u{i}`; every delivery awaited;
//! 3. churn: every client unsubscribes from its room and its own channel and subscribes to
//!    `room{(i + 1) % ROOMS}` and `v{i}`; SOAK_CHURN_PCT % of them disconnect and reconnect
//!    (and subscribe again); then one more fan-out to every room, awaited;
//! 4. disconnect all, wait for the connection gauge to read 0 and for the channel count
//!    (`/status.json`) to read 0 (an idle channel and its history are kept for
//!    `dedup.window_ms` and swept every 5 s), wait SOAK_SETTLE_MS more, sample.
//!
//! So after each cycle the server holds no connection and no channel: what it still holds
//! beyond the first cycles' peak is memory that did not come back. Writes
//! `target/bench/soak.json`.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use tether::ws::codec::{decode_server_frame, encode_client_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const OP_TEXT: u8 = 0x1;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;
const MASK: [u8; 4] = [0x21, 0x7e, 0x90, 0x0d];

/// Bound of every wait of one phase.
const PHASE: Duration = Duration::from_secs(60);

/// What every client has seen, summed.
#[derive(Default)]
struct Seen {
    subscribed: AtomicU64,
    msgs: AtomicU64,
    closed: AtomicU64,
}

/// One client: its task owns the socket; dropping the sender ends it (and closes the socket).
struct Client {
    tx: mpsc::UnboundedSender<Vec<u8>>,
}

impl Client {
    /// Connects, upgrades on `/ws` and starts the client's task.
    async fn connect(addr: SocketAddr, seen: Arc<Seen>) -> Client {
        let mut s =
            tokio::time::timeout(PHASE, TcpStream::connect(addr)).await.expect("connect timed out").expect("connect");
        let req = format!(
            "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.expect("send upgrade");
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        let end = loop {
            let n = tokio::time::timeout(PHASE, s.read(&mut chunk)).await.expect("101 timed out").expect("read 101");
            assert!(n > 0, "closed during the upgrade");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
        };
        assert!(buf.starts_with(b"HTTP/1.1 101"), "upgrade refused: {}", String::from_utf8_lossy(&buf[..end]));
        buf.drain(..end);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_client(s, buf, rx, seen));
        Client { tx }
    }

    /// Sends one request (a JSON text).
    fn send(&self, json: &Value) {
        let _ = self.tx.send(encode_client_frame(OP_TEXT, true, json.to_string().as_bytes(), MASK));
    }
}

/// The client's task: writes what it is given, answers pings, counts what it reads.
async fn run_client(mut s: TcpStream, mut buf: Vec<u8>, mut rx: mpsc::UnboundedReceiver<Vec<u8>>, seen: Arc<Seen>) {
    let mut chunk = vec![0u8; 4096];
    loop {
        while let Ok(Some((used, _fin, opcode, payload))) = decode_server_frame(&buf) {
            buf.drain(..used);
            match opcode {
                OP_PING => {
                    let sent = s.write_all(&encode_client_frame(OP_PONG, true, &payload, MASK)).await;
                    if sent.is_err() {
                        return;
                    }
                }
                OP_CLOSE => {
                    seen.closed.fetch_add(1, Relaxed);
                    return;
                }
                OP_TEXT => {
                    let v: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
                    match v["op"].as_str() {
                        Some("subscribed") => seen.subscribed.fetch_add(1, Relaxed),
                        Some("msg") => seen.msgs.fetch_add(1, Relaxed),
                        _ => 0,
                    };
                }
                _ => {}
            }
        }
        tokio::select! {
            out = rx.recv() => match out {
                Some(frame) => if s.write_all(&frame).await.is_err() { return },
                None => return,
            },
            n = s.read(&mut chunk) => match n {
                Ok(0) | Err(_) => {
                    seen.closed.fetch_add(1, Relaxed);
                    return;
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            },
        }
    }
}

/// Connects `n` clients, 256 at a time.
async fn connect_all(addr: SocketAddr, n: usize, seen: &Arc<Seen>) -> Vec<Client> {
    futures::stream::iter(0..n).map(|_| Client::connect(addr, seen.clone())).buffered(256).collect().await
}

/// `POST /publish/{ch}` for every channel of `chans`, over 8 keep-alive connections.
async fn publish_all(addr: SocketAddr, chans: Vec<String>) {
    let per = chans.len().div_ceil(8).max(1);
    let jobs: Vec<Vec<String>> = chans.chunks(per).map(|c| c.to_vec()).collect();
    let tasks = jobs.into_iter().map(|chans| {
        tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.expect("connect for publish");
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            for ch in chans {
                let body = "\"soak\"";
                let req = format!(
                    "POST /publish/{ch} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(req.as_bytes()).await.expect("send publish");
                // One answer per request: a head, then Content-Length bytes.
                loop {
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..p]).into_owned();
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                            })
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        if buf.len() >= p + 4 + len {
                            assert!(head.starts_with("HTTP/1.1 200"), "publish to {ch}: {head}");
                            buf.drain(..p + 4 + len);
                            break;
                        }
                    }
                    let n = tokio::time::timeout(PHASE, s.read(&mut chunk))
                        .await
                        .expect("publish answer timed out")
                        .expect("read");
                    assert!(n > 0, "publish connection closed");
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        })
    });
    for t in tasks.collect::<Vec<_>>() {
        t.await.expect("publisher");
    }
}

/// `GET /status.json` (as a loopback admin request).
fn status(port: u16) -> Value {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return Value::Null };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!("GET /status.json HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return Value::Null;
    }
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_once("\r\n\r\n").and_then(|(_, body)| serde_json::from_str(body).ok()).unwrap_or(Value::Null)
}

/// One cycle's figures.
struct Sample {
    cycle: usize,
    rss_mb: f64,
    fds: usize,
    connections: f64,
    channels: f64,
    seconds: f64,
}

/// Runs cycle `cycle` against the server on `addr`.
async fn cycle(addr: SocketAddr, conns: usize, rooms: usize, msgs: usize, churn_pct: usize) {
    let seen = Arc::new(Seen::default());
    let room = |i: usize| format!("room{}", i % rooms);
    let mut clients = connect_all(addr, conns, &seen).await;
    for (i, c) in clients.iter().enumerate() {
        c.send(&json!({"op": "sub", "ch": room(i)}));
        c.send(&json!({"op": "sub", "ch": format!("u{i}")}));
    }
    eventually_reaches(&seen.subscribed, 2 * conns as u64, PHASE, "subscribed").await;

    // Fan-out: every room MSGS times, every own channel once.
    let mut chans: Vec<String> = (0..msgs).flat_map(|_| (0..rooms).map(|r| format!("room{r}"))).collect();
    chans.extend((0..conns).map(|i| format!("u{i}")));
    publish_all(addr, chans).await;
    eventually_reaches(&seen.msgs, (conns * (msgs + 1)) as u64, PHASE, "fan-out deliveries").await;

    // Churn: move every client to the next room and a new own channel; some reconnect.
    for (i, c) in clients.iter().enumerate() {
        c.send(&json!({"op": "unsub", "ch": room(i)}));
        c.send(&json!({"op": "unsub", "ch": format!("u{i}")}));
        c.send(&json!({"op": "sub", "ch": room(i + 1)}));
        c.send(&json!({"op": "sub", "ch": format!("v{i}")}));
    }
    eventually_reaches(&seen.subscribed, 4 * conns as u64, PHASE, "subscribed after the churn").await;
    let again = conns * churn_pct / 100;
    let step = (conns / again.max(1)).max(1);
    let moved: Vec<usize> = (0..conns).step_by(step).take(again).collect();
    for &i in &moved {
        clients[i] = Client { tx: mpsc::unbounded_channel().0 };
    }
    let fresh = connect_all(addr, moved.len(), &seen).await;
    for (&i, c) in moved.iter().zip(fresh) {
        c.send(&json!({"op": "sub", "ch": room(i + 1)}));
        clients[i] = c;
    }
    eventually_reaches(&seen.subscribed, (4 * conns + moved.len()) as u64, PHASE, "subscribed after reconnecting")
        .await;
    let before = seen.msgs.load(Relaxed);
    publish_all(addr, (0..rooms).map(|r| format!("room{r}")).collect()).await;
    eventually_reaches(&seen.msgs, before + conns as u64, PHASE, "fan-out after the churn").await;

    // Disconnect all.
    drop(clients);
}

fn main() {
    if !should_run() {
        return;
    }
    let cycles: usize = env_or("SOAK_CYCLES", 5).max(2);
    let conns: usize = env_or("SOAK_CONNS", 3000);
    let rooms: usize = env_or("SOAK_ROOMS", 100).max(1);
    let msgs: usize = env_or("SOAK_MSGS", 5);
    let churn_pct: usize = env_or("SOAK_CHURN_PCT", 10).min(100);
    let settle = Duration::from_millis(env_or("SOAK_SETTLE_MS", 2500));
    let dedup_ms: u64 = env_or("SOAK_DEDUP_MS", 3000);
    let cores: usize = env_or("SOAK_CORES", 2);
    let max_growth: f64 = env_or("SOAK_MAX_GROWTH_PCT", 5.0);
    assert!(conns + 100 < 18_000, "SOAK_CONNS={conns}: this process holds every client (20,000 descriptors)");

    pin_binary("soak");
    let cfg = format!(
        "[heartbeat]\nping_interval_ms = 2000\npong_timeout_ms = 1500\n\n[dedup]\nwindow_ms = {dedup_ms}\n\n\
         [drain]\nwindow_ms = 1000\n"
    );
    let server = serve("soak", cores, &cfg);
    let addr = server.addr;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let baseline = rss_bytes(server.pid) as f64 / 1e6;
    println!(
        "soak: {cycles} cycles × {conns} connections, {rooms} rooms × {msgs} messages, {churn_pct} % reconnect; \
         server RSS at start {baseline:.1} MB ({} allocator)",
        allocator()
    );

    let mut samples = Vec::new();
    for c in 1..=cycles {
        let start = Instant::now();
        rt.block_on(cycle(addr, conns, rooms, msgs, churn_pct));
        let left = wait_connections(&server, 0, PHASE);
        assert_eq!(left, 0, "cycle {c}: connections left in the gauge after every client left");
        // Idle channels go at the first sweep (every 5 s) past the dedup window.
        let sweep = Duration::from_millis(dedup_ms) + Duration::from_secs(15);
        let channels = || num(&status(server.addr.port()), "channels");
        // Still some after that: the next sample shows them.
        let _ = within_sync(sweep, || check(channels() == 0.0, || ()));
        std::thread::sleep(settle);
        let st = status(server.addr.port());
        let s = Sample {
            cycle: c,
            rss_mb: rss_bytes(server.pid) as f64 / 1e6,
            fds: server.fd_count(),
            connections: num(&st, "connections"),
            channels: num(&st, "channels"),
            seconds: start.elapsed().as_secs_f64(),
        };
        println!(
            "cycle {}: RSS {:.1} MB, {} fds, connections {}, channels {} ({:.1} s)",
            s.cycle, s.rss_mb, s.fds, s.connections, s.channels, s.seconds
        );
        samples.push(s);
    }

    let rows: Vec<Vec<String>> = samples
        .iter()
        .map(|s| {
            vec![
                s.cycle.to_string(),
                format!("{:.1}", s.rss_mb),
                s.fds.to_string(),
                s.connections.to_string(),
                s.channels.to_string(),
                format!("{:.1}", s.seconds),
            ]
        })
        .collect();
    table(
        "server after each cycle (every client gone)",
        &["cycle", "RSS MB", "fds", "connections", "channels", "cycle s (with settle)"],
        &rows,
    );
    let second = samples[1].rss_mb;
    let last = samples[samples.len() - 1].rss_mb;
    let limit = second * (1.0 + max_growth / 100.0);
    let pass = last <= limit;
    println!(
        "\n{}: cycle {} RSS {last:.1} MB {} cycle 2 RSS {second:.1} MB + {max_growth} % = {limit:.1} MB",
        if pass { "PASS" } else { "FAIL" },
        samples.len(),
        if pass { "≤" } else { ">" },
    );
    write_json(
        "soak",
        &json!({
            "cycles": cycles,
            "conns": conns,
            "rooms": rooms,
            "msgs": msgs,
            "churn_pct": churn_pct,
            "settle_ms": settle.as_millis() as u64,
            "dedup_window_ms": dedup_ms,
            "cores": cores,
            "allocator": allocator(),
            "heartbeat_ms": 2000,
            "rss_start_mb": baseline,
            "per_cycle": samples.iter().map(|s| json!({
                "cycle": s.cycle,
                "rss_mb": s.rss_mb,
                "fds": s.fds,
                "connections": s.connections,
                "channels": s.channels,
                "seconds": s.seconds,
            })).collect::<Vec<_>>(),
            "max_growth_pct": max_growth,
            "pass": pass,
        }),
    );
    drop(server);
    if !pass {
        std::process::exit(1);
    }
}
