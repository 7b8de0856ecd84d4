//! Shared helpers for the integration tests: a real `tether serve` process on 127.0.0.1:0
//! ([`server`]) and its async side here (Prometheus scraping, publishing), raw-socket RFC 6455
//! clients, and small HTTP/1.1 clients; [`redis`] runs a real `redis-server` for the Redis
//! broker tests, [`moto`] a DynamoDB-compatible server.
//!
//! The benches share [`server`], [`redis`] and [`wait`] (benches/common includes those files).
//!
//! Every wait here is bounded; a helper that runs out of time panics with what it saw.

#![allow(dead_code)]

pub mod api;
pub mod auth;
pub mod browser;
pub mod drivers;
pub mod feeds;
pub mod moto;
pub mod proxy;
pub mod raw_http;
pub mod redis;
pub mod redis_cluster;
pub mod server;
pub mod sse;
pub mod tls;
pub mod traffic;
pub mod tung;
pub mod upstream;
pub mod wait;

#[allow(unused_imports)]
pub use server::{Metrics, Server};
#[allow(unused_imports)]
pub use wait::{check, eventually, eventually_reaches, eventually_sync, wait_child, within, within_sync};

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tether::ws::codec::{decode_server_frame, encode_client_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Default bound for one network step (connect, one response, one frame).
pub const STEP: Duration = Duration::from_secs(10);

/// The key from RFC 6455 §1.3 and its accept value.
pub const SAMPLE_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
pub const SAMPLE_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// RFC 6455 opcodes.
pub const OP_CONT: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Serializes heavy tests of one test binary so their timing checks do not compete for the
/// two CPUs of the box. (An async mutex: the guard is held across the whole test; it does not
/// poison when a test fails.)
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// The async side of [`Server`]: what needs the tests' HTTP client.
impl Server {
    /// `GET /metrics` over a fresh connection.
    pub async fn metrics(&self) -> Metrics {
        let (status, _, body) = http_request(self.addr, "GET", "/metrics", &[], b"").await;
        assert_eq!(status, 200, "GET /metrics");
        Metrics(String::from_utf8_lossy(&body).into_owned())
    }

    /// Sum of the samples of `name` whose labels contain every `label="value"` in `labels`.
    pub async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        self.metrics().await.sum(name, labels)
    }

    /// Polls `metric(name, labels)` until `pred` holds; panics after `limit` with the last value.
    pub async fn wait_metric(&self, name: &str, labels: &[&str], limit: Duration, pred: impl Fn(f64) -> bool) -> f64 {
        eventually(limit, &format!("{name}{labels:?} reaching the expected value"), || async {
            let v = self.metric(name, labels).await;
            if pred(v) {
                Ok(v)
            } else {
                Err(v)
            }
        })
        .await
    }

    /// Total upgraded WebSocket connections (sum of `tether_connections{core}`).
    pub async fn gauge(&self) -> f64 {
        self.metric("tether_connections", &[]).await
    }

    /// Waits until the connection gauge equals `n`.
    pub async fn wait_gauge(&self, n: f64, limit: Duration) {
        self.wait_metric("tether_connections", &[], limit, |v| v == n).await;
    }

    /// `POST /publish/{ch}` with `body` over a fresh connection; returns the `seq`.
    pub async fn publish(&self, ch: &str, body: &str) -> u64 {
        let (status, _, resp) = http_request(self.addr, "POST", &format!("/publish/{ch}"), &[], body.as_bytes()).await;
        assert_eq!(status, 200, "publish answer: {}", String::from_utf8_lossy(&resp));
        seq_of_reply(&resp)
    }
}

/// Runs the `tether` binary with `args` (logging off), bounded by [`STEP`]; kills it and
/// panics with what it wrote if it runs longer.
pub fn run_tether(args: &[&str]) -> std::process::Output {
    let child = Command::new(server::BIN)
        .args(args)
        .env("TETHER_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tether");
    wait_child(child, STEP, &format!("tether {args:?}"))
}

/// Waits (bounded) until `GET /readyz` answers 200; panics with the last status and body.
pub async fn wait_ready(addr: SocketAddr, limit: Duration) {
    eventually(limit, &format!("/readyz of {addr} answering 200"), || async {
        let (status, _, body) = http_request(addr, "GET", "/readyz", &[], b"").await;
        check(status == 200, || format!("{status} {}", String::from_utf8_lossy(&body)))
    })
    .await
}

/// Extracts `N` from `{"seq":N}`.
pub fn seq_of_reply(body: &[u8]) -> u64 {
    let v: serde_json::Value =
        serde_json::from_slice(body).unwrap_or_else(|e| panic!("reply {:?}: {e}", String::from_utf8_lossy(body)));
    v["seq"].as_u64().unwrap_or_else(|| panic!("no seq in {v}"))
}

/// Connects with a bound.
pub async fn connect(addr: SocketAddr) -> TcpStream {
    tokio::time::timeout(STEP, TcpStream::connect(addr)).await.expect("connect timed out").expect("connect")
}

/// Connects with `SO_RCVBUF` set before `connect` (so the window scale reflects it).
pub async fn connect_small_rcvbuf(addr: SocketAddr, rcvbuf: usize) -> TcpStream {
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, Some(socket2::Protocol::TCP)).unwrap();
    sock.set_recv_buffer_size(rcvbuf).unwrap();
    sock.connect_timeout(&addr.into(), STEP).expect("connect");
    sock.set_nonblocking(true).unwrap();
    TcpStream::from_std(sock.into()).unwrap()
}

/// Makes the next close of `s` send a TCP RST instead of a FIN (SO_LINGER 0).
pub fn set_rst_on_close(s: &TcpStream) {
    socket2::SockRef::from(s).set_linger(Some(Duration::ZERO)).unwrap();
}

/// Reads an HTTP/1.1 response head; returns (status, head text, leftover bytes after the head).
pub async fn read_head(s: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let status = head
                .split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or_else(|| panic!("bad status line in {head:?}"));
            return (status, head, buf[end + 4..].to_vec());
        }
        let n =
            tokio::time::timeout(STEP, s.read(&mut chunk)).await.expect("response head timed out").expect("read head");
        assert!(n > 0, "connection closed before a full response head; got {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The value of header `name` (case-insensitive) in a response head.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads a response with `Content-Length` (body may be empty).
async fn read_response(s: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let (status, head, mut body) = read_head(s).await;
    let len: usize = header(&head, "content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut chunk = [0u8; 8192];
    while body.len() < len {
        let n =
            tokio::time::timeout(STEP, s.read(&mut chunk)).await.expect("response body timed out").expect("read body");
        assert!(n > 0, "connection closed mid-body");
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    (status, head, body)
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`).
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut s = connect(addr).await;
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    read_response(&mut s).await
}

/// An HTTP/1.1 keep-alive connection for publishing many messages.
pub struct HttpConn {
    s: TcpStream,
    addr: SocketAddr,
}

impl HttpConn {
    pub async fn new(addr: SocketAddr) -> HttpConn {
        HttpConn { s: connect(addr).await, addr }
    }

    /// `POST path` with `body` and extra headers; returns (status, body).
    pub async fn post(&mut self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, Vec<u8>) {
        let (status, _, body) = self.post_with_head(path, headers, body).await;
        (status, body)
    }

    /// `POST path` with `body` and extra headers; returns (status, response head, body).
    pub async fn post_with_head(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String, Vec<u8>) {
        let mut req = format!("POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n", self.addr, body.len());
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let mut out = req.into_bytes();
        out.extend_from_slice(body);
        self.s.write_all(&out).await.unwrap();
        read_response(&mut self.s).await
    }

    /// `POST /publish/{ch}`, asserting 200; returns the seq.
    pub async fn publish(&mut self, ch: &str, body: &[u8]) -> u64 {
        let (status, resp) = self.post(&format!("/publish/{ch}"), &[], body).await;
        assert_eq!(status, 200, "publish answer: {}", String::from_utf8_lossy(&resp));
        seq_of_reply(&resp)
    }
}

/// A raw RFC 6455 client over a plain TCP stream: masked frames out, server frames in.
pub struct RawWs {
    pub s: TcpStream,
    pub buf: Vec<u8>,
}

/// A decoded server frame.
#[derive(Debug, Clone)]
pub struct Frame {
    pub fin: bool,
    pub opcode: u8,
    pub payload: Bytes,
}

impl Frame {
    /// Close code of a close frame (1005 when the payload is empty).
    pub fn close_code(&self) -> u16 {
        assert_eq!(self.opcode, OP_CLOSE, "not a close frame: {self:?}");
        if self.payload.len() >= 2 {
            u16::from_be_bytes([self.payload[0], self.payload[1]])
        } else {
            1005
        }
    }

    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.payload).expect("utf-8 payload")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).unwrap_or_else(|e| panic!("frame {:?} is not JSON: {e}", self.text()))
    }
}

/// What a raw read ended with.
#[derive(Debug)]
pub enum Ended {
    /// Orderly EOF (FIN).
    Eof,
    /// A socket error such as ECONNRESET.
    Error(std::io::ErrorKind),
}

/// The request head of an upgrade with the usual headers, plus `extra` header lines.
pub fn upgrade_request(addr: SocketAddr, path: &str, key: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
}

impl RawWs {
    /// Connects and upgrades on `path`, asserting 101.
    pub async fn connect(addr: SocketAddr, path: &str) -> RawWs {
        Self::upgrade(connect(addr).await, addr, path).await
    }

    /// Upgrades an already connected stream on `path`, asserting 101.
    pub async fn upgrade(mut s: TcpStream, addr: SocketAddr, path: &str) -> RawWs {
        s.write_all(upgrade_request(addr, path, SAMPLE_KEY).as_bytes()).await.unwrap();
        let (status, head, rest) = read_head(&mut s).await;
        assert_eq!(status, 101, "upgrade refused: {head}");
        RawWs { s, buf: rest }
    }

    /// Sends one masked frame.
    pub async fn send(&mut self, opcode: u8, fin: bool, payload: &[u8]) {
        let f = encode_client_frame(opcode, fin, payload, [0x37, 0xfa, 0x21, 0x3d]);
        self.s.write_all(&f).await.expect("send frame");
    }

    /// Sends a text frame with `json`.
    pub async fn send_json(&mut self, json: &serde_json::Value) {
        self.send(OP_TEXT, true, json.to_string().as_bytes()).await;
    }

    /// Next frame, or how the stream ended; panics after `limit`.
    pub async fn next(&mut self, limit: Duration) -> Result<Frame, Ended> {
        let end = tokio::time::Instant::now() + limit;
        let mut chunk = vec![0u8; 65536];
        loop {
            match decode_server_frame(&self.buf) {
                Ok(Some((used, fin, opcode, payload))) => {
                    self.buf.drain(..used);
                    return Ok(Frame { fin, opcode, payload });
                }
                Ok(None) => {}
                Err(v) => panic!("server sent an invalid frame: {v:?}"),
            }
            let n = match tokio::time::timeout_at(end, self.s.read(&mut chunk)).await {
                Err(_) => panic!("no frame within {limit:?} (buffered {} bytes)", self.buf.len()),
                Ok(Ok(0)) => return Err(Ended::Eof),
                Ok(Ok(n)) => n,
                Ok(Err(e)) => return Err(Ended::Error(e.kind())),
            };
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Next frame, panicking if the stream ended.
    pub async fn frame(&mut self, limit: Duration) -> Frame {
        self.next(limit).await.unwrap_or_else(|e| panic!("stream ended ({e:?}) while a frame was expected"))
    }

    /// Next non-ping frame (pings are not answered).
    pub async fn frame_skip_pings(&mut self, limit: Duration) -> Frame {
        loop {
            let f = self.frame(limit).await;
            if f.opcode != OP_PING {
                return f;
            }
        }
    }

    /// Reads frames until a close frame and returns its code.
    pub async fn expect_close(&mut self, limit: Duration) -> u16 {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let f = self.frame(left).await;
            if f.opcode == OP_CLOSE {
                return f.close_code();
            }
        }
    }

    /// Reads until the server ends the TCP stream; returns how it ended and whatever frames
    /// arrived before.
    pub async fn until_end(&mut self, limit: Duration) -> (Ended, Vec<Frame>) {
        let end = Instant::now() + limit;
        let mut frames = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Ok(f) => frames.push(f),
                Err(e) => return (e, frames),
            }
        }
    }

    /// `sub` to `ch` and waits for `subscribed` (skipping pings).
    pub async fn subscribe(&mut self, ch: &str) -> serde_json::Value {
        self.send_json(&serde_json::json!({"op": "sub", "ch": ch})).await;
        let f = self.frame_skip_pings(STEP).await;
        let v = f.json();
        assert_eq!(v["op"], "subscribed", "reply to sub: {v}");
        v
    }
}

/// Fast extraction of `"seq":N` from a server `msg` frame without parsing the (large) data.
pub fn msg_seq(payload: &[u8]) -> u64 {
    let at = find(payload, b"\"seq\":")
        .unwrap_or_else(|| panic!("no seq in {:?}", String::from_utf8_lossy(&payload[..payload.len().min(200)])));
    payload[at + 6..].iter().take_while(|b| b.is_ascii_digit()).fold(0u64, |n, d| n * 10 + (d - b'0') as u64)
}

/// A child process (a load generator, say) SIGKILLed by its PID on drop if it still runs, so
/// a test that fails before the child reported leaves nothing behind.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
