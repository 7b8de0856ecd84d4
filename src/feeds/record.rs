//! The feed record (DESIGN §6, §7 `[[feeds.static]]`): a definition written by an operator
//! ([`FeedDef`]) and the lease fields written by the lease store ([`Lease`]).

use crate::logging::redact_url;
use serde::{Deserialize, Serialize};

/// Longest feed id, in bytes.
pub const MAX_ID_BYTES: usize = 64;
/// Longest `lease_owner` (a node id), in bytes.
pub const MAX_OWNER_BYTES: usize = 128;
/// Longest `url`, `subscribe` text or `seq_pointer`, in bytes.
pub const MAX_TEXT_BYTES: usize = 8192;
/// Longest `last_seq` (an upstream sequence number or id, as text), in bytes.
pub const MAX_SEQ_BYTES: usize = 256;

/// Whether the feed should run (`"STARTED"`) or not (`"STOPPED"`). Default `STARTED`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum DesiredState {
    /// Some node should hold the lease and the upstream connection.
    #[default]
    Started,
    /// No node should hold the upstream connection.
    Stopped,
}

impl DesiredState {
    /// The wire and storage spelling: `"STARTED"` or `"STOPPED"`.
    pub fn as_str(self) -> &'static str {
        match self {
            DesiredState::Started => "STARTED",
            DesiredState::Stopped => "STOPPED",
        }
    }

    /// Parses the storage spelling; `None` for anything else.
    pub fn parse(s: &str) -> Option<DesiredState> {
        match s {
            "STARTED" => Some(DesiredState::Started),
            "STOPPED" => Some(DesiredState::Stopped),
            _ => None,
        }
    }
}

/// A feed definition: what to connect to and where to republish. JSON/TOML field names are
/// those of DESIGN §7 `[[feeds.static]]`; unknown fields are refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedDef {
    /// 1–64 bytes of `[A-Za-z0-9._-]`; part of key names and of publish ids
    /// `feed:<id>:<upstream seq>`, hence no `:`.
    pub id: String,
    /// The upstream, `ws://` or `wss://` with a host (RFC 6455 §3).
    pub url: String,
    /// The channel the upstream messages are published into (DESIGN §7 channel names).
    pub channel: String,
    /// Default `STARTED`.
    #[serde(default)]
    pub desired_state: DesiredState,
    /// Text sent after connecting, `{last_seq}` substituted; empty = none.
    #[serde(default)]
    pub subscribe: String,
    /// Query parameter set to `last_seq` on reconnect, e.g. `from`; empty = none. 1–64 bytes
    /// of `[A-Za-z0-9._~-]` (RFC 3986 unreserved) when set.
    #[serde(default)]
    pub resume_query: String,
    /// JSON pointer (RFC 6901) to the upstream message's own sequence number or id, e.g.
    /// `/seq`; must start with `/`.
    pub seq_pointer: String,
}

/// The lease fields of a feed, written only by a [`crate::feeds::LeaseStore`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// The node that holds or last held the lease; `None` if never acquired.
    pub lease_owner: Option<String>,
    /// When the lease ends, Unix epoch milliseconds of the holder's clock; 0 = free.
    pub lease_expires_at_ms: u64,
    /// Incremented by one on every acquire; 0 = never acquired.
    pub fencing_token: u64,
    /// The last upstream seq (or id) the holder stored with a renew or release.
    pub last_seq: Option<String>,
}

impl Lease {
    /// Whether someone holds the lease at `now_ms` (ms): `lease_expires_at_ms > now_ms`.
    pub fn is_held(&self, now_ms: u64) -> bool {
        self.lease_expires_at_ms > now_ms
    }
}

/// A feed: its definition and its lease. Serializes flat, as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Feed {
    /// What to connect to.
    #[serde(flatten)]
    pub def: FeedDef,
    /// Who holds it.
    #[serde(flatten)]
    pub lease: Lease,
}

/// A bad feed field: `field` is its name (`url`, `seq_pointer`, …), `reason` says what is
/// wrong and quotes at most a short prefix of the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedError {
    /// The field name, as in [`FeedDef`] or a lease operation's argument.
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for FeedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for FeedError {}

fn bad(field: &'static str, reason: impl Into<String>) -> FeedError {
    FeedError { field, reason: reason.into() }
}

/// A short, escaped prefix of a bad value for an error message.
fn quote(v: &str) -> String {
    let head: String = v.chars().take(40).collect();
    let more = if head.len() < v.len() { "…" } else { "" };
    format!("{:?}{more}", head)
}

/// Checks a feed id: 1–[`MAX_ID_BYTES`] bytes of `[A-Za-z0-9._-]`, and not `.` or `..`: those
/// are dot-segments, which a standard HTTP client removes from `/feeds/{id}` before sending
/// (RFC 3986 §5.2.4), so such a feed could never be addressed again. Errors name `id`.
pub fn validate_id(id: &str) -> Result<(), FeedError> {
    let ok = (1..=MAX_ID_BYTES).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(bad("id", format!("{} is not 1–{MAX_ID_BYTES} bytes of [A-Za-z0-9._-]", quote(id))));
    }
    if matches!(id, "." | "..") {
        return Err(bad(
            "id",
            format!("{} is a dot-segment (RFC 3986 §3.3): /feeds/{id} cannot be addressed", quote(id)),
        ));
    }
    Ok(())
}

/// Checks a node id used as `lease_owner`: 1–[`MAX_OWNER_BYTES`] printable ASCII bytes, no
/// space. Errors name `lease_owner`.
pub fn validate_owner(owner: &str) -> Result<(), FeedError> {
    if (1..=MAX_OWNER_BYTES).contains(&owner.len()) && owner.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(bad("lease_owner", format!("{} is not 1–{MAX_OWNER_BYTES} printable ASCII bytes", quote(owner))))
    }
}

/// Checks a `last_seq`: 1–[`MAX_SEQ_BYTES`] printable ASCII bytes, no space (it is
/// substituted into `subscribe` and a query string). Errors name `last_seq`.
pub fn validate_seq(seq: &str) -> Result<(), FeedError> {
    if (1..=MAX_SEQ_BYTES).contains(&seq.len()) && seq.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(bad("last_seq", format!("{} is not 1–{MAX_SEQ_BYTES} printable ASCII bytes", quote(seq))))
    }
}

/// Checks an upstream URL: `ws://` or `wss://`, a non-empty host, no fragment, at most
/// [`MAX_TEXT_BYTES`] (RFC 6455 §3). Errors name `url`.
pub fn validate_url(url: &str) -> Result<(), FeedError> {
    if url.len() > MAX_TEXT_BYTES {
        return Err(bad("url", format!("longer than {MAX_TEXT_BYTES} bytes")));
    }
    let rest = url
        .strip_prefix("ws://")
        .or_else(|| url.strip_prefix("wss://"))
        .ok_or_else(|| bad("url", format!("{} must start with ws:// or wss://", quote(&redact_url(url)))))?;
    let uri: tungstenite::http::Uri =
        url.parse().map_err(|e| bad("url", format!("{}: {e}", quote(&redact_url(url)))))?;
    if uri.host().is_none_or(str::is_empty) || rest.starts_with(['/', '?', ':']) {
        return Err(bad("url", format!("{} has no host", quote(&redact_url(url)))));
    }
    if url.contains('#') {
        return Err(bad("url", format!("{} has a fragment (RFC 6455 §3 forbids it)", quote(&redact_url(url)))));
    }
    Ok(())
}

/// Checks a JSON pointer (RFC 6901 §3): starts with `/`, every `~` followed by `0` or `1`, at
/// most [`MAX_TEXT_BYTES`]. The whole document (`""`) is refused: a seq must be a member.
/// Errors name `seq_pointer`.
pub fn validate_pointer(p: &str) -> Result<(), FeedError> {
    if !p.starts_with('/') || p.len() > MAX_TEXT_BYTES {
        return Err(bad(
            "seq_pointer",
            format!("{} must be a JSON pointer starting with '/', e.g. \"/seq\"", quote(p)),
        ));
    }
    let b = p.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'~' && !matches!(b.get(i + 1), Some(b'0' | b'1')) {
            return Err(bad("seq_pointer", format!("{}: '~' must be followed by 0 or 1 (RFC 6901)", quote(p))));
        }
    }
    Ok(())
}

impl FeedDef {
    /// Checks every field; the error names the first bad one. `channel` follows
    /// [`crate::protocol::valid_channel`] (DESIGN §7).
    pub fn validate(&self) -> Result<(), FeedError> {
        validate_id(&self.id)?;
        validate_url(&self.url)?;
        if !crate::protocol::valid_channel(&self.channel) {
            return Err(bad("channel", format!("{} is not 1–128 bytes of [A-Za-z0-9._:-]", quote(&self.channel))));
        }
        if self.subscribe.len() > MAX_TEXT_BYTES {
            return Err(bad("subscribe", format!("longer than {MAX_TEXT_BYTES} bytes")));
        }
        let rq = &self.resume_query;
        let unreserved = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-');
        if rq.len() > 64 || !rq.bytes().all(unreserved) {
            return Err(bad("resume_query", format!("{} is not 1–64 bytes of [A-Za-z0-9._~-]", quote(rq))));
        }
        validate_pointer(&self.seq_pointer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> FeedDef {
        FeedDef {
            id: "btc".into(),
            url: "wss://upstream.example/stream?x=1".into(),
            channel: "prices.btc".into(),
            desired_state: DesiredState::Started,
            subscribe: "{\"from\":{last_seq}}".into(),
            resume_query: "from".into(),
            seq_pointer: "/seq".into(),
        }
    }

    fn field_of(f: impl FnOnce(&mut FeedDef)) -> &'static str {
        let mut d = def();
        f(&mut d);
        d.validate().expect_err("must be refused").field
    }

    #[test]
    fn a_good_definition_passes() {
        def().validate().unwrap();
        let mut d = def();
        d.url = "ws://127.0.0.1:9000/".into();
        d.subscribe.clear();
        d.resume_query.clear();
        d.seq_pointer = "/a~1b/0/~0".into();
        d.validate().unwrap();
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(field_of(|d| d.id = String::new()), "id");
        assert_eq!(field_of(|d| d.id = "a:b".into()), "id");
        assert_eq!(field_of(|d| d.id = "x".repeat(65)), "id");
        assert_eq!(field_of(|d| d.url = "http://h/".into()), "url");
        assert_eq!(field_of(|d| d.url = "ws:///path".into()), "url");
        assert_eq!(field_of(|d| d.url = "wss://h/#frag".into()), "url");
        assert_eq!(field_of(|d| d.url = "wss://h h/".into()), "url");
        assert_eq!(field_of(|d| d.channel = "a b".into()), "channel");
        assert_eq!(field_of(|d| d.channel = String::new()), "channel");
        assert_eq!(field_of(|d| d.resume_query = "a=b".into()), "resume_query");
        assert_eq!(field_of(|d| d.seq_pointer = "seq".into()), "seq_pointer");
        assert_eq!(field_of(|d| d.seq_pointer = String::new()), "seq_pointer");
        assert_eq!(field_of(|d| d.seq_pointer = "/a~2".into()), "seq_pointer");
        assert_eq!(field_of(|d| d.seq_pointer = "/a~".into()), "seq_pointer");
        assert_eq!(field_of(|d| d.subscribe = "x".repeat(MAX_TEXT_BYTES + 1)), "subscribe");
    }

    #[test]
    fn json_names_the_unknown_field_and_spells_the_state() {
        let e = serde_json::from_str::<FeedDef>(
            r#"{"id":"a","url":"ws://h/","channel":"c","seq_pointer":"/s","colour":"red"}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        let d: FeedDef = serde_json::from_str(
            r#"{"id":"a","url":"ws://h/","channel":"c","seq_pointer":"/s","desired_state":"STOPPED"}"#,
        )
        .unwrap();
        assert_eq!(d.desired_state, DesiredState::Stopped);
        let f = Feed { def: d, lease: Lease::default() };
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["desired_state"], "STOPPED");
        assert_eq!(v["fencing_token"], 0);
        assert!(v["lease_owner"].is_null());
    }

    #[test]
    fn owner_and_seq_shapes() {
        validate_owner("node-1a2b").unwrap();
        assert_eq!(validate_owner("").unwrap_err().field, "lease_owner");
        assert_eq!(validate_owner("a b").unwrap_err().field, "lease_owner");
        validate_seq("12345").unwrap();
        assert_eq!(validate_seq("").unwrap_err().field, "last_seq");
        assert_eq!(validate_seq(&"9".repeat(MAX_SEQ_BYTES + 1)).unwrap_err().field, "last_seq");
    }
}
