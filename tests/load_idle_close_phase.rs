//! `tether load idle` counts a connection as held to the end when it was open at the stop,
//! whatever happens to it while the others close (issue 31 item 6: the c1m bench exited 1
//! because 1,303 of 500,000 connections "saw EOF without a close frame" at the end of the hold:
//! the load process, busy closing the others on a saturated box, answered their pings past the
//! nodes' pong timeout, the nodes reaped them, and the load tool counted them as dropped during
//! the hold).
//!
//! The peer here is a scripted WebSocket server on real sockets that does at once what the
//! nodes did late: when the first close frame arrives, it ends every other connection with a
//! FIN and no close frame, newest first (the load tool reaches its connections oldest first).
//! A load tool that starts closing before it has counted every connection counts some of them
//! as dropped; one that counts first reports all held, and the EOFs as close errors.

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::KillOnDrop;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};

const CONNS: usize = 2000;
const T: Duration = Duration::from_secs(60);

/// What the scripted server shares between its connections.
#[derive(Default)]
struct Peer {
    /// Connections past `subscribed`.
    subscribed: AtomicUsize,
    /// The write halves of the subscribed connections, in the order they subscribed.
    writers: Mutex<Vec<(usize, OwnedWriteHalf)>>,
    /// A close frame arrived: every other connection was ended.
    triggered: AtomicBool,
}

/// Reads once more into `buf`; false on EOF or error.
async fn more(s: &mut (impl AsyncReadExt + Unpin), buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 1024];
    match s.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(k) => {
            buf.extend_from_slice(&chunk[..k]);
            true
        }
    }
}

/// One client frame's length in `buf` (masked, payload under 126 bytes here), if complete.
fn client_frame_len(buf: &[u8]) -> Option<usize> {
    let len = 2 + 4 + usize::from(*buf.get(1)? & 0x7f);
    (buf.len() >= len).then_some(len)
}

/// RFC 6455 §4.2.2 upgrade, then `subscribed` for the client's `sub`; then, on the first close
/// frame of any connection, a close frame back on that one and a FIN on every other.
async fn serve(tcp: TcpStream, index: usize, peer: Arc<Peer>) {
    let (mut rd, mut wr) = tcp.into_split();
    let mut buf = Vec::new();
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if !more(&mut rd, &mut buf).await {
            return;
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let key = head
        .lines()
        .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
        .expect("the load tool sends Sec-WebSocket-Key")
        .trim()
        .to_string();
    let head_len = head.find("\r\n\r\n").unwrap() + 4;
    buf.drain(..head_len);
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
        tether_load::wire::accept_key(&key)
    );
    wr.write_all(answer.as_bytes()).await.expect("write the 101");
    while client_frame_len(&buf).is_none() {
        if !more(&mut rd, &mut buf).await {
            return;
        }
    }
    buf.drain(..client_frame_len(&buf).unwrap());
    let sub = json!({"op": "subscribed", "ch": "load.idle.0", "seq": 0}).to_string();
    let mut frame = vec![0x81, sub.len() as u8];
    frame.extend_from_slice(sub.as_bytes());
    wr.write_all(&frame).await.expect("write subscribed");
    peer.writers.lock().unwrap().push((index, wr));
    peer.subscribed.fetch_add(1, Ordering::SeqCst);
    // Everything after `sub` is the client's close frame (or pongs: none, nothing pings).
    while !(buf.first().is_some_and(|b| b & 0x0f == 0x8) && client_frame_len(&buf).is_some()) {
        if !more(&mut rd, &mut buf).await {
            return;
        }
    }
    if peer.triggered.swap(true, Ordering::SeqCst) {
        return; // ended already; reads on to the client's FIN above
    }
    let mut all = std::mem::take(&mut *peer.writers.lock().unwrap());
    let mine = all.iter().position(|(i, _)| *i == index).expect("this connection's writer");
    let (_, mut own) = all.remove(mine);
    // Newest first: the load tool reaches its connections oldest first.
    for (_, w) in all.iter_mut().rev() {
        let _ = w.shutdown().await;
    }
    let _ = own.write_all(&[0x88, 0x02, 0x03, 0xe8]).await;
    let _ = own.shutdown().await;
    // Kept until the end of the test: only the write side is shut.
    peer.writers.lock().unwrap().extend(all);
    peer.writers.lock().unwrap().push((index, own));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn idle_counts_connections_held_at_the_stop_even_if_the_server_ends_them_while_others_close() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let peer = Arc::new(Peer::default());
    let accepting = {
        let peer = peer.clone();
        tokio::spawn(async move {
            for index in 0.. {
                let Ok((tcp, _)) = listener.accept().await else { return };
                tokio::spawn(serve(tcp, index, peer.clone()));
            }
        })
    };
    let mut load = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["load", "idle", &format!("ws://{addr}/ws"), "--conns", &CONNS.to_string()])
            .args(["--threads", "1", "--hold", "24h", "--latency-from-data"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tether load idle"),
    );
    let all_in = tokio::time::timeout(T, async {
        while peer.subscribed.load(Ordering::SeqCst) < CONNS {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(all_in.is_ok(), "{} of {CONNS} subscribed within {T:?}", peer.subscribed.load(Ordering::SeqCst));
    // SAFETY: kill(2) on the child this test started.
    unsafe {
        libc::kill(load.0.id() as i32, libc::SIGTERM);
    }
    let mut stdout = load.0.stdout.take().expect("stdout");
    let reading = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).expect("read the report");
        text
    });
    // On a timeout the load process is killed (drop), which ends the read.
    let out = tokio::time::timeout(T, reading)
        .await
        .expect("the load tool reports within 60 s of SIGTERM")
        .expect("the reader thread");
    accepting.abort();
    let report: Value = out
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON report in {out:?}"));
    assert!(peer.triggered.load(Ordering::SeqCst), "no close frame reached the server: {report}");
    assert_eq!(report["opened"], CONNS, "{report}");
    assert_eq!(report["dropped"], 0, "ended after the stop, counted as dropped during the hold: {report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["connections"], CONNS, "{report}");
    // The server answered one close with its own; the others' closes met its FIN.
    assert_eq!(report["close_errors"], CONNS - 1, "{report}");
    assert_eq!(report["close_error_kinds"], json!({"eof": CONNS - 1}), "{report}");
    println!("close phase: {}", report["close_error_kinds"]);
}
