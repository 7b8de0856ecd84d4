//! Publishers for the scenarios: paced, timestamped messages over `{"op":"pub"}` on a
//! WebSocket connection, over `POST /publish/{ch}` on a keep-alive HTTP/1.1 connection, or (raw
//! mode) as bare text frames to any RFC 6455 server.

use std::time::{Duration, Instant};

use super::args::{Payload, WsUrl};
use super::now_ns;
use super::tls::Transport;
use super::wire::{open, scan_str, scan_u64, SynOpts, WsConn};
use tether_proto::ws::codec::encode_client_frame;

/// How a [`publish`] run sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// tether `pub` ops; acks give the final seq per channel.
    Ws,
    /// tether `POST /publish/{ch}`; the `{"seq":N}` answers give the final seq per channel.
    Http,
    /// The stamped payload itself as a text frame (no acks, no channels).
    Raw,
}

/// What a [`publish`] run did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Messages written.
    pub sent: u64,
    /// Messages acknowledged (`ack` op or HTTP 2xx); 0 in raw mode.
    pub acked: u64,
    /// Publishes refused (`error` op or non-2xx) or left unacknowledged.
    pub errors: u64,
    /// Highest acknowledged seq per channel index (0: none).
    pub final_seqs: Vec<u64>,
    /// When the first message was stamped (ns since the UNIX epoch).
    pub start_ns: u64,
}

/// `data` for message `k`: `{"t":<ns since UNIX epoch>,"k":<k>,"p":"xx…"}` padded with `x` to
/// `size` bytes (no `p` when `size` leaves no room for it).
pub fn stamp(k: u64, size: usize) -> String {
    let mut s = format!("{{\"t\":{},\"k\":{k}", now_ns());
    // `,"p":""}` is 8 bytes.
    if size >= s.len() + 8 {
        let pad = size - s.len() - 8;
        s.push_str(",\"p\":\"");
        s.extend(std::iter::repeat_n('x', pad));
        s.push('"');
    }
    s.push('}');
    s
}

/// `data` for message `k` in the given shape (see [`Payload`]); every shape starts with the
/// stamp `{"t":<ns since UNIX epoch>,"k":<k>`.
pub fn data(payload: Payload, k: u64, size: usize) -> String {
    match payload {
        Payload::Pad => stamp(k, size),
        Payload::Book => book(k, size),
        Payload::Tick => tick(k),
    }
}

/// splitmix64: the n-th value of a fixed pseudo-random sequence (the same run to run).
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A price in cents as `"43251.50"`.
fn cents(c: u64) -> String {
    format!("{}.{:02}", c / 100, c % 100)
}

/// An order-book snapshot of about `size` bytes (at least one level a side). The levels are
/// what the top of a liquid book shows: most one tick (a cent) from the next, some 2–5 ticks,
/// with sizes random to the 4th decimal. (Until 2026-12-07 each level was 1–150 ticks from the
/// next, a book thinner than any exchange's top 20 levels; docs/benchmarks.md gives both.)
fn book(k: u64, size: usize) -> String {
    use std::fmt::Write;
    let mut r = k.wrapping_mul(0x1000);
    let mut next = || {
        r += 1;
        mix(r)
    };
    let mid = 4_300_000 + next() % 50_000;
    let mut bids = String::new();
    let mut asks = String::new();
    let (mut bid, mut ask) = (mid, mid + 1 + next() % 20);
    let base = format!(
        "{{\"t\":{},\"k\":{k},\"type\":\"book\",\"sym\":\"BTC-USD\",\"u\":{}",
        now_ns(),
        mix(k) % 1_000_000_000
    );
    while base.len() + bids.len() + asks.len() + 22 < size || bids.is_empty() {
        let sep = if bids.is_empty() { "" } else { "," };
        bid -= level_gap(next());
        ask += level_gap(next());
        let (qb, qa) = (next() % 50_000, next() % 50_000);
        let _ = write!(bids, "{sep}[\"{}\",\"{}.{:04}\"]", cents(bid), qb / 10_000, qb % 10_000);
        let _ = write!(asks, "{sep}[\"{}\",\"{}.{:04}\"]", cents(ask), qa / 10_000, qa % 10_000);
    }
    format!("{base},\"bids\":[{bids}],\"asks\":[{asks}]}}")
}

/// The ticks from one price level to the next, from a random `r`: 1 three times in four, else
/// 2–5.
fn level_gap(r: u64) -> u64 {
    if !r.is_multiple_of(4) {
        1
    } else {
        2 + (r >> 2) % 4
    }
}

/// One trade, about 120 bytes.
fn tick(k: u64) -> String {
    let r = mix(k);
    let side = if r & 1 == 0 { "buy" } else { "sell" };
    format!(
        "{{\"t\":{},\"k\":{k},\"type\":\"trade\",\"sym\":\"BTC-USD\",\"px\":\"{}\",\"qty\":\"0.{:04}\",\"side\":\"{side}\",\"id\":{}}}",
        now_ns(),
        cents(4_300_000 + (r >> 8) % 50_000),
        (r >> 32) % 10_000,
        1_000_000_000 + k
    )
}

/// Channel index of a channel named `….{index}`.
pub fn channel_index(name: &[u8]) -> Option<usize> {
    let dot = name.iter().rposition(|&b| b == b'.')?;
    std::str::from_utf8(&name[dot + 1..]).ok()?.parse().ok()
}

/// Publishes `total` messages at `rate` per second (round-robin over `channels`; `k` counts
/// from 1), each `data` of `payload`'s shape and `size` bytes ([`data`]), then waits up to
/// `ack_wait` for outstanding acks.
/// Errors: the connection could not be made or broke.
pub async fn publish(
    url: &WsUrl,
    mode: Mode,
    channels: &[String],
    rate: f64,
    total: u64,
    (payload, size): (Payload, usize),
    ack_wait: Duration,
) -> Result<Outcome, String> {
    let mut out = Outcome { final_seqs: vec![0; channels.len().max(1)], ..Outcome::default() };
    let start = Instant::now();
    out.start_ns = now_ns();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    match mode {
        Mode::Http => {
            let mut http = HttpPublisher::connect(url).await.map_err(|e| format!("publisher: {e}"))?;
            while out.sent < total {
                tick.tick().await;
                let due = due(start, rate, total);
                while out.sent < due {
                    let k = out.sent + 1;
                    let ch = (k as usize - 1) % channels.len();
                    out.sent += 1;
                    match http.post(&channels[ch], data(payload, k, size).as_bytes()).await {
                        Ok((200..=299, body)) => {
                            out.acked += 1;
                            let seq = scan_u64(&body, "seq").unwrap_or(0);
                            out.final_seqs[ch] = out.final_seqs[ch].max(seq);
                        }
                        Ok(_) => out.errors += 1,
                        Err(e) => return Err(format!("publisher: {e}")),
                    }
                }
            }
        }
        Mode::Ws | Mode::Raw => {
            let mut conn = WsConn::connect(url, None).await.map_err(|e| format!("publisher: {e}"))?;
            let mut batch = Vec::new();
            let mut refused = 0;
            let run = format!("{:08x}", rand::random::<u32>());
            loop {
                let done = out.sent >= total;
                if done && (mode == Mode::Raw || out.acked + refused >= out.sent) {
                    break;
                }
                tokio::select! {
                    biased;
                    _ = tick.tick(), if !done => {
                        batch.clear();
                        let due = due(start, rate, total);
                        while out.sent < due {
                            let k = out.sent + 1;
                            let data = data(payload, k, size);
                            let text = if mode == Mode::Raw {
                                data
                            } else {
                                let ch = &channels[(k as usize - 1) % channels.len()];
                                format!("{{\"op\":\"pub\",\"ch\":\"{ch}\",\"id\":\"{run}-{k}\",\"data\":{data}}}")
                            };
                            batch.extend_from_slice(&encode_client_frame(0x1, true, text.as_bytes(), rand::random()));
                            out.sent += 1;
                        }
                        conn.send_raw(&batch).await.map_err(|e| format!("publisher: {e}"))?;
                    }
                    r = conn.recv(|m| match scan_str(m, "op") {
                        Some(b"ack") => {
                            out.acked += 1;
                            let ch = scan_str(m, "ch").and_then(channel_index).unwrap_or(0);
                            if let (Some(slot), Some(seq)) = (out.final_seqs.get_mut(ch), scan_u64(m, "seq")) {
                                *slot = (*slot).max(seq);
                            }
                        }
                        Some(b"error") => refused += 1,
                        _ => {}
                    }) => { r.map_err(|e| format!("publisher: {e}"))?; }
                    _ = tokio::time::sleep(ack_wait), if done => break,
                }
            }
            out.errors = if mode == Mode::Raw { 0 } else { out.sent - out.acked };
        }
    }
    Ok(out)
}

/// Messages due by now: the first at once, then one every `1/rate` s, at most `total`.
fn due(start: Instant, rate: f64, total: u64) -> u64 {
    ((start.elapsed().as_secs_f64() * rate) as u64 + 1).min(total)
}

/// One keep-alive HTTP/1.1 connection for `POST /publish/{ch}` (docs/http.md).
pub struct HttpPublisher {
    stream: Transport,
    host: String,
    buf: Vec<u8>,
}

impl HttpPublisher {
    /// Opens the connection to `url`'s address (TLS for `wss://` / `https://`).
    pub async fn connect(url: &WsUrl) -> std::io::Result<Self> {
        let stream = open(url, None, SynOpts::default()).await?;
        Ok(HttpPublisher { stream, host: url.host.clone(), buf: Vec::with_capacity(1024) })
    }

    /// Sends one publish and returns (status, body). Errors: I/O, or a response that is not
    /// HTTP/1.1 with a `Content-Length` within 1 MiB.
    pub async fn post(&mut self, channel: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let head = format!(
            "POST /publish/{channel} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let mut req = Vec::with_capacity(head.len() + body.len());
        req.extend_from_slice(head.as_bytes());
        req.extend_from_slice(body);
        self.stream.write_all(&req).await?;
        let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string());
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            if let Ok(httparse::Status::Complete(head_len)) = resp.parse(&self.buf) {
                let code = resp.code.unwrap_or(0);
                let len = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse::<usize>().ok())
                    .ok_or_else(|| bad("response without Content-Length"))?;
                if len > 1 << 20 {
                    return Err(bad("response body over 1 MiB"));
                }
                if self.buf.len() >= head_len + len {
                    let body = self.buf[head_len..head_len + len].to_vec();
                    self.buf.drain(..head_len + len);
                    return Ok((code, body));
                }
            } else if self.buf.len() > 64 * 1024 {
                return Err(bad("unparsable response"));
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}
