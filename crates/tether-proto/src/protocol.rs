//! The pub/sub wire protocol v1 (docs/protocol.md), sans-IO: client text messages in, server JSON
//! texts (and the shared `msg` frame) out.
//!
//! Every server → client text is one compact JSON object with an `op` field and no trailing
//! newline. Strings that come from peers (ids, epochs, reasons) are escaped with `serde_json`;
//! channel names are validated before they get here ([`valid_channel`]) and are written raw
//! when valid. `data` is raw JSON text, inserted verbatim: it was validated and compacted once
//! on the way in ([`parse_client_op`], [`parse_publish_body`]).

pub mod backoff;
pub mod close;
pub mod presence;
mod replies;

pub use replies::*;

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// Longest channel name in bytes (docs/protocol.md, channel names).
pub const MAX_CHANNEL_BYTES: usize = 128;
/// Longest publish id (`pub.id`, `Idempotency-Key`) in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// The most bytes a `msg` frame ([`msg_frame`]) adds to its `data`: the envelope
/// `{"op":"msg","ch":"…","seq":…,"data":…}` with a 128-byte channel name and a 20-digit seq
/// (183 bytes) plus the longest frame header (10 bytes). A message whose `data` is `n` bytes
/// occupies at most `n + MSG_FRAME_OVERHEAD` bytes of a subscriber's outbound queue, which is
/// what config validation checks `limits.queue_max_bytes` against.
pub const MSG_FRAME_OVERHEAD: usize = 193;

/// The `code` tokens of `error` replies. Stable: clients match on them.
pub mod codes {
    /// The message is not valid JSON (or not UTF-8).
    pub const BAD_JSON: &str = "bad_json";
    /// `op` is missing, not a string, or not one of `sub`, `unsub`, `pub`, `refresh`,
    /// `presence`, `presence_stats`; also a
    /// `refresh` on a server without JWT auth (`[auth]` off: there is no token to replace).
    pub const BAD_OP: &str = "bad_op";
    /// The message is not a JSON object, or a field is missing or has the wrong type or size.
    pub const BAD_REQUEST: &str = "bad_request";
    /// `ch` is not 1–128 bytes of `[A-Za-z0-9._:-]`.
    pub const BAD_CHANNEL: &str = "bad_channel";
    /// The request exceeds a size limit (e.g. a publish larger than the channel allows).
    pub const TOO_LARGE: &str = "too_large";
    /// The request is well-formed but refused by policy (auth, rate limit).
    pub const NOT_ALLOWED: &str = "not_allowed";
    /// `sub` for a channel this connection is already subscribed to (or subscribing).
    pub const ALREADY_SUBSCRIBED: &str = "already_subscribed";
    /// `unsub` for a channel this connection is not subscribed to.
    pub const NOT_SUBSCRIBED: &str = "not_subscribed";
    /// The broker cannot serve the request now (Redis unreachable); the `error` carries
    /// `retry_after_ms`, and retrying the same request (same `id`) later is safe. A publish
    /// refused so was certainly not stored (else the answer is [`UNKNOWN_OUTCOME`]).
    pub const UNAVAILABLE: &str = "unavailable";
    /// The request went to the broker (Redis) and no answer came in time, or the connection
    /// failed while it was out: it may or may not have taken effect. The `error` carries
    /// `retry_after_ms`; retry the same request with the same `id` (dedup makes the retry
    /// safe: a publish stored meanwhile is answered with its original seq). HTTP: 504 with
    /// `"outcome":"unknown"` (docs/redis.md, "Failures and what each answer means").
    pub const UNKNOWN_OUTCOME: &str = "unknown_outcome";
    /// `sub` or `pub` on a channel the connection's token does not allow (its `channels.sub`
    /// / `channels.pub` globs, docs/security.md); the connection stays.
    pub const FORBIDDEN: &str = "forbidden";
    /// The connection's token reached its `exp`: send `{"op":"refresh","token":…}` within
    /// `auth.token_refresh_grace_ms`, or the connection is closed with 4001.
    pub const TOKEN_EXPIRED: &str = "token_expired";
    /// A per-connection or process limit refused the request (`limits.per_connection`,
    /// `limits.max_channels`, docs/security.md); rate limits and `max_channels` add
    /// `retry_after_ms`. The connection stays (a client that goes on far past a rate is closed
    /// with 1008).
    pub const LIMIT: &str = "limit";
    /// A feed's publish carried a fencing token lower than the highest the broker has seen
    /// for that feed: the lease passed to another owner, and this publish was not stored (no
    /// seq, no dedup record). Never retried: it carries no `retry_after_ms` (docs/feeds.md
    /// "Fencing"). Only feed runners publish with a fence, so no client receives it.
    pub const FENCED: &str = "fenced";
    /// `presence`, `presence_stats` or `sub` with `join_leave` on a channel whose
    /// `[[channels]]` rule has no `presence = true` (or no `join_leave = true`).
    pub const PRESENCE_OFF: &str = "presence_off";
}

/// One client → server request (docs/protocol.md).
#[derive(Debug)]
pub enum ClientOp {
    /// Subscribe to `ch`; with `from`, resume after that seq (the last one the client
    /// processed) if `epoch` still matches.
    Sub {
        /// Channel name (validated).
        ch: String,
        /// The last seq the client processed.
        from: Option<u64>,
        /// The epoch `from` belongs to, echoed unchanged.
        epoch: Option<String>,
        /// `join_leave: true`: also receive the channel's coalesced `presence_diff` (and
        /// `presence_reset`) frames (docs/protocol.md, "Presence").
        join_leave: bool,
    },
    /// Unsubscribe from `ch`.
    Unsub {
        /// Channel name (validated).
        ch: String,
    },
    /// Publish `data` (compact JSON text) to `ch`; `id` is the client's dedup key.
    Pub {
        /// Channel name (validated).
        ch: String,
        /// The client's message id, 1–128 bytes.
        id: String,
        /// The message, compact JSON.
        data: Box<RawValue>,
    },
    /// Who is in `ch` (docs/protocol.md, "Presence"): one page of members, from after `cursor`
    /// (the `next` of the previous page) when given.
    Presence {
        /// Channel name (validated).
        ch: String,
        /// Where the previous page ended (opaque, at most [`MAX_ID_BYTES`] bytes).
        cursor: Option<String>,
    },
    /// How many connections and distinct users are in `ch`.
    PresenceStats {
        /// Channel name (validated).
        ch: String,
    },
    /// Replace the connection's token (docs/security.md, expiry and refresh).
    Refresh {
        /// The new JWT (compact serialization), not yet verified.
        token: String,
    },
}

/// A refused request; becomes an `error` reply via [`RequestError::to_json`].
///
/// `code` is one of [`codes`]; `reason` is for humans; `id` is the request's `id` when it
/// could be read (a string of at most [`MAX_ID_BYTES`]), so the client can match the refusal
/// to its publish; `ch` likewise the request's channel (a string of at most
/// [`MAX_CHANNEL_BYTES`], valid or not), so a refused `sub` or `pub` names its channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    /// One of [`codes`].
    pub code: &'static str,
    /// For humans.
    pub reason: String,
    /// The request's `id`, when it could be read.
    pub id: Option<String>,
    /// The request's `ch`, when it could be read (set by [`parse_client_op`] only).
    pub ch: Option<String>,
    /// For a refusal that a later retry can overcome ([`codes::UNAVAILABLE`],
    /// [`codes::UNKNOWN_OUTCOME`], a [`codes::LIMIT`] of a rate or of `max_channels`): how
    /// long to wait first, in milliseconds.
    pub retry_after_ms: Option<u64>,
}

impl RequestError {
    fn new(code: &'static str, reason: impl Into<String>) -> Self {
        Self { code, reason: reason.into(), id: None, ch: None, retry_after_ms: None }
    }

    /// A [`codes::UNAVAILABLE`] refusal: retry after `retry_after_ms` milliseconds.
    pub fn unavailable(reason: impl Into<String>, retry_after_ms: u64) -> Self {
        Self {
            code: codes::UNAVAILABLE,
            reason: reason.into(),
            id: None,
            ch: None,
            retry_after_ms: Some(retry_after_ms),
        }
    }

    /// A [`codes::UNKNOWN_OUTCOME`] answer: the request may or may not have taken effect;
    /// retry it (same `id`) after `retry_after_ms` milliseconds.
    pub fn unknown_outcome(reason: impl Into<String>, retry_after_ms: u64) -> Self {
        Self {
            code: codes::UNKNOWN_OUTCOME,
            reason: reason.into(),
            id: None,
            ch: None,
            retry_after_ms: Some(retry_after_ms),
        }
    }

    /// A [`codes::FENCED`] refusal of a publish for `feed` with the stale fencing `token`
    /// (lower than `highest`, the highest seen for `feed`); never with `retry_after_ms`.
    pub fn fenced(feed: &str, token: u64, highest: u64) -> Self {
        Self::new(codes::FENCED, format!("feed {feed}: fencing token {token} is below {highest}"))
    }

    /// A [`codes::LIMIT`] refusal; `retry_after_ms` (milliseconds) when waiting can help.
    pub fn limit(reason: impl Into<String>, retry_after_ms: Option<u64>) -> Self {
        Self { code: codes::LIMIT, reason: reason.into(), id: None, ch: None, retry_after_ms }
    }

    /// The `error` reply for this refusal ([`error_json`], plus `retry_after_ms` and `ch`
    /// when set).
    pub fn to_json(&self) -> Vec<u8> {
        let json = error_json_retry(self.code, &self.reason, self.id.as_deref(), self.retry_after_ms);
        match &self.ch {
            Some(ch) => with_channel(json, ch),
            None => json,
        }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.reason)
    }
}

impl std::error::Error for RequestError {}

/// The fields tether reads, each kept as raw JSON so a wrong type is reported per field
/// (`bad_request`) rather than as unparseable JSON. Unknown fields are ignored.
#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    op: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    ch: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    from: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    epoch: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    data: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    token: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    join_leave: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    cursor: Option<&'a RawValue>,
}

/// Keeps an explicit `null` as `Some("null")`: `data: null` is a publishable value.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// Parses one client text message (docs/protocol.md).
///
/// Errors, checked in this order:
/// - `bad_json`: not valid JSON;
/// - `bad_request`: not a JSON object, or a field repeated;
/// - `bad_op`: `op` missing, not a string, or unknown;
/// - `refresh`: `bad_request` when `token` is missing, not a string or empty (no `ch`);
/// - `bad_request`: `ch` missing or not a string; `bad_channel`: `ch` not a valid name;
/// - `sub`: `bad_request` when `from` is not a non-negative integer, `epoch` not a string or
///   `join_leave` not a boolean (`null` counts as absent for all three);
/// - `presence`: `bad_request` when `cursor` is not a string of at most [`MAX_ID_BYTES`]
///   (`null` counts as absent);
/// - `pub`: `bad_request` when `id` is missing, not a string, empty or longer than
///   [`MAX_ID_BYTES`], or `data` is missing (`null` is valid data).
///
/// The `id` field, when it is a string of at most [`MAX_ID_BYTES`], is copied into every error,
/// and so is the `ch` field when it is a string of at most [`MAX_CHANNEL_BYTES`] (also when it
/// is not a valid name: the `bad_channel` answer repeats what it refuses).
/// `data` is returned compacted ([`compact_json`]), so it can be framed verbatim.
pub fn parse_client_op(text: &[u8]) -> Result<ClientOp, RequestError> {
    let first = text.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(match serde_json::from_slice::<serde::de::IgnoredAny>(text) {
            Ok(_) => RequestError::new(codes::BAD_REQUEST, "message must be a JSON object"),
            Err(e) => RequestError::new(codes::BAD_JSON, format!("invalid JSON: {e}")),
        });
    }
    let fields: Fields<'_> = serde_json::from_slice(text).map_err(|e| match e.classify() {
        // A repeated field is found as it is read, before a syntax error further on: text
        // that is not JSON at all is still `bad_json`, which is checked first.
        serde_json::error::Category::Data => match serde_json::from_slice::<serde::de::IgnoredAny>(text) {
            Ok(_) => RequestError::new(codes::BAD_REQUEST, format!("bad message: {e}")),
            Err(syntax) => RequestError::new(codes::BAD_JSON, format!("invalid JSON: {syntax}")),
        },
        _ => RequestError::new(codes::BAD_JSON, format!("invalid JSON: {e}")),
    })?;
    let id = fields.id.and_then(json_str);
    let echo_id = id.as_ref().filter(|id| id.len() <= MAX_ID_BYTES).map(|id| id.to_string());
    let echo_ch = fields.ch.and_then(json_str).filter(|ch| ch.len() <= MAX_CHANNEL_BYTES).map(Cow::into_owned);
    parse_fields(&fields, id).map_err(|mut e| {
        e.id = echo_id;
        e.ch = echo_ch;
        e
    })
}

fn parse_fields(f: &Fields<'_>, id: Option<Cow<'_, str>>) -> Result<ClientOp, RequestError> {
    let op_raw = f.op.ok_or_else(|| RequestError::new(codes::BAD_OP, "missing op"))?;
    let op = json_str(op_raw).ok_or_else(|| RequestError::new(codes::BAD_OP, "op must be a string"))?;
    if !matches!(op.as_ref(), "sub" | "unsub" | "pub" | "refresh" | "presence" | "presence_stats") {
        const KNOWN: &str = "expected sub, unsub, pub, refresh, presence or presence_stats";
        let reason =
            if op.len() <= 32 { format!("unknown op \"{op}\"; {KNOWN}") } else { format!("unknown op; {KNOWN}") };
        return Err(RequestError::new(codes::BAD_OP, reason));
    }
    if op == "refresh" {
        let bad = || RequestError::new(codes::BAD_REQUEST, "refresh needs token: a non-empty string");
        let token = f.token.and_then(json_str).filter(|t| !t.is_empty()).ok_or_else(bad)?;
        return Ok(ClientOp::Refresh { token: token.into_owned() });
    }
    let ch = f.ch.ok_or_else(|| RequestError::new(codes::BAD_REQUEST, "missing ch"))?;
    let ch = json_str(ch).ok_or_else(|| RequestError::new(codes::BAD_REQUEST, "ch must be a string"))?;
    if !valid_channel(&ch) {
        return Err(RequestError::new(codes::BAD_CHANNEL, BAD_CHANNEL_REASON));
    }
    let ch = ch.into_owned();
    match op.as_ref() {
        "sub" => {
            let from = match not_null(f.from) {
                None => None,
                Some(raw) => Some(
                    serde_json::from_str::<u64>(raw.get())
                        .map_err(|_| RequestError::new(codes::BAD_REQUEST, "from must be a non-negative integer"))?,
                ),
            };
            let epoch = match not_null(f.epoch) {
                None => None,
                Some(raw) => Some(
                    json_str(raw)
                        .ok_or_else(|| RequestError::new(codes::BAD_REQUEST, "epoch must be a string"))?
                        .into_owned(),
                ),
            };
            let join_leave = match not_null(f.join_leave).map(|raw| raw.get()) {
                None | Some("false") => false,
                Some("true") => true,
                Some(_) => return Err(RequestError::new(codes::BAD_REQUEST, "join_leave must be a boolean")),
            };
            Ok(ClientOp::Sub { ch, from, epoch, join_leave })
        }
        "unsub" => Ok(ClientOp::Unsub { ch }),
        "presence" => {
            let bad = || RequestError::new(codes::BAD_REQUEST, "cursor must be a string of at most 128 bytes");
            let cursor = match not_null(f.cursor) {
                None => None,
                Some(raw) => Some(json_str(raw).filter(|c| c.len() <= MAX_ID_BYTES).ok_or_else(bad)?.into_owned()),
            };
            Ok(ClientOp::Presence { ch, cursor })
        }
        "presence_stats" => Ok(ClientOp::PresenceStats { ch }),
        _ => {
            let id = match (f.id, id) {
                (None, _) => return Err(RequestError::new(codes::BAD_REQUEST, "missing id")),
                (Some(_), None) => return Err(RequestError::new(codes::BAD_REQUEST, "id must be a string")),
                (Some(_), Some(id)) if !valid_message_id(&id) => {
                    return Err(RequestError::new(codes::BAD_REQUEST, "id must be 1-128 bytes"))
                }
                (Some(_), Some(id)) => id.into_owned(),
            };
            let data = f.data.ok_or_else(|| RequestError::new(codes::BAD_REQUEST, "missing data"))?;
            Ok(ClientOp::Pub { ch, id, data: owned_compact(data)? })
        }
    }
}

/// Validates an HTTP publish body (`POST /publish/{channel}`, docs/http.md): it must be one JSON
/// value, which becomes `data`. Returns it compacted ([`compact_json`]); `bad_json` (answer
/// 400 with the reason) otherwise. The size limit is the caller's (413).
pub fn parse_publish_body(body: &[u8]) -> Result<Box<RawValue>, RequestError> {
    let raw: &RawValue = serde_json::from_slice(body)
        .map_err(|e| RequestError::new(codes::BAD_JSON, format!("body is not JSON: {e}")))?;
    owned_compact(raw)
}

/// Whether `id` is a usable publish id (`pub.id` or `Idempotency-Key`): 1–128 bytes.
pub fn valid_message_id(id: &str) -> bool {
    (1..=MAX_ID_BYTES).contains(&id.len())
}

/// The reason of a `bad_channel` error, over WebSocket and HTTP alike (docs/protocol.md).
pub const BAD_CHANNEL_REASON: &str = "invalid channel name: 1-128 bytes of [A-Za-z0-9._:-]";

/// Channel names: 1–128 bytes of `[A-Za-z0-9._:-]` (docs/protocol.md).
pub fn valid_channel(name: &str) -> bool {
    (1..=MAX_CHANNEL_BYTES).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Removes the insignificant whitespace (RFC 8259 §2) of valid JSON text, leaving strings and
/// everything else byte for byte (no key reordering, no number rewriting). Borrowed when there
/// was nothing to remove, which is the common case (`JSON.stringify`, `serde_json` output).
/// Why: `data` is framed verbatim, and `tether sub` prints one line per `msg`.
pub fn compact_json(json: &str) -> Cow<'_, str> {
    let bytes = json.as_bytes();
    let mut in_string = false;
    let mut escaped = false;
    let mut out: Option<Vec<u8>> = None;
    for (i, &b) in bytes.iter().enumerate() {
        let keep = if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            true
        } else if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            false
        } else {
            in_string = b == b'"';
            true
        };
        match (&mut out, keep) {
            (Some(o), true) => o.push(b),
            (None, false) => out = Some(bytes[..i].to_vec()),
            _ => {}
        }
    }
    match out {
        // Only ASCII whitespace was removed, so the rest is still UTF-8.
        Some(o) => String::from_utf8(o).map_or(Cow::Borrowed(json), Cow::Owned),
        None => Cow::Borrowed(json),
    }
}

/// The content of a JSON string value, unescaped only when it has escapes; `None` if `raw` is
/// not a string.
fn json_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    serde_json::from_str::<&str>(raw.get())
        .map(Cow::Borrowed)
        .or_else(|_| serde_json::from_str::<String>(raw.get()).map(Cow::Owned))
        .ok()
}

fn not_null(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| r.get() != "null")
}

fn owned_compact(raw: &RawValue) -> Result<Box<RawValue>, RequestError> {
    match compact_json(raw.get()) {
        Cow::Borrowed(_) => Ok(raw.to_owned()),
        Cow::Owned(s) => {
            RawValue::from_string(s).map_err(|e| RequestError::new(codes::BAD_JSON, format!("invalid JSON: {e}")))
        }
    }
}

#[cfg(test)]
mod tests;
