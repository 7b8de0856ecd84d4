//! A feed definition (DESIGN §6, §7 `[[feeds.static]]`): what an operator writes in the
//! config file or `PUT /feeds/{id}` ([`FeedDef`]), and its validation. The lease a node holds
//! on a feed is `crate::feeds`' (`feeds::record`).

use serde::{Deserialize, Serialize};

use crate::logging::redact_url;

/// Longest feed id, in bytes.
pub const MAX_ID_BYTES: usize = 64;
/// Longest `url`, `subscribe` text or `seq_pointer`, in bytes.
pub const MAX_TEXT_BYTES: usize = 8192;
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

pub(crate) fn bad(field: &'static str, reason: impl Into<String>) -> FeedError {
    FeedError { field, reason: reason.into() }
}

/// A short, escaped prefix of a bad value for an error message.
pub(crate) fn quote(v: &str) -> String {
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
