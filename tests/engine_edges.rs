//! Edges of the engine's readiness and I/O handling that a change of driver or of the
//! per-connection task model could break (issue 12, "Tests"): a connection that becomes
//! readable while its outbound queue is full, a close racing a read, 10,000 connections that
//! each send one frame at the same instant, and readiness after a partial frame.
//!
//! Every case uses raw sockets (`common::RawWs`), so the test controls exactly which bytes
//! reach the server and when, and runs once per monoio driver (io_uring, then epoll with
//! `MONOIO_FORCE_LEGACY_DRIVER=1`) and readiness source (`io.readiness`: the epoll set, then
//! the multishot-poll ring), each checked in the server's log.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::drivers::{start, Setup, DRIVERS};
use common::*;
use serde_json::{json, Value};
use tether::ws::codec::encode_client_frame;
use tokio::io::AsyncWriteExt;

const MASK: [u8; 4] = [0x11, 0x22, 0x33, 0x44];

/// Reads frames (skipping pings) until one is a JSON object with `op == want`; returns it.
async fn until_op(ws: &mut RawWs, want: &str, limit: Duration) -> Value {
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let f = ws.frame_skip_pings(left).await;
        assert_ne!(f.opcode, OP_CLOSE, "closed ({}) while waiting for {want}", f.close_code());
        let v = f.json();
        if v["op"] == want {
            return v;
        }
    }
}

/// Next frame of `ws`, read through a 512-byte buffer (10,000 connections wait at once, so
/// `RawWs::next`'s 64 KiB read buffer each would cost 640 MB); panics at `end`.
async fn small_frame(ws: &mut RawWs, end: Instant) -> Frame {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 512];
    loop {
        if let Some((used, fin, opcode, payload)) =
            tether::ws::codec::decode_server_frame(&ws.buf).expect("server sent an invalid frame")
        {
            ws.buf.drain(..used);
            return Frame { fin, opcode, payload };
        }
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.s.read(&mut chunk)).await {
            Err(_) => panic!("no frame in time"),
            Ok(Ok(0)) => panic!("stream ended while a frame was expected"),
            Ok(Ok(n)) => ws.buf.extend_from_slice(&chunk[..n]),
            Ok(Err(e)) => panic!("read: {e}"),
        }
    }
}

/// A subscriber whose queue is held full (it never reads; the channel's policy is
/// drop-oldest, so the queue stays full instead of being closed) still has its own frames
/// read and acted on: its `pub` reaches another subscriber while its queue is full, and its
/// `ack` arrives after the backlog once it reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readable_while_queue_full() {
    for driver in DRIVERS {
        readable_while_queue_full_on(driver).await;
    }
}

async fn readable_while_queue_full_on(driver: Setup) {
    let srv = start(
        driver,
        "[limits]\nqueue_max_bytes = 65536\nmax_publish_bytes = 16384\nmax_message_bytes = 16384\n\n[[channels]]\npattern = \"flood\"\noverflow = \"drop-oldest\"\n",
        "2",
    );
    let mut stuck = RawWs::upgrade(connect_small_rcvbuf(srv.addr, 4096).await, srv.addr, "/ws").await;
    stuck.subscribe("flood").await;
    let mut side = RawWs::connect(srv.addr, "/ws").await;
    side.subscribe("side").await;

    // 4 KiB messages until the stuck subscriber's queue overflows (the drop-oldest counter
    // moves): its socket buffers and then its queue are full.
    let data = format!("\"{}\"", "x".repeat(4096));
    let mut http = HttpConn::new(srv.addr).await;
    let end = Instant::now() + Duration::from_secs(20);
    while srv.metric("tether_overflow_total", &["policy=\"drop-oldest\""]).await < 1.0 {
        assert!(Instant::now() < end, "the stuck subscriber's queue never overflowed");
        for _ in 0..32 {
            http.publish("flood", data.as_bytes()).await;
        }
    }

    stuck.send_json(&json!({"op": "pub", "ch": "side", "id": "while-full", "data": 7})).await;
    let m = until_op(&mut side, "msg", STEP).await;
    assert_eq!(m["data"], 7, "the pub read while the queue was full: {m}");

    // Reading again: the backlog, then the ack (queued behind it), with the connection open.
    let ack = until_op(&mut stuck, "ack", Duration::from_secs(20)).await;
    assert_eq!(ack["id"], "while-full", "{ack}");
    assert_eq!(srv.gauge().await, 2.0, "both connections still open");
}

/// A data frame and a close frame in one write, with the peer then either waiting for the
/// close answer or resetting the connection at once: the publish is read and stored (for the
/// waiting peers), the close is answered with the peer's code, and no connection is left
/// behind; the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_racing_a_read() {
    for driver in DRIVERS {
        close_racing_a_read_on(driver).await;
    }
}

async fn close_racing_a_read_on(driver: Setup) {
    let srv = start(driver, "", "2");
    let mut reader = RawWs::connect(srv.addr, "/ws").await;
    reader.subscribe("race").await;
    const PEERS: usize = 200;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..PEERS {
        let addr = srv.addr;
        tasks.spawn(async move {
            let mut ws = RawWs::connect(addr, "/ws").await;
            let pubf = json!({"op": "pub", "ch": "race", "id": format!("r{i}"), "data": i}).to_string();
            let mut bytes = encode_client_frame(OP_TEXT, true, pubf.as_bytes(), MASK);
            bytes.extend(encode_client_frame(OP_CLOSE, true, &1000u16.to_be_bytes(), MASK));
            if i % 2 == 0 {
                ws.s.write_all(&bytes).await.unwrap();
                let code = ws.expect_close(STEP).await;
                assert_eq!(code, 1000, "peer {i}: close answer");
                let (end, _) = ws.until_end(STEP).await;
                assert!(matches!(end, Ended::Eof | Ended::Error(_)), "peer {i}: {end:?}");
            } else {
                set_rst_on_close(&ws.s);
                ws.s.write_all(&bytes).await.unwrap();
                drop(ws);
            }
        });
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(r) = tasks.join_next().await {
            r.expect("peer task");
        }
    })
    .await
    .expect("peers finished within 60 s");

    // Every waiting peer's publish was stored and delivered, once.
    let mut seen = HashSet::new();
    let end = Instant::now() + Duration::from_secs(20);
    while (0..PEERS).step_by(2).any(|i| !seen.contains(&(i as u64))) {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "missing publishes of waiting peers; got {} of them", seen.len());
        let m = until_op(&mut reader, "msg", left).await;
        let k = m["data"].as_u64().expect("data");
        assert!(seen.insert(k), "publish {k} delivered twice");
    }
    srv.wait_gauge(1.0, Duration::from_secs(15)).await;
    let (status, _, _) = http_request(srv.addr, "GET", "/healthz", &[], b"").await;
    assert_eq!(status, 200);
}

/// 10,000 connections each send one frame at the same instant (half a ping, half a `pub` with
/// an id): every ping gets its pong with the same payload, every `pub` its `ack`, and a
/// subscriber receives each published message exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_send_one_frame_at_once() {
    for driver in DRIVERS {
        ten_thousand_connections_send_one_frame_at_once_on(driver).await;
    }
}

async fn ten_thousand_connections_send_one_frame_at_once_on(driver: Setup) {
    let _ = tether::server::raise_nofile();
    let srv = start(driver, "[limits.per_connection]\ncontrol_frames_rate = 0\n", "2");
    let mut reader = RawWs::connect(srv.addr, "/ws").await;
    reader.subscribe("burst").await;
    const N: usize = 10_000;

    // Connect everything first (at most 256 handshakes in flight), then release all at once.
    let gate = Arc::new(tokio::sync::Barrier::new(N + 1));
    let slots = Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let (addr, gate, slots) = (srv.addr, gate.clone(), slots.clone());
        tasks.spawn(async move {
            let permit = slots.acquire_owned().await.unwrap();
            let mut ws = RawWs::connect(addr, "/ws").await;
            drop(permit);
            let frame = if i % 2 == 0 {
                encode_client_frame(OP_PING, true, format!("p{i}").as_bytes(), MASK)
            } else {
                let pubf = json!({"op": "pub", "ch": "burst", "id": format!("b{i}"), "data": i}).to_string();
                encode_client_frame(OP_TEXT, true, pubf.as_bytes(), MASK)
            };
            gate.wait().await;
            ws.s.write_all(&frame).await.unwrap();
            let end = Instant::now() + Duration::from_secs(60);
            loop {
                let f = small_frame(&mut ws, end).await;
                if i % 2 == 0 && f.opcode == OP_PONG {
                    assert_eq!(&f.payload[..], format!("p{i}").as_bytes(), "pong payload");
                    break;
                }
                if i % 2 == 1 && f.opcode == OP_TEXT && f.json()["op"] == "ack" {
                    assert_eq!(f.json()["id"], format!("b{i}"), "{}", f.text());
                    break;
                }
            }
            ws
        });
    }
    tokio::time::timeout(Duration::from_secs(120), gate.wait()).await.expect("10,000 connected within 120 s");
    let mut open = Vec::with_capacity(N);
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(r) = tasks.join_next().await {
            open.push(r.expect("connection task"));
        }
    })
    .await
    .expect("every frame answered within 120 s");
    assert_eq!(open.len(), N);

    let mut seen = HashSet::new();
    let end = Instant::now() + Duration::from_secs(60);
    while seen.len() < N / 2 {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{} of {} publishes delivered", seen.len(), N / 2);
        let m = until_op(&mut reader, "msg", left).await;
        assert!(seen.insert(m["data"].as_u64().expect("data")), "a publish delivered twice: {m}");
    }
    assert_eq!(srv.gauge().await, (N + 1) as f64);
}

/// A frame that arrives in pieces (one byte of header, then the rest of the header, the
/// masking key, the payload in two parts) is assembled and answered, while another connection
/// is served meanwhile; the tail of a partial frame sent together with a whole second frame
/// yields both answers, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_after_partial_frame() {
    for driver in DRIVERS {
        readiness_after_partial_frame_on(driver).await;
    }
}

async fn readiness_after_partial_frame_on(driver: Setup) {
    let srv = start(driver, "", "1");
    let mut slow = RawWs::connect(srv.addr, "/ws").await;
    let mut other = RawWs::connect(srv.addr, "/ws").await;

    let pubf = |id: &str| json!({"op": "pub", "ch": "parts", "id": id, "data": id}).to_string();
    let a = encode_client_frame(OP_TEXT, true, pubf("a").as_bytes(), MASK);
    let cuts = [1, 2, 6, 10, a.len() - 5];
    let mut at = 0;
    for &cut in &cuts {
        slow.s.write_all(&a[at..cut]).await.unwrap();
        slow.s.flush().await.unwrap();
        at = cut;
        // While `slow` holds a partial frame, another connection on the same core is served.
        other.send(OP_PING, true, b"meanwhile").await;
        let f = other.frame(STEP).await;
        assert_eq!((f.opcode, &f.payload[..]), (OP_PONG, &b"meanwhile"[..]), "served during a partial frame");
    }
    slow.s.write_all(&a[at..]).await.unwrap();
    let ack = until_op(&mut slow, "ack", STEP).await;
    assert_eq!(ack["id"], "a");

    // The tail of frame b and all of frame c in one write: both acks, b first.
    let b = encode_client_frame(OP_TEXT, true, pubf("b").as_bytes(), MASK);
    let c = encode_client_frame(OP_TEXT, true, pubf("c").as_bytes(), MASK);
    slow.s.write_all(&b[..b.len() / 2]).await.unwrap();
    slow.s.flush().await.unwrap();
    other.send(OP_PING, true, b"again").await;
    assert_eq!(other.frame(STEP).await.opcode, OP_PONG);
    let mut rest = b[b.len() / 2..].to_vec();
    rest.extend_from_slice(&c);
    slow.s.write_all(&rest).await.unwrap();
    assert_eq!(until_op(&mut slow, "ack", STEP).await["id"], "b");
    assert_eq!(until_op(&mut slow, "ack", STEP).await["id"], "c");
}

/// A burst far larger than what the server reads from one connection per readiness (its read
/// budget: 4 × 64 KiB) is read to the end although readiness is reported once per arrival
/// (edge-triggered): 4,000 `pub` frames (about 1.8 MB) written in one go, while the client
/// reads the acks meanwhile, are all acked, in order, and the connection stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_beyond_the_read_budget() {
    for driver in DRIVERS {
        burst_beyond_the_read_budget_on(driver).await;
    }
}

async fn burst_beyond_the_read_budget_on(driver: Setup) {
    use tokio::io::AsyncReadExt;
    const N: usize = 4000;
    let srv = start(driver, "", "1");
    let mut ws = RawWs::connect(srv.addr, "/ws").await;
    let filler = "y".repeat(400);
    let mut burst = Vec::new();
    for i in 0..N {
        let op = json!({"op": "pub", "ch": "burst", "id": i.to_string(), "data": filler}).to_string();
        burst.extend_from_slice(&encode_client_frame(OP_TEXT, true, op.as_bytes(), MASK));
    }
    assert!(burst.len() > 6 * 4 * 64 * 1024, "the burst ({} bytes) is six read budgets at least", burst.len());
    let (mut rd, mut wr) = ws.s.split();
    let write = async {
        wr.write_all(&burst).await.expect("write the burst");
        wr.flush().await.expect("flush the burst");
    };
    let read = async {
        let end = Instant::now() + Duration::from_secs(30);
        let mut buf = std::mem::take(&mut ws.buf);
        let mut chunk = vec![0u8; 64 * 1024];
        let mut next = 0usize;
        while next < N {
            while let Some((used, _, opcode, payload)) =
                tether::ws::codec::decode_server_frame(&buf).expect("server sent an invalid frame")
            {
                buf.drain(..used);
                assert_ne!(opcode, OP_CLOSE, "closed after {next} acks");
                if opcode != OP_TEXT {
                    continue;
                }
                let v: Value = serde_json::from_slice(&payload).expect("JSON");
                assert_eq!(v["op"], "ack", "{v}");
                assert_eq!(v["id"], next.to_string(), "acks in order");
                next += 1;
            }
            if next == N {
                break;
            }
            let left = end.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rd.read(&mut chunk)).await {
                Err(_) => panic!("{next} of {N} acks in 30 s"),
                Ok(Ok(0)) => panic!("stream ended after {next} acks"),
                Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => panic!("read after {next} acks: {e}"),
            }
        }
    };
    tokio::join!(write, read);
    assert_eq!(srv.gauge().await, 1.0, "the connection is still open");
}
