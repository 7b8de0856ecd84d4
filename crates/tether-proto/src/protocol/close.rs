//! The close contract: which close codes the server sends and what its close reasons say.
//!
//! Close codes are tungstenite's typed [`CloseCode`] (RFC 6455 §7.4.1 and the IANA registry),
//! never bare numbers. A close that the client should act on carries a JSON reason built and
//! parsed by one type, [`CloseReason`]: `{"reason":"slow","limit":"…","retry_after_ms":1000}`.
//! The server writes it; `tether::client` reads it with the same type, so the two cannot drift.

use std::borrow::Cow;
use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use tungstenite::protocol::frame::coding::CloseCode;

/// What a client does after the server closed the connection (docs/protocol.md, "Close codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseAction {
    /// Wait for the backoff delay (at least the reason's `retry_after_ms`), reconnect, resume.
    Reconnect,
    /// Do not reconnect; report the code to the application.
    Stop,
}

/// 4001: the connection's token expired and no valid `refresh` came within
/// `auth.token_refresh_grace_ms` (DESIGN §9, docs/security.md). In the reconnect class: the
/// client gets a fresh token, reconnects and resumes.
pub const TOKEN_EXPIRED: CloseCode = CloseCode::Library(4001);

/// 4003: a `refresh` was refused (its token does not verify, or names another `sub`). Not in
/// the reconnect class: the credential itself is wrong.
pub const FORBIDDEN: CloseCode = CloseCode::Library(4003);

/// Classifies a close code received from the server.
///
/// Reconnect on 1001 (going away: shutdown), 1006 (abnormal closure: no close frame, any I/O
/// error), 1011 (internal error), 1012 (service restart: drain), 1013 (try again later:
/// slow consumer, overload) and 4001 ([`TOKEN_EXPIRED`]: with a fresh token). Every other code
/// stops: 1002, 1003, 1007, 1008, 1009 and 1010, 4003 ([`FORBIDDEN`]), and also 1000 (the
/// server meant to end the session), 1005 (no status) and unknown or application codes
/// (3000–4999), because a reconnect is allowed only for the listed codes and I/O errors.
pub fn classify(code: CloseCode) -> CloseAction {
    match code {
        CloseCode::Away | CloseCode::Abnormal | CloseCode::Error | CloseCode::Restart | CloseCode::Again => {
            CloseAction::Reconnect
        }
        c if c == TOKEN_EXPIRED => CloseAction::Reconnect,
        _ => CloseAction::Stop,
    }
}

/// The JSON reason of a server close frame.
///
/// Shapes the server sends (the reason must fit a close frame: at most 123 bytes):
/// - overflow (1013): `{"reason":"slow","limit":"queue_max_bytes=…,queue_max_messages=…","retry_after_ms":1000}`;
/// - drain (1012 / 1001): `{"reason":"restart","retry_after_ms":N}` or `"shutdown"`, N random
///   in 0–3000 per connection so returning clients spread out;
/// - abuse limit (1008): `{"reason":"limit","limit":"publish_rate"}`, naming the
///   `limits.per_connection` key the client went far past (docs/security.md); no
///   `retry_after_ms`: 1008 is not in the reconnect class.
/// - token expired (4001): `{"reason":"token_expired"}`;
/// - refresh refused (4003): `{"reason":"forbidden","detail":"bad signature"}` (`detail` as
///   the 401 of an upgrade would say it, or `"different sub"`).
///
/// `retry_after_ms` is the floor of the client's next reconnect delay, in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseReason {
    /// Why, one word: `slow`, `restart`, `shutdown`, `limit`.
    #[serde(default)]
    pub reason: Cow<'static, str>,
    /// The limit that was hit, for overflow and abuse-limit closes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Cow<'static, str>>,
    /// Wait at least this long before reconnecting, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// What exactly was refused, for a forbidden refresh (4003).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Cow<'static, str>>,
}

/// `retry_after_ms` of an overflow close (1013), in milliseconds.
pub const SLOW_RETRY_AFTER_MS: u64 = 1000;

impl CloseReason {
    /// A slow-consumer close (1013): `limit` names what overflowed.
    pub fn slow(limit: impl Into<Cow<'static, str>>) -> CloseReason {
        CloseReason {
            reason: "slow".into(),
            limit: Some(limit.into()),
            retry_after_ms: Some(SLOW_RETRY_AFTER_MS),
            detail: None,
        }
    }

    /// A drain close: `shutdown` for 1001 (going away), `restart` otherwise (1012), with the
    /// per-connection wait hint `retry_after_ms` (milliseconds).
    pub fn drain(code: CloseCode, retry_after_ms: u64) -> CloseReason {
        let reason = if code == CloseCode::Away { "shutdown" } else { "restart" };
        CloseReason { reason: reason.into(), limit: None, retry_after_ms: Some(retry_after_ms), detail: None }
    }

    /// The close of a connection whose token expired without a refresh ([`TOKEN_EXPIRED`]).
    pub fn token_expired() -> CloseReason {
        CloseReason { reason: "token_expired".into(), limit: None, retry_after_ms: None, detail: None }
    }

    /// The close of a refused refresh ([`FORBIDDEN`]); `detail` says why, in a few words.
    pub fn forbidden(detail: &'static str) -> CloseReason {
        CloseReason { reason: "forbidden".into(), limit: None, retry_after_ms: None, detail: Some(detail.into()) }
    }

    /// An abuse-limit close (1008): `key` names the `limits.per_connection` key
    /// (`publish_rate`, `publish_bytes_rate`, `control_frames_rate`).
    pub fn limit(key: &'static str) -> CloseReason {
        CloseReason { reason: "limit".into(), limit: Some(key.into()), retry_after_ms: None, detail: None }
    }

    /// The compact JSON text.
    pub fn to_json(&self) -> String {
        // A struct of strings and integers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a close reason; `None` when it is not a JSON object of this shape (another
    /// server's free text, say).
    pub fn parse(text: &str) -> Option<CloseReason> {
        serde_json::from_str(text.trim()).ok()
    }
}

/// Classifies a close code received from the server as a number (see [`classify`]).
pub fn classify_close(code: u16) -> CloseAction {
    classify(CloseCode::from(code))
}

/// The server's wait hint in a close reason: a [`CloseReason`] such as
/// `{"reason":"slow","retry_after_ms":250}` gives `Some(250 ms)`, the floor of the next
/// reconnect delay. A reason that is not JSON, or has no non-negative integer
/// `retry_after_ms`, gives `None`.
pub fn retry_hint(reason: &str) -> Option<Duration> {
    CloseReason::parse(reason)?.retry_after_ms.map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_class_is_exactly_the_listed_codes() {
        for code in [1001u16, 1006, 1011, 1012, 1013, 4001] {
            assert_eq!(classify(code.into()), CloseAction::Reconnect, "code {code}");
        }
        for code in [1000u16, 1002, 1003, 1005, 1007, 1008, 1009, 1010, 1014, 3000, 4000, 4002, 4003, 4999] {
            assert_eq!(classify(code.into()), CloseAction::Stop, "code {code}");
        }
    }

    #[test]
    fn server_reasons_round_trip_and_fit_a_close_frame() {
        let slow = CloseReason::slow("queue_max_bytes=1048576,queue_max_messages=4096");
        let text = slow.to_json();
        assert_eq!(
            text,
            r#"{"reason":"slow","limit":"queue_max_bytes=1048576,queue_max_messages=4096","retry_after_ms":1000}"#
        );
        assert!(text.len() <= 123, "{} bytes", text.len());
        assert_eq!(CloseReason::parse(&text), Some(slow));
        let drain = CloseReason::drain(CloseCode::Restart, 2999);
        assert_eq!(drain.to_json(), r#"{"reason":"restart","retry_after_ms":2999}"#);
        assert_eq!(CloseReason::drain(CloseCode::Away, 0).reason, "shutdown");
        let limit = CloseReason::limit("publish_bytes_rate");
        assert_eq!(limit.to_json(), r#"{"reason":"limit","limit":"publish_bytes_rate"}"#);
        assert_eq!(CloseReason::parse(&limit.to_json()), Some(limit));
        assert_eq!(CloseReason::token_expired().to_json(), r#"{"reason":"token_expired"}"#);
        let forbidden = CloseReason::forbidden("token not yet valid");
        assert_eq!(forbidden.to_json(), r#"{"reason":"forbidden","detail":"token not yet valid"}"#);
        assert_eq!(CloseReason::parse(&forbidden.to_json()), Some(forbidden));
        assert_eq!((u16::from(TOKEN_EXPIRED), u16::from(FORBIDDEN)), (4001, 4003));
    }

    #[test]
    fn foreign_reasons_parse_leniently_or_not_at_all() {
        assert_eq!(CloseReason::parse(r#" {"retry_after_ms":0} "#).and_then(|r| r.retry_after_ms), Some(0));
        assert_eq!(CloseReason::parse("going away"), None);
        assert_eq!(CloseReason::parse(r#"{"retry_after_ms":-5}"#), None);
    }

    #[test]
    fn reconnectable_codes_reconnect() {
        for code in [1001, 1006, 1011, 1012, 1013, 4001] {
            assert_eq!(classify_close(code), CloseAction::Reconnect, "code {code}");
        }
    }

    #[test]
    fn terminal_codes_stop() {
        for code in [1002, 1003, 1007, 1008, 1009, 1010, 4003] {
            assert_eq!(classify_close(code), CloseAction::Stop, "code {code}");
        }
    }

    #[test]
    fn unlisted_codes_stop() {
        for code in [0, 999, 1000, 1004, 1005, 1014, 1015, 2999, 3000, 4000, 4999, u16::MAX] {
            assert_eq!(classify_close(code), CloseAction::Stop, "code {code}");
        }
    }

    #[test]
    fn retry_hint_reads_json_reason() {
        assert_eq!(retry_hint(r#"{"reason":"slow","retry_after_ms":250}"#), Some(Duration::from_millis(250)));
        assert_eq!(retry_hint(r#" {"retry_after_ms":0} "#), Some(Duration::ZERO));
    }

    #[test]
    fn retry_hint_ignores_anything_else() {
        for reason in [
            "",
            "queue_max_bytes exceeded",
            r#"{"reason":"slow"}"#,
            r#"{"retry_after_ms":-5}"#,
            r#"{"retry_after_ms":"250"}"#,
            r#"{"retry_after_ms":1.5}"#,
            "[1,2]",
            r#"{"retry_after_ms":250"#,
        ] {
            assert_eq!(retry_hint(reason), None, "reason {reason:?}");
        }
    }
}
