//! What the server API takes (docs/api.md), read and checked before anything is done:
//! JSON bodies and query strings into typed requests, every refusal naming its field.
//! Sans-IO: unit-tested here, and the bounds are the documented constants below.
//!
//! A body is one JSON object whose keys are the documented fields; an unknown key, a key
//! given twice, or a value of the wrong type or size is refused (400) naming that key, so a
//! typo is never silently ignored.

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::auth::revoke::{Revocation, DEFAULT_REVOKE_MS, MAX_JTI_BYTES, MAX_REVOKE_MS};
use crate::auth::MAX_SUB_BYTES;
use crate::http;
use crate::protocol;
use crate::server::broker::{Control, PresenceQuery};

/// Most channels one `POST /api/publish` may name.
pub const MAX_PUBLISH_CHANNELS: usize = 100;
/// Messages a history page holds when `limit` is not given.
pub const DEFAULT_HISTORY_LIMIT: usize = 100;
/// Most messages a history page may hold.
pub const MAX_HISTORY_LIMIT: usize = 1000;
/// Channels `GET /api/channels` lists when `limit` is not given.
pub const DEFAULT_CHANNELS_LIMIT: usize = 1000;
/// Most channels `GET /api/channels` may list.
pub const MAX_CHANNELS_LIMIT: usize = 10_000;
/// Most bytes of a close reason (RFC 6455 §5.5: a control frame's payload is at most 125
/// bytes, 2 of which are the code).
pub const MAX_REASON_BYTES: usize = 123;
/// The close code of `POST /api/disconnect` when none is given (not in the reconnect class:
/// `tether::client` stops, as on a refused refresh).
pub const DEFAULT_DISCONNECT_CODE: u16 = 4003;

/// A refused input: the field it names (`body` for the body as a whole) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field (`channels`, `data`, `from`, …), or `body`.
    pub field: String,
    /// For humans.
    pub reason: String,
}

pub(super) fn bad(field: &str, reason: impl Into<String>) -> FieldError {
    FieldError { field: field.to_owned(), reason: reason.into() }
}

/// `POST /api/publish`: one message for several channels.
#[derive(Debug, Clone)]
pub struct BatchPublish {
    /// 1–[`MAX_PUBLISH_CHANNELS`] distinct valid channel names, in request order.
    pub channels: Vec<String>,
    /// The message, compact JSON (as `POST /publish/{channel}` keeps it).
    pub data: Box<RawValue>,
    /// The dedup key used on every channel (the `Idempotency-Key` of each), 1–128 bytes.
    pub id: Option<String>,
}

/// The fields a body may hold, each kept raw so that a wrong type names its field.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Fields<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    channels: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    data: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    user: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    code: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    reason: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    ch: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    jti: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    until_ms: Option<&'a RawValue>,
}

/// Keeps an explicit `null` as `Some("null")`: `data: null` is a publishable value.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// Reads `body` as an object of the fields in `allowed`; a field of another endpoint is as
/// unknown as a typo.
fn fields<'a>(body: &'a [u8], allowed: &[&str]) -> Result<Fields<'a>, FieldError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(bad("body", "a JSON object is required"));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(bad("body", "must be a JSON object"));
    }
    let f: Fields<'a> = serde_json::from_slice(body).map_err(|e| {
        let msg = e.to_string();
        let named = ["duplicate field `", "unknown field `"].iter().find_map(|p| msg.strip_prefix(p));
        match named.and_then(|m| m.split('`').next()) {
            Some(field) => bad(field, msg.split(", expected").next().unwrap_or(&msg).to_owned()),
            None => bad("body", format!("not JSON: {msg}")),
        }
    })?;
    let given = [
        ("channels", f.channels.is_some()),
        ("data", f.data.is_some()),
        ("id", f.id.is_some()),
        ("user", f.user.is_some()),
        ("code", f.code.is_some()),
        ("reason", f.reason.is_some()),
        ("ch", f.ch.is_some()),
        ("jti", f.jti.is_some()),
        ("until_ms", f.until_ms.is_some()),
    ];
    match given.iter().find(|(name, set)| *set && !allowed.contains(name)) {
        Some((name, _)) => Err(bad(name, format!("unknown field `{name}` here"))),
        None => Ok(f),
    }
}

/// A string field of 1–`max` bytes.
fn string(field: &str, raw: Option<&RawValue>, max: usize) -> Result<Option<String>, FieldError> {
    let Some(raw) = raw.filter(|r| r.get() != "null") else { return Ok(None) };
    let s: String = serde_json::from_str(raw.get()).map_err(|_| bad(field, "must be a string"))?;
    if s.is_empty() || s.len() > max {
        return Err(bad(field, format!("must be 1-{max} bytes")));
    }
    Ok(Some(s))
}

fn required<T>(field: &str, v: Option<T>) -> Result<T, FieldError> {
    v.ok_or_else(|| bad(field, format!("`{field}` is required")))
}

fn channel(field: &str, ch: String) -> Result<String, FieldError> {
    if protocol::valid_channel(&ch) {
        return Ok(ch);
    }
    let shown = crate::logging::Escaped(ch.as_bytes());
    Err(bad(field, format!("invalid channel name \"{shown}\": 1-128 bytes of [A-Za-z0-9._:-]")))
}

/// Reads a `POST /api/publish` body: `{"channels":[…],"data":…,"id"?:"…"}`.
///
/// # Errors
/// Naming `body`, `channels` (not an array of 1–100 strings, an invalid or repeated name,
/// named in the reason), `data` (missing), `id` (not a string of 1–128 bytes), or a field
/// that is not one of these.
pub fn publish(body: &[u8]) -> Result<BatchPublish, FieldError> {
    let f = fields(body, &["channels", "data", "id"])?;
    let raw = required("channels", f.channels)?;
    let names: Vec<String> =
        serde_json::from_str(raw.get()).map_err(|_| bad("channels", "must be an array of channel names"))?;
    if names.is_empty() || names.len() > MAX_PUBLISH_CHANNELS {
        return Err(bad("channels", format!("must name 1-{MAX_PUBLISH_CHANNELS} channels")));
    }
    let mut channels = Vec::with_capacity(names.len());
    for ch in names {
        let ch = channel("channels", ch)?;
        if channels.contains(&ch) {
            return Err(bad("channels", format!("{ch} is named twice: each channel gets the message once")));
        }
        channels.push(ch);
    }
    let data = required("data", f.data)?;
    let data = protocol::parse_publish_body(data.get().as_bytes()).map_err(|e| bad("data", e.reason))?;
    let id = string("id", f.id, protocol::MAX_ID_BYTES)?;
    Ok(BatchPublish { channels, data, id })
}

/// Reads `GET /api/history/{ch}?from=&limit=`: the channel (the path segment after
/// `/api/history/`, percent-decoded), `from` (messages after this seq) and `limit` (default
/// [`DEFAULT_HISTORY_LIMIT`], at most [`MAX_HISTORY_LIMIT`]).
///
/// # Errors
/// Naming `ch`, `from` (not a non-negative integer) or `limit` (not 1–1000).
pub fn history(raw_ch: &str, query: Option<&str>) -> Result<(String, Option<u64>, usize), FieldError> {
    let ch = http::percent_decode(raw_ch).ok_or_else(|| bad("ch", "bad percent-encoding"))?;
    let ch = channel("ch", ch)?;
    let from = query_number(query, "from")?;
    let limit =
        query_number(query, "limit")?.map_or(Ok(DEFAULT_HISTORY_LIMIT), |n| bounded("limit", n, MAX_HISTORY_LIMIT))?;
    Ok((ch, from, limit))
}

/// Reads `GET /api/presence/{ch}?cursor=` (or `GET /api/presence_stats/{ch}` when `stats`):
/// the channel (percent-decoded) and the query: a page after `cursor` (at most 128 bytes, the
/// `next` of the previous page), or the counts.
///
/// # Errors
/// Naming `ch` or `cursor`.
pub fn presence(raw_ch: &str, query: Option<&str>, stats: bool) -> Result<(String, PresenceQuery), FieldError> {
    let ch = http::percent_decode(raw_ch).ok_or_else(|| bad("ch", "bad percent-encoding"))?;
    let ch = channel("ch", ch)?;
    if stats {
        return Ok((ch, PresenceQuery::Stats));
    }
    let cursor = match query.map(|q| http::query_values(q, "cursor")).unwrap_or_default().as_slice() {
        [] => None,
        [Some(c)] if !c.is_empty() && c.len() <= protocol::MAX_ID_BYTES => Some(c.clone().into_boxed_str()),
        [Some(_)] => return Err(bad("cursor", "must be 1-128 bytes: the next of the previous page")),
        [None] => return Err(bad("cursor", "bad percent-encoding")),
        _ => return Err(bad("cursor", "given more than once")),
    };
    Ok((ch, PresenceQuery::Members { cursor }))
}

/// Reads `GET /api/channels?prefix=&limit=`: the name prefix (empty: every channel; at most
/// 128 bytes of the channel alphabet) and `limit` (default [`DEFAULT_CHANNELS_LIMIT`], at
/// most [`MAX_CHANNELS_LIMIT`]).
///
/// # Errors
/// Naming `prefix` or `limit`.
pub fn channels(query: Option<&str>) -> Result<(String, usize), FieldError> {
    let prefix = match query.map(|q| http::query_values(q, "prefix")).unwrap_or_default().as_slice() {
        [] => String::new(),
        [Some(p)] if p.is_empty() || protocol::valid_channel(p) => p.clone(),
        [Some(_)] => return Err(bad("prefix", "must be 0-128 bytes of [A-Za-z0-9._:-]")),
        [None] => return Err(bad("prefix", "bad percent-encoding")),
        _ => return Err(bad("prefix", "given more than once")),
    };
    let limit = query_number(query, "limit")?
        .map_or(Ok(DEFAULT_CHANNELS_LIMIT), |n| bounded("limit", n, MAX_CHANNELS_LIMIT))?;
    Ok((prefix, limit))
}

fn bounded(field: &str, n: u64, max: usize) -> Result<usize, FieldError> {
    match usize::try_from(n) {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(bad(field, format!("must be 1-{max}"))),
    }
}

/// Checks that the query names only `known` parameters (none for an endpoint that takes
/// none), so a misspelt one (`?form=3`) is refused rather than silently ignored.
///
/// # Errors
/// Naming the first unknown parameter (or `query` when a name is badly percent-encoded).
pub fn known_params(query: Option<&str>, known: &[&str]) -> Result<(), FieldError> {
    for part in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let raw = part.split('=').next().unwrap_or_default();
        let Some(name) = http::percent_decode(raw) else {
            return Err(bad("query", "bad percent-encoding in a parameter's name"));
        };
        if !known.contains(&name.as_str()) {
            let expected = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
            let shown: String = name.chars().take(64).collect();
            return Err(bad(&shown, format!("unknown query parameter (this endpoint takes: {expected})")));
        }
    }
    Ok(())
}

/// The query parameter `key` as a non-negative integer, `None` when absent.
fn query_number(query: Option<&str>, key: &str) -> Result<Option<u64>, FieldError> {
    match query.map(|q| http::query_values(q, key)).unwrap_or_default().as_slice() {
        [] => Ok(None),
        [Some(v)] => v.parse().map(Some).map_err(|_| bad(key, "must be a non-negative integer")),
        [None] => Err(bad(key, "bad percent-encoding")),
        _ => Err(bad(key, "given more than once")),
    }
}

/// Whether `code` may close a connection from the API: an application code (4000–4999), or a
/// code of the reconnect class the server itself sends (1001 going away, 1011 internal
/// error, 1012 service restart, 1013 try again later; docs/protocol.md). 1000 and 1008 are
/// left out: `tether::client` stops on them, which 4000–4999 already express.
pub fn disconnect_code_allowed(code: u64) -> bool {
    (4000..=4999).contains(&code) || matches!(code, 1001 | 1011 | 1012 | 1013)
}

/// Reads a `POST /api/disconnect` body: `{"user":"…","code"?:N,"reason"?:"…"}`.
///
/// # Errors
/// Naming `user` (not 1–256 bytes), `code` (not allowed: [`disconnect_code_allowed`]),
/// `reason` (not a string of at most 123 bytes) or another field.
pub fn disconnect(body: &[u8]) -> Result<Control, FieldError> {
    let f = fields(body, &["user", "code", "reason"])?;
    let user = required("user", string("user", f.user, MAX_SUB_BYTES)?)?;
    let code = match f.code.filter(|r| r.get() != "null") {
        None => DEFAULT_DISCONNECT_CODE,
        Some(raw) => match serde_json::from_str::<u64>(raw.get()) {
            Ok(c) if disconnect_code_allowed(c) => c as u16,
            _ => return Err(bad("code", "must be 4000-4999, or 1001, 1011, 1012 or 1013")),
        },
    };
    let reason = match f.reason.filter(|r| r.get() != "null") {
        None => String::new(),
        Some(raw) => serde_json::from_str::<String>(raw.get()).map_err(|_| bad("reason", "must be a string"))?,
    };
    if reason.len() > MAX_REASON_BYTES {
        return Err(bad("reason", format!("must be at most {MAX_REASON_BYTES} bytes (RFC 6455 §5.5)")));
    }
    Ok(Control::Disconnect { user: user.into(), code, reason: reason.into() })
}

/// Reads a `POST /api/unsubscribe` body: `{"user":"…","ch":"…"}`.
///
/// # Errors
/// Naming `user`, `ch` (not a valid channel name) or another field.
pub fn unsubscribe(body: &[u8]) -> Result<Control, FieldError> {
    let f = fields(body, &["user", "ch"])?;
    let user = required("user", string("user", f.user, MAX_SUB_BYTES)?)?;
    let ch = channel("ch", required("ch", string("ch", f.ch, protocol::MAX_CHANNEL_BYTES)?)?)?;
    Ok(Control::Unsubscribe { user: user.into(), ch: ch.into() })
}

/// Reads a `POST /api/revoke` body at `now_ms`: `{"jti":"…"}` or `{"user":"…"}` (exactly one),
/// with `until_ms` (milliseconds since the Unix epoch; default `now_ms` +
/// [`DEFAULT_REVOKE_MS`]); a revocation by user is dated `now_ms`.
///
/// # Errors
/// Naming `jti` or `user` (both or neither given, or not 1–256 bytes), `until_ms` (not an
/// integer after `now_ms` and at most [`MAX_REVOKE_MS`] ahead) or another field.
pub fn revoke(body: &[u8], now_ms: u64) -> Result<Revocation, FieldError> {
    let f = fields(body, &["jti", "user", "until_ms"])?;
    let jti = string("jti", f.jti, MAX_JTI_BYTES)?;
    let user = string("user", f.user, MAX_SUB_BYTES)?;
    let until_ms = match f.until_ms.filter(|r| r.get() != "null") {
        None => now_ms + DEFAULT_REVOKE_MS,
        Some(raw) => match serde_json::from_str::<u64>(raw.get()) {
            Ok(t) if t > now_ms && t - now_ms <= MAX_REVOKE_MS => t,
            _ => {
                let days = MAX_REVOKE_MS / 86_400_000;
                return Err(bad(
                    "until_ms",
                    format!("must be a time (ms since the Unix epoch) within the next {days} days"),
                ));
            }
        },
    };
    match (jti, user) {
        (Some(jti), None) => Ok(Revocation::Jti { jti: jti.into(), until_ms }),
        (None, Some(user)) => Ok(Revocation::User { user: user.into(), revoked_at_ms: now_ms, until_ms }),
        (Some(_), Some(_)) => Err(bad("jti", "give `jti` or `user`, not both")),
        (None, None) => Err(bad("jti", "`jti` or `user` is required")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field<T: std::fmt::Debug>(r: Result<T, FieldError>) -> String {
        r.expect_err("refused").field
    }

    #[test]
    fn publish_bodies() {
        let p = publish(br#"{"channels":["a","b.c"],"data":{ "x" : [1, 2] },"id":"k1"}"#).unwrap();
        assert_eq!(p.channels, ["a", "b.c"]);
        assert_eq!(p.data.get(), r#"{"x":[1,2]}"#, "data compacted, as POST /publish keeps it");
        assert_eq!(p.id.as_deref(), Some("k1"));
        assert_eq!(publish(br#"{"channels":["a"],"data":null}"#).unwrap().data.get(), "null");
        for (body, want) in [
            (&b""[..], "body"),
            (b"[1]", "body"),
            (b"{", "body"),
            (br#"{"data":1}"#, "channels"),
            (br#"{"channels":"a","data":1}"#, "channels"),
            (br#"{"channels":[],"data":1}"#, "channels"),
            (br#"{"channels":["bad name"],"data":1}"#, "channels"),
            (br#"{"channels":["a","a"],"data":1}"#, "channels"),
            (br#"{"channels":["a"]}"#, "data"),
            (br#"{"channels":["a"],"data":1,"id":""}"#, "id"),
            (br#"{"channels":["a"],"data":1,"id":7}"#, "id"),
            (br#"{"channels":["a"],"data":1,"chanels":[]}"#, "chanels"),
            (br#"{"channels":["a"],"data":1,"user":"x"}"#, "user"),
            (br#"{"channels":["a"],"data":1,"data":2}"#, "data"),
        ] {
            assert_eq!(field(publish(body)), want, "{}", String::from_utf8_lossy(body));
        }
        let many: Vec<String> = (0..=MAX_PUBLISH_CHANNELS).map(|i| format!("c{i}")).collect();
        let body = serde_json::json!({"channels": many, "data": 1}).to_string();
        assert_eq!(field(publish(body.as_bytes())), "channels");
        let e = publish(br#"{"channels":["ok","no/pe"],"data":1}"#).unwrap_err();
        assert!(e.reason.contains("no/pe"), "the bad name is named: {}", e.reason);
    }

    #[test]
    fn history_and_channels_queries() {
        assert_eq!(history("news", None).unwrap(), ("news".into(), None, DEFAULT_HISTORY_LIMIT));
        assert_eq!(history("a%3Ab", Some("from=7&limit=1000")).unwrap(), ("a:b".into(), Some(7), 1000));
        assert_eq!(field(history("bad%20name", None)), "ch");
        assert_eq!(field(history("a", Some("from=-1"))), "from");
        assert_eq!(field(history("a", Some("from=1&from=2"))), "from");
        assert_eq!(field(history("a", Some("limit=0"))), "limit");
        assert_eq!(field(history("a", Some("limit=1001"))), "limit");
        assert_eq!(channels(None).unwrap(), (String::new(), DEFAULT_CHANNELS_LIMIT));
        assert_eq!(channels(Some("prefix=chat.&limit=5")).unwrap(), ("chat.".into(), 5));
        assert_eq!(field(channels(Some("prefix=a%20b"))), "prefix");
        assert_eq!(field(channels(Some("limit=10001"))), "limit");
    }

    #[test]
    fn control_bodies() {
        let d = disconnect(br#"{"user":"alice"}"#).unwrap();
        assert_eq!(d, Control::Disconnect { user: "alice".into(), code: 4003, reason: "".into() });
        assert!(disconnect(br#"{"user":"a","code":1012,"reason":"deploy"}"#).is_ok());
        for (body, want) in [
            (&br#"{}"#[..], "user"),
            (br#"{"user":""}"#, "user"),
            (br#"{"user":"a","code":1000}"#, "code"),
            (br#"{"user":"a","code":5000}"#, "code"),
            (br#"{"user":"a","code":"4003"}"#, "code"),
            (br#"{"user":"a","reason":7}"#, "reason"),
            (br#"{"user":"a","ch":"x"}"#, "ch"),
        ] {
            assert_eq!(field(disconnect(body)), want, "{}", String::from_utf8_lossy(body));
        }
        let long = serde_json::json!({"user": "a", "reason": "é".repeat(62)}).to_string();
        assert_eq!(field(disconnect(long.as_bytes())), "reason", "124 bytes");
        assert_eq!(
            unsubscribe(br#"{"user":"a","ch":"news"}"#).unwrap(),
            Control::Unsubscribe { user: "a".into(), ch: "news".into() }
        );
        assert_eq!(field(unsubscribe(br#"{"user":"a"}"#)), "ch");
        assert_eq!(field(unsubscribe(br#"{"user":"a","ch":"no pe"}"#)), "ch");
    }

    #[test]
    fn revoke_bodies() {
        let now = 1_700_000_000_000;
        assert_eq!(
            revoke(br#"{"jti":"t1"}"#, now).unwrap(),
            Revocation::Jti { jti: "t1".into(), until_ms: now + DEFAULT_REVOKE_MS }
        );
        let body = format!(r#"{{"user":"bob","until_ms":{}}}"#, now + 5);
        assert_eq!(
            revoke(body.as_bytes(), now).unwrap(),
            Revocation::User { user: "bob".into(), revoked_at_ms: now, until_ms: now + 5 }
        );
        for body in [r#"{}"#.to_owned(), r#"{"jti":"a","user":"b"}"#.to_owned()] {
            assert_eq!(field(revoke(body.as_bytes(), now)), "jti", "{body}");
        }
        for until in [now, now - 1, now + MAX_REVOKE_MS + 1] {
            assert_eq!(field(revoke(format!(r#"{{"jti":"a","until_ms":{until}}}"#).as_bytes(), now)), "until_ms");
        }
        assert_eq!(field(revoke(format!(r#"{{"jti":"{}"}}"#, "x".repeat(257)).as_bytes(), now)), "jti");
    }
}
