//! Which close codes a client reconnects on (docs/protocol.md, close codes; codes from RFC 6455
//! §7.4.1 and the IANA WebSocket close code registry).

use std::time::Duration;

use crate::protocol::close::CloseReason;
pub use crate::protocol::close::{classify, CloseAction, CloseCode};

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
