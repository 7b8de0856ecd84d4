//! Resume replay (issue 4, server item 1; docs/protocol.md): a `sub` with `from: 0` on a channel
//! with a 100,000-message history gets `subscribed` with `recovered: true`, then seq 1..head
//! from history, then the live stream, with no gap and no duplicate at the seam even while the
//! channel is being published during the replay. Prints the replay rate.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tether::ws::codec::{decode_server_frame, encode_client_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HISTORY: u64 = 100_000;

/// Publishes `{"n":i}` for i in 1..=n over one WebSocket, pipelined in batches of 1,000
/// `pub` frames, and checks every ack's seq.
async fn fill(addr: SocketAddr, ch: &str, n: u64) {
    let mut ws = RawWs::connect(addr, "/ws").await;
    let mut next_ack = 1;
    for start in (1..=n).step_by(1000) {
        let end = (start + 999).min(n);
        let mut batch = Vec::new();
        for i in start..=end {
            let f = json!({"op": "pub", "ch": ch, "id": format!("fill-{i}"), "data": {"n": i}}).to_string();
            batch.extend(encode_client_frame(OP_TEXT, true, f.as_bytes(), [1, 2, 3, 4]));
        }
        ws.s.write_all(&batch).await.expect("send batch");
        while next_ack <= end {
            let f = ws.frame_skip_pings(STEP).await;
            let v = f.json();
            assert_eq!((v["op"].as_str(), v["seq"].as_u64()), (Some("ack"), Some(next_ack)), "{v}");
            next_ack += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_full_history_joins_the_live_stream_without_gap_or_duplicate() {
    let _serial = serial().await;
    const LIVE: u64 = 3_000;
    let ch = "resume.replay";
    // Room for the live publishes too, so none of the 100,000 is evicted while they race in.
    let srv =
        Server::start(&format!("[[channels]]\npattern = \"*\"\nhistory = {}\n", HISTORY + LIVE), &["--cores", "2"]);
    let t = Instant::now();
    fill(srv.addr, ch, HISTORY).await;
    eprintln!("filled {HISTORY} messages in {:?}", t.elapsed());

    let mut sub = RawWs::connect(srv.addr, "/ws").await;
    // Live publishes race the replay: they start as soon as the `sub` is on its way.
    let live_done = Arc::new(AtomicU64::new(0));
    let (go, ready) = tokio::sync::oneshot::channel::<()>();
    let live = {
        let (addr, done) = (srv.addr, live_done.clone());
        tokio::spawn(async move {
            let mut http = HttpConn::new(addr).await;
            ready.await.expect("subscriber gone");
            for i in HISTORY + 1..=HISTORY + LIVE {
                assert_eq!(http.publish(ch, format!("{{\"n\":{i}}}").as_bytes()).await, i);
                done.store(i, Ordering::Relaxed);
            }
        })
    };
    let t0 = Instant::now();
    sub.send_json(&json!({"op": "sub", "ch": ch, "from": 0})).await;
    go.send(()).expect("live publisher gone");
    let first = sub.frame_skip_pings(STEP).await.json();
    assert_eq!((first["op"].as_str(), first["recovered"].as_bool()), (Some("subscribed"), Some(true)), "{first}");
    let head = first["seq"].as_u64().expect("seq");
    assert!(head >= HISTORY, "{first}");

    // A reader that does not memmove its buffer per frame, so the figure is the server's.
    let total = HISTORY + LIVE;
    let mut buf = std::mem::take(&mut sub.buf);
    let mut pos = 0;
    let mut chunk = vec![0u8; 256 * 1024];
    let mut next = 1u64;
    let mut replayed_at = None;
    let end = Instant::now() + Duration::from_secs(60);
    while next <= total {
        match decode_server_frame(&buf[pos..]) {
            Ok(Some((used, _, opcode, payload))) => {
                pos += used;
                if opcode == OP_PING {
                    continue;
                }
                assert_eq!(opcode, OP_TEXT);
                let seq = msg_seq(&payload);
                assert_eq!(seq, next, "gap or duplicate: got seq {seq}, want {next}");
                if seq == HISTORY {
                    replayed_at = Some((t0.elapsed(), live_done.load(Ordering::Relaxed).saturating_sub(HISTORY)));
                }
                next += 1;
                continue;
            }
            Ok(None) => {}
            Err(v) => panic!("invalid frame: {v:?}"),
        }
        buf.drain(..pos);
        pos = 0;
        let left = end.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, sub.s.read(&mut chunk))
            .await
            .unwrap_or_else(|_| panic!("stuck at seq {next}"))
            .expect("read");
        assert!(n > 0, "server closed the stream at seq {next}");
        buf.extend_from_slice(&chunk[..n]);
    }
    tokio::time::timeout(Duration::from_secs(30), live)
        .await
        .expect("live publisher timed out")
        .expect("live publisher");
    let (replay, live_meanwhile) = replayed_at.expect("replayed");
    eprintln!(
        "replayed {HISTORY} messages from history in {replay:?} ({:.0} msg/s); \
         {live_meanwhile} live publishes were acked during the replay; head at subscribe {head}",
        HISTORY as f64 / replay.as_secs_f64(),
    );
    // Whatever the timing, the live side of the seam is exercised: publishes arrived after
    // the subscription's head and had to follow the replay without gap or duplicate.
    assert!(head < HISTORY + LIVE, "every live publish came before the subscription; the seam was not exercised");
    // Nothing beyond the last live publish.
    sub.buf = buf[pos..].to_vec();
    if let Ok(f) = tokio::time::timeout(Duration::from_millis(200), sub.frame_skip_pings(STEP)).await {
        panic!("extra frame after seq {total}: {:?}", f.text());
    }
    assert_eq!(srv.metric("tether_overflow_total", &[]).await, 0.0, "the replay tripped the slow-subscriber policy");
}
