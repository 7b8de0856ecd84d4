//! A test upstream for feeds (docs/feeds.md): a WebSocket server in the test process that
//! numbers the messages of each feed `{"seq":N,"feed":NAME,…}`, honours a resume point, can
//! drop every connection after a while, and counts the open connections per feed.
//!
//! - `ws://ADDR/q/NAME?from=N` starts after `N` (no `from`: at 1);
//! - `ws://ADDR/s/NAME` waits (at most 2 s) for a subscribe text `{"from":N}` first;
//! - each connection sends one message every `interval`, its seq one more than the last; the
//!   data of seq N of a feed is always the same text, as a real upstream replaying its log;
//! - with `drop_every`, each connection is closed (1001) that long after it opened.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

/// Per-feed connection counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Connections open now.
    pub open: usize,
    /// Most connections open at once so far.
    pub max_open: usize,
    /// Connections accepted so far.
    pub opened: usize,
}

/// The running upstream; dropping it stops accepting (open connections end with the test).
pub struct Upstream {
    pub addr: SocketAddr,
    counts: Arc<Mutex<HashMap<String, Counts>>>,
    /// `from` of each accepted connection, per feed, in order.
    resumes: Arc<Mutex<HashMap<String, Vec<u64>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The text of message `seq` of `feed`.
pub fn message(feed: &str, seq: u64) -> String {
    format!("{{\"seq\":{seq},\"feed\":\"{feed}\",\"price\":{}}}", seq * 7 % 1000)
}

impl Upstream {
    /// Waits (bounded) until feed `id` has `open` upstream connections; returns how long it took.
    pub async fn wait_open(&self, id: &str, open: usize, limit: Duration) -> Duration {
        let start = std::time::Instant::now();
        super::wait::eventually(limit, &format!("feed {id} with {open} open"), || async {
            super::wait::check(self.counts(id).open == open, || format!("{:?}", self.counts(id)))
        })
        .await;
        start.elapsed()
    }

    /// Starts on 127.0.0.1, port 0: one message per `interval` per connection, each connection
    /// closed after `drop_every` when given.
    pub async fn start(interval: Duration, drop_every: Option<Duration>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the upstream");
        let addr = listener.local_addr().expect("upstream address");
        let counts: Arc<Mutex<HashMap<String, Counts>>> = Arc::default();
        let resumes: Arc<Mutex<HashMap<String, Vec<u64>>>> = Arc::default();
        let (c, r) = (counts.clone(), resumes.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (c, r) = (c.clone(), r.clone());
                tokio::spawn(serve(stream, interval, drop_every, c, r));
            }
        });
        Upstream { addr, counts, resumes, task }
    }

    /// `ws://ADDR/q/NAME` (resume by query parameter `from`).
    pub fn url(&self, feed: &str) -> String {
        format!("ws://{}/q/{feed}", self.addr)
    }

    /// `ws://ADDR/s/NAME` (resume by a subscribe text `{"from":N}`).
    pub fn url_subscribe(&self, feed: &str) -> String {
        format!("ws://{}/s/{feed}", self.addr)
    }

    /// The counts of `feed`.
    pub fn counts(&self, feed: &str) -> Counts {
        self.counts.lock().unwrap().get(feed).copied().unwrap_or_default()
    }

    /// The resume points (`from`, 0 when none) of every connection of `feed` so far.
    pub fn resumes(&self, feed: &str) -> Vec<u64> {
        self.resumes.lock().unwrap().get(feed).cloned().unwrap_or_default()
    }
}

// The handshake callback's `Result<Response, ErrorResponse>` is tungstenite's signature.
#[allow(clippy::result_large_err)]
async fn serve(
    stream: tokio::net::TcpStream,
    interval: Duration,
    drop_every: Option<Duration>,
    counts: Arc<Mutex<HashMap<String, Counts>>>,
    resumes: Arc<Mutex<HashMap<String, Vec<u64>>>>,
) {
    let target = Arc::new(Mutex::new(String::new()));
    let t = target.clone();
    let cb = move |req: &Request, resp: Response| {
        *t.lock().unwrap() = req.uri().to_string();
        Ok(resp)
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, cb).await else { return };
    let target = target.lock().unwrap().clone();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let (by_subscribe, feed) = match (path.strip_prefix("/q/"), path.strip_prefix("/s/")) {
        (Some(f), _) => (false, f.to_owned()),
        (_, Some(f)) => (true, f.to_owned()),
        _ => return,
    };
    let mut from: u64 =
        query.split('&').find_map(|p| p.strip_prefix("from=")).and_then(|v| v.parse().ok()).unwrap_or(0);
    if by_subscribe {
        if let Ok(Some(Ok(Message::Text(t)))) = tokio::time::timeout(Duration::from_secs(2), ws.next()).await {
            let v: serde_json::Value = serde_json::from_str(&t).unwrap_or_default();
            from = v["from"].as_u64().unwrap_or(0);
        }
    }
    {
        let mut map = counts.lock().unwrap();
        let c = map.entry(feed.clone()).or_default();
        c.open += 1;
        c.opened += 1;
        c.max_open = c.max_open.max(c.open);
    }
    resumes.lock().unwrap().entry(feed.clone()).or_default().push(from);
    let until = drop_every.map(|d| tokio::time::Instant::now() + d);
    let mut tick = tokio::time::interval(interval);
    let mut seq = from;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if until.is_some_and(|u| tokio::time::Instant::now() >= u) {
                    let _ = ws.close(Some(CloseFrame { code: CloseCode::Away, reason: "upstream restart".into() })).await;
                    break;
                }
                seq += 1;
                if ws.send(Message::text(message(&feed, seq))).await.is_err() {
                    break;
                }
            }
            m = ws.next() => match m {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                _ => {}
            },
        }
    }
    counts.lock().unwrap().get_mut(&feed).expect("counted").open -= 1;
}
