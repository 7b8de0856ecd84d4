//! A raw Server-Sent Events reader for the tests (WHATWG HTML §9.2.6, the event stream
//! interpretation): a `GET /sse…` request on a plain socket, the response head, then events
//! as EventSource would dispatch them (`event`, `id`, `data` lines joined with LF; comment
//! lines counted). Every read is bounded.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `event:` (EventSource's default `message` when absent).
    pub name: String,
    /// `id:` when the event set one.
    pub id: Option<String>,
    /// The `data:` lines joined with LF.
    pub data: String,
    /// `retry:` when the event block set one.
    pub retry: Option<u64>,
}

impl Event {
    /// `data` as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("event data is not JSON ({e}): {:?}", self.data))
    }
}

/// The names and ids of `evs` (what a failure message shows instead of whole payloads).
pub fn summary(evs: &[Event]) -> Vec<(String, Option<String>)> {
    evs.iter().map(|e| (e.name.clone(), e.id.clone())).collect()
}

/// An open stream (or a refused request: see `status`).
pub struct SseReader {
    pub s: TcpStream,
    /// The response status.
    pub status: u16,
    /// The response head.
    pub head: String,
    buf: Vec<u8>,
    /// Comment lines (heartbeats) seen so far.
    pub comments: usize,
    /// The peer closed the stream.
    pub ended: bool,
}

/// The request head of `GET target` with `headers`.
pub fn request(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> String {
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req
}

impl SseReader {
    /// Sends `GET target` with `headers` and reads the response head (bounded by 5 s).
    pub async fn open(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> SseReader {
        SseReader::open_on(super::connect(addr).await, addr, target, headers).await
    }

    /// [`SseReader::open`] on a socket the caller connected (e.g. with a small receive buffer).
    pub async fn open_on(mut s: TcpStream, addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> SseReader {
        s.write_all(request(addr, target, headers).as_bytes()).await.expect("send the request");
        let (status, head, rest) = super::read_head(&mut s).await;
        SseReader { s, status, head, buf: rest, comments: 0, ended: false }
    }

    /// The body of a refused request (its `Content-Length`), as text.
    pub async fn body(&mut self) -> String {
        let len: usize = super::header(&self.head, "content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let end = Instant::now() + Duration::from_secs(5);
        while self.buf.len() < len && self.fill(end).await {}
        String::from_utf8_lossy(&self.buf[..len.min(self.buf.len())]).into_owned()
    }

    /// Reads more bytes before `end`; false at EOF (or an error, or the bound).
    async fn fill(&mut self, end: Instant) -> bool {
        let mut chunk = [0u8; 16384];
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                self.ended = true;
                false
            }
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(_) => false,
        }
    }

    /// The next event within `limit`: `None` when the stream ended first; panics when the
    /// bound passes with the stream still open (naming what was buffered).
    pub async fn next(&mut self, limit: Duration) -> Option<Event> {
        let end = Instant::now() + limit;
        loop {
            if let Some(ev) = self.take_event() {
                return Some(ev);
            }
            if self.ended {
                return None;
            }
            if !self.fill(end).await && !self.ended {
                let tail = &self.buf[self.buf.len().saturating_sub(300)..];
                panic!(
                    "no event within {limit:?}; {} bytes buffered, ending {:?}",
                    self.buf.len(),
                    String::from_utf8_lossy(tail)
                );
            }
        }
    }

    /// Events until `n` of them are named `name` (the others kept in the result too), within
    /// `limit` in all.
    pub async fn collect(&mut self, name: &str, n: usize, limit: Duration) -> Vec<Event> {
        let end = Instant::now() + limit;
        let mut out = Vec::new();
        while out.iter().filter(|e: &&Event| e.name == name).count() < n {
            let left = end.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(ev) => out.push(ev),
                None => panic!("the stream ended after {:?}", summary(&out)),
            }
        }
        out
    }

    /// Waits (bounded) until the server ends the stream; returns the events before the end.
    pub async fn until_end(&mut self, limit: Duration) -> Vec<Event> {
        let end = Instant::now() + limit;
        let mut out = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "the stream did not end within {limit:?}; saw {:?}", summary(&out));
            match self.next(left).await {
                Some(ev) => out.push(ev),
                None => return out,
            }
        }
    }

    /// Waits (bounded) until `n` comment lines have arrived in all.
    pub async fn wait_comments(&mut self, n: usize, limit: Duration) {
        let end = Instant::now() + limit;
        while self.comments < n {
            while self.take_event().is_some() {}
            if self.comments >= n {
                break;
            }
            assert!(Instant::now() < end && !self.ended, "{} comment lines within {limit:?}", self.comments);
            self.fill(end).await;
        }
    }

    /// Parses one complete event block out of the buffer (comment-only blocks are counted and
    /// skipped).
    fn take_event(&mut self) -> Option<Event> {
        loop {
            // Comment lines are dispatched as they come, with no blank line after them.
            while self.buf.first() == Some(&b':') {
                let nl = self.buf.iter().position(|&b| b == b'\n')?;
                self.comments += 1;
                self.buf.drain(..=nl);
            }
            let end = super::find(&self.buf, b"\n\n")?;
            let block = String::from_utf8(self.buf[..end].to_vec()).expect("UTF-8 stream");
            self.buf.drain(..end + 2);
            let mut ev = Event { name: "message".into(), id: None, data: String::new(), retry: None };
            let mut data: Vec<&str> = Vec::new();
            for line in block.split('\n') {
                if line.starts_with(':') {
                    self.comments += 1;
                    continue;
                }
                let (field, value) =
                    line.split_once(':').map_or((line, ""), |(f, v)| (f, v.strip_prefix(' ').unwrap_or(v)));
                match field {
                    "event" => ev.name = value.into(),
                    "id" => ev.id = Some(value.into()),
                    "data" => data.push(value),
                    "retry" => ev.retry = value.parse().ok(),
                    _ => {}
                }
            }
            ev.data = data.join("\n");
            if data.is_empty() && ev.retry.is_none() {
                continue;
            }
            return Some(ev);
        }
    }
}
