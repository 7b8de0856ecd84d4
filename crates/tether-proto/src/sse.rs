//! Server-Sent Events (WHATWG HTML §9.2, "Server-sent events"): the wire form of tether's
//! pub/sub stream on `GET /sse` (docs/protocol.md, "Server-Sent Events").
//!
//! Each message is one event: `event: msg`, `id: <ch>:<epoch>:<seq>`, `data:` the JSON object
//! a WebSocket `msg` frame carries, then a blank line. A typed reset is `event: reset`, a
//! refused request `event: error`, the end of the stream `event: close`, each with the same
//! JSON as its WebSocket counterpart. Heartbeats are comment lines (`:`), which EventSource
//! ignores and which keep proxies from cutting an idle response.
//!
//! Everything here is bytes in, bytes out: the session and the server decide when to send.
//! A message's event is encoded once and shared by every SSE subscriber, as its WebSocket frame
//! is; history (stored as WebSocket frames) is converted here when it is replayed.

use bytes::Bytes;

use crate::protocol::close::CloseCode;
use crate::protocol::{push_json_str, push_u64, valid_channel};

/// A heartbeat: one comment line (§9.2.6: a line starting with `:` is ignored). 2 bytes on
/// the wire, sent at `heartbeat.ping_interval_ms` where a WebSocket gets a ping.
pub static HEARTBEAT: Bytes = Bytes::from_static(b":\n");

/// The longest `Last-Event-ID` (or `from=` value) accepted, in bytes: a channel name (at most
/// 128 bytes), an epoch (at most 64 bytes), a seq (at most 20 digits) and two colons, with
/// room to spare. Longer is refused with 400 before anything is allocated for it.
pub const MAX_EVENT_ID_BYTES: usize = 256;

/// The longest epoch a position may carry, in bytes (the memory broker's are 16 hex digits).
pub const MAX_EPOCH_BYTES: usize = 64;

/// The least `retry:` sent at the end of a stream, in milliseconds: EventSource keeps the last
/// `retry:` for all later reconnects, including those that fail while a restarted server is
/// not yet listening, so a value near 0 would make every browser spin on connection refusals.
pub const RETRY_FLOOR_MS: u64 = 1000;

/// The head of the `200 OK` that starts a stream (RFC 9112; WHATWG HTML §9.2.3).
///
/// No `Content-Length` and no `Transfer-Encoding`: the body is delimited by the end of the
/// connection (RFC 9112 §6.3, rule 8), and `Connection: close` says so. The stream never ends
/// on its own, so chunked framing would add bytes to every event and say nothing a proxy
/// needs; EventSource, `curl -N` and HTTP/1.1 proxies read a close-delimited body as it comes.
/// `Cache-Control: no-cache` keeps caches from storing it, `X-Accel-Buffering: no` tells
/// nginx not to buffer it. With `origin` (the request's `Origin`, already admitted by the
/// server's allow-list) it carries `Access-Control-Allow-Origin` naming it and
/// `Vary: Origin`: a page's EventSource on another origin makes a CORS request (Fetch §3.2;
/// no preflight: EventSource sets no header of its own choosing but `Last-Event-ID`).
pub fn response_head(origin: Option<&str>) -> Vec<u8> {
    let mut headers = vec![("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no")];
    if let Some(o) = origin {
        headers.push(("Access-Control-Allow-Origin", o));
        headers.push(("Vary", "Origin"));
    }
    crate::http::stream_head(crate::http::StatusCode::OK, "text/event-stream", &headers)
}

/// Appends `data:` lines holding `json`, then the blank line that dispatches the event.
/// JSON strings hold no raw line breaks, but the whitespace between tokens may (a publisher's
/// pretty-printed `data`): each CR, LF or CRLF starts a new `data:` line, and EventSource joins
/// them with LF (§9.2.6), which is JSON whitespace again.
fn push_data(out: &mut Vec<u8>, json: &[u8]) {
    out.extend_from_slice(b"data: ");
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'\r' => {
                out.extend_from_slice(b"\ndata: ");
                if json.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
            }
            b'\n' => out.extend_from_slice(b"\ndata: "),
            b => out.push(b),
        }
        i += 1;
    }
    out.extend_from_slice(b"\n\n");
}

/// An event named `name` without an id: `event: NAME`, the `data:` lines of `json`, a blank
/// line.
pub fn event(name: &str, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(16 + name.len() + json.len());
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.push(b'\n');
    push_data(&mut out, json);
    Bytes::from(out)
}

/// The event of message `seq` of `ch` under `epoch`: `event: msg`, `id: CH:EPOCH:SEQ` and
/// `data:` the `msg` object `json` (`{"op":"msg","ch":…,"seq":…,"data":…}`).
pub fn msg_event(ch: &str, epoch: &str, seq: u64, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(40 + ch.len() + epoch.len() + json.len());
    out.extend_from_slice(b"event: msg\nid: ");
    push_position(&mut out, ch, epoch, seq);
    push_data(&mut out, json);
    Bytes::from(out)
}

/// The `ch` and `seq` of a `msg` object as [`crate::protocol::msg_frame`] writes it
/// (`{"op":"msg","ch":"CH","seq":SEQ,…`); `None` for any other object.
fn msg_position(json: &[u8]) -> Option<(&str, u64)> {
    let rest = json.strip_prefix(b"{\"op\":\"msg\",\"ch\":\"")?;
    let end = rest.iter().position(|&b| b == b'"')?;
    let ch = std::str::from_utf8(&rest[..end]).ok().filter(|c| valid_channel(c))?;
    let digits = rest[end..].strip_prefix(b"\",\"seq\":")?;
    let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    let seq = std::str::from_utf8(&digits[..n]).ok()?.parse().ok()?;
    Some((ch, seq))
}

/// The event of a `msg` WebSocket frame (a live delivery or a history frame being replayed)
/// under `epoch`; `None` when `frame` is not a `msg` frame.
pub fn msg_from_frame(frame: &[u8], epoch: &str) -> Option<Bytes> {
    let json = crate::ws::codec::text_payload(frame)?;
    let (ch, seq) = msg_position(json)?;
    Some(msg_event(ch, epoch, seq, json))
}

/// The event a WebSocket reply frame becomes on an SSE stream: `subscribed`, `reset` and
/// `error` (refusals, `token_expired`) keep their JSON under `event: subscribed` /
/// `event: reset` / `event: error` (a reset with the id of the position it leaves,
/// [`reset_event`]; `subscribed` without one: during a resume replay its `seq` is ahead of what
/// the client has); everything else (`unsubscribed`, `ack`, presence, control frames) answers
/// requests an SSE client cannot send and is dropped (`None`).
pub fn from_reply(frame: &[u8]) -> Option<Bytes> {
    let json = crate::ws::codec::text_payload(frame)?;
    let op = json.strip_prefix(b"{\"op\":\"")?;
    if op.starts_with(b"reset\"") {
        Some(reset_event(json))
    } else if op.starts_with(b"error\"") {
        Some(event("error", json))
    } else if op.starts_with(b"subscribed\"") {
        Some(event("subscribed", json))
    } else {
        None
    }
}

/// `event: reset` with the `reset` object `json`, and the id of the position it leaves the
/// client at (`id: CH:EPOCH:SEQ`, the new epoch and `reset.seq`: messages continue after it),
/// so an EventSource that reconnects before the next message resumes from there and not from
/// the position the reset replaced. Without an id when `json` lacks those fields.
pub fn reset_event(json: &[u8]) -> Bytes {
    #[derive(serde::Deserialize)]
    struct Reset<'a> {
        ch: &'a str,
        seq: u64,
        epoch: &'a str,
    }
    let Ok(r) = serde_json::from_slice::<Reset>(json) else { return event("reset", json) };
    let mut out = Vec::with_capacity(40 + r.ch.len() + r.epoch.len() + json.len());
    out.extend_from_slice(b"event: reset\nid: ");
    push_position(&mut out, r.ch, r.epoch, r.seq);
    push_data(&mut out, json);
    Bytes::from(out)
}

/// `CH:EPOCH:SEQ` and a line end.
fn push_position(out: &mut Vec<u8>, ch: &str, epoch: &str, seq: u64) {
    out.extend_from_slice(ch.as_bytes());
    out.push(b':');
    out.extend_from_slice(epoch.as_bytes());
    out.push(b':');
    push_u64(out, seq);
    out.push(b'\n');
}

/// The last bytes of a stream the server ends: `event: close` with
/// `{"op":"close","code":CODE,"reason":REASON}` (the WebSocket close code and reason the same
/// end would have had, e.g. 1012 and `{"reason":"restart","retry_after_ms":N}`), then
/// `retry: MS` when `retry_ms` is given, which sets how long EventSource waits before it
/// reconnects (§9.2.6, at least [`RETRY_FLOOR_MS`]).
pub fn close_event(code: CloseCode, reason: &str, retry_ms: Option<u64>) -> Bytes {
    let mut json = Vec::with_capacity(40 + reason.len());
    json.extend_from_slice(b"{\"op\":\"close\",\"code\":");
    push_u64(&mut json, u64::from(u16::from(code)));
    json.extend_from_slice(b",\"reason\":");
    push_json_str(&mut json, reason);
    json.push(b'}');
    let mut out = event("close", &json).to_vec();
    if let Some(ms) = retry_ms {
        out.extend_from_slice(b"retry: ");
        push_u64(&mut out, ms.max(RETRY_FLOOR_MS));
        out.extend_from_slice(b"\n\n");
    }
    Bytes::from(out)
}

/// A position in a channel, as an event id carries it (`id: CH:EPOCH:SEQ`) and as a client
/// sends it back (`Last-Event-ID`, or `from=CH:EPOCH:SEQ` in the query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// Channel name (1–128 bytes of `[A-Za-z0-9._:-]`; it may itself hold colons).
    pub ch: String,
    /// The epoch the seq belongs to (opaque, as the server sent it); empty for a position
    /// without one (`from=ch::12`, a `sub` with `from` and no `epoch`).
    pub epoch: String,
    /// The last seq the client has.
    pub seq: u64,
}

impl Position {
    /// Parses `CH:EPOCH:SEQ`, splitting at the last two colons (a channel name may hold
    /// colons, an epoch holds none).
    ///
    /// # Errors
    /// A short reason, for a 400: longer than [`MAX_EVENT_ID_BYTES`], not three parts, an
    /// invalid channel name, an over-long epoch (more than [`MAX_EPOCH_BYTES`], or with
    /// characters outside `[A-Za-z0-9._-]`), or a seq that is not a decimal `u64`.
    pub fn parse(s: &str) -> Result<Position, &'static str> {
        if s.len() > MAX_EVENT_ID_BYTES {
            return Err("longer than 256 bytes");
        }
        let mut parts = s.rsplitn(3, ':');
        let (Some(seq), Some(epoch), Some(ch)) = (parts.next(), parts.next(), parts.next()) else {
            return Err("not of the form <channel>:<epoch>:<seq>");
        };
        if !valid_channel(ch) {
            return Err("invalid channel name");
        }
        let epoch_ok = |e: &str| {
            e.len() <= MAX_EPOCH_BYTES
                && e.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        };
        if !epoch_ok(epoch) {
            return Err("invalid epoch");
        }
        if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return Err("seq is not a decimal number");
        }
        let seq = seq.parse().map_err(|_| "seq is out of range")?;
        Ok(Position { ch: ch.to_owned(), epoch: epoch.to_owned(), seq })
    }
}

/// Whether an `Accept` header admits `text/event-stream` (RFC 9110 §12.5.1): absent, or a
/// media range `text/event-stream`, `text/*` or `*/*` without `q=0`. `curl` sends `*/*`,
/// EventSource `text/event-stream`.
pub fn accepts_event_stream(accept: Option<&str>) -> bool {
    let Some(accept) = accept else { return true };
    accept.split(',').any(|range| {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        let matches = ["text/event-stream", "text/*", "*/*"].iter().any(|m| media.eq_ignore_ascii_case(m));
        let refused = parts.any(|p| {
            p.split_once('=').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("q") && v.trim().parse::<f32>().is_ok_and(|q| q == 0.0)
            })
        });
        matches && !refused
    })
}

/// The subscriptions a `GET /sse` request asks for, in the order of its `ch` parameters: each
/// channel with the position to resume after, if any.
///
/// `query` is the request's query string (`ch=a&ch=b&from=b:E:7`, parameters decoded as
/// forms are), `last_event_id` its `Last-Event-ID` header. A channel's position comes from
/// `Last-Event-ID` when that names it (the browser's latest), else from its `from=` parameter;
/// without either the subscription is live. An empty `Last-Event-ID` counts as absent.
///
/// # Errors
/// The reason for a 400, naming what is wrong: no `ch`, more than `max` channels (the
/// per-connection `max_subscriptions`), a channel named twice or not valid, a `from=` or
/// `Last-Event-ID` that does not parse ([`Position::parse`]) or names a channel the request
/// does not subscribe to, two `from=` for one channel.
pub fn subscriptions(
    query: Option<&str>,
    last_event_id: Option<&str>,
    max: usize,
) -> Result<Vec<(String, Option<Position>)>, String> {
    let query = query.unwrap_or("");
    let mut subs: Vec<(String, Option<Position>)> = Vec::new();
    for ch in crate::http::query_values(query, "ch") {
        let Some(ch) = ch.filter(|c| valid_channel(c)) else {
            return Err("invalid channel name in ch: 1-128 bytes of [A-Za-z0-9._:-]".into());
        };
        if subs.iter().any(|(c, _)| *c == ch) {
            return Err(format!("channel {ch} is named twice in ch"));
        }
        if subs.len() == max {
            return Err(format!("more than max_subscriptions ({max}) channels in ch"));
        }
        subs.push((ch, None));
    }
    if subs.is_empty() {
        return Err("no channel: add ch=<channel> to the query (several allowed)".into());
    }
    let mut place = |p: Position, what: &str, replace: bool| -> Result<(), String> {
        let Some(slot) = subs.iter_mut().find(|(c, _)| *c == p.ch) else {
            return Err(format!("{what} names channel {}, which is not in ch", p.ch));
        };
        if slot.1.is_some() && !replace {
            return Err(format!("two positions for channel {} in from", p.ch));
        }
        slot.1 = Some(p);
        Ok(())
    };
    for from in crate::http::query_values(query, "from") {
        let p = from.as_deref().ok_or("from does not decode").and_then(Position::parse);
        place(p.map_err(|e| format!("from: {e}"))?, "from", false)?;
    }
    if let Some(id) = last_event_id.map(str::trim).filter(|id| !id.is_empty()) {
        let p = Position::parse(id).map_err(|e| format!("Last-Event-ID: {e}"))?;
        place(p, "Last-Event-ID", true)?;
    }
    Ok(subs)
}

#[cfg(test)]
mod tests;
