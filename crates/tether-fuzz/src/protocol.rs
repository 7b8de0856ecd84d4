//! The `protocol` target: one client text message and one HTTP publish body.

use serde::de::IgnoredAny;
use serde_json::Value;

use super::{hash_of, hex_prefix, Signature};
use tether_proto::protocol::{self, codes, ClientOp, RequestError};

/// Every `code` a refused client message may carry.
const REQUEST_CODES: [&str; 4] = [codes::BAD_JSON, codes::BAD_OP, codes::BAD_REQUEST, codes::BAD_CHANNEL];

/// Parses `data` as a client text message ([`protocol::parse_client_op`]) and as an HTTP
/// publish body ([`protocol::parse_publish_body`]), and panics unless:
/// - an accepted `sub`/`unsub`/`pub` has a valid channel name, a `pub` a 1–128-byte id and a
///   `data` that is compact ([`protocol::compact_json`] leaves it alone), means the same JSON
///   value as the `data` field sent, and frames into a `msg` that is valid JSON;
/// - a refusal has one of the documented codes, `bad_json` exactly when the text is not JSON,
///   an echoed `id` of at most 128 bytes, and becomes a valid JSON `error` object;
/// - an accepted publish body is compact and means the same JSON value as the body; a refused
///   one is `bad_json`.
///
/// Returns the signature of the outcome: the op or the refusal code and reason (up to what it
/// quotes of the client, digits removed, so positions in serde's messages do not count).
pub fn protocol(data: &[u8]) -> Signature {
    // Valid JSON text: UTF-8 (RFC 8259 §8.1) and the grammar (serde_json checks no number
    // range when it only reads the syntax).
    let text = std::str::from_utf8(data).ok();
    let is_json = text.is_some_and(|t| serde_json::from_str::<IgnoredAny>(t).is_ok());
    // Its value, when serde_json can represent it (not for numbers beyond f64, e.g. 1e400,
    // which are valid JSON that tether passes on verbatim).
    let parsed: Option<Value> = serde_json::from_slice(data).ok();
    // A text message reaches `parse_client_op` UTF-8-checked by the codec: its contract holds
    // for UTF-8 text; other bytes only must not make it panic.
    let op = protocol::parse_client_op(data);
    match (&op, text) {
        (Ok(op), Some(_)) => check_op(data, op, is_json, parsed.as_ref()),
        (Err(e), Some(_)) => check_refusal(data, e, is_json, parsed.is_some()),
        (_, None) => {}
    }
    let body = protocol::parse_publish_body(data);
    match &body {
        Ok(raw) => {
            assert!(is_json, "protocol: accepted a publish body that is not JSON: {}", hex_prefix(data, 256));
            assert_compact(raw.get());
            if let Some(v) = &parsed {
                assert!(same_json(raw.get(), v), "protocol: publish body changed meaning: {:?}", raw.get());
            }
        }
        Err(e) => {
            assert_eq!(e.code, codes::BAD_JSON, "protocol: publish body refused with {e:?}");
            assert!(parsed.is_none(), "protocol: valid JSON body refused: {e:?} {}", hex_prefix(data, 256));
            check_error_json(e);
        }
    }
    let shape = match &op {
        Ok(ClientOp::Sub { from, epoch, join_leave, .. }) => {
            format!("sub {} {} {join_leave}", from.is_some(), epoch.is_some())
        }
        Ok(ClientOp::Presence { cursor, .. }) => format!("presence {}", cursor.is_some()),
        Ok(ClientOp::PresenceStats { .. }) => "presence_stats".to_owned(),
        Ok(ClientOp::Unsub { .. }) => "unsub".to_owned(),
        Ok(ClientOp::Pub { .. }) => "pub".to_owned(),
        Ok(ClientOp::Refresh { .. }) => "refresh".to_owned(),
        // Up to the first quote: serde's messages and `unknown op "…"` quote the client.
        Err(e) => {
            let reason = e.reason.split(['"', '`']).next().unwrap_or_default();
            format!("{} {}", e.code, reason.chars().filter(|c| !c.is_ascii_digit()).collect::<String>())
        }
    };
    hash_of((shape, body.is_ok()))
}

fn check_op(data: &[u8], op: &ClientOp, is_json: bool, parsed: Option<&Value>) {
    assert!(is_json, "protocol: accepted text that is not JSON: {}", hex_prefix(data, 256));
    let ch = match op {
        ClientOp::Sub { ch, .. }
        | ClientOp::Unsub { ch }
        | ClientOp::Pub { ch, .. }
        | ClientOp::Presence { ch, .. }
        | ClientOp::PresenceStats { ch } => ch,
        ClientOp::Refresh { token } => {
            assert!(!token.is_empty(), "protocol: accepted an empty refresh token");
            if let Some(parsed) = parsed {
                assert_eq!(parsed["token"].as_str(), Some(token.as_str()), "protocol: token differs from the text's");
            }
            return;
        }
    };
    assert!(protocol::valid_channel(ch), "protocol: accepted channel {ch:?}");
    if let ClientOp::Pub { id, data: payload, .. } = op {
        assert!(protocol::valid_message_id(id), "protocol: accepted id of {} bytes", id.len());
        assert_compact(payload.get());
        let msg = protocol::msg_json(ch, 1, payload.get());
        let msg_ok = serde_json::from_slice::<IgnoredAny>(&msg).is_ok();
        assert!(msg_ok, "protocol: msg with this data is not JSON: {:?}", payload.get());
        if let Some(parsed) = parsed {
            assert_eq!(parsed["id"].as_str(), Some(id.as_str()), "protocol: id differs from the text's");
            assert!(same_json(payload.get(), &parsed["data"]), "protocol: data changed meaning: {:?}", payload.get());
        }
    }
    if let ClientOp::Presence { cursor: Some(c), .. } = op {
        assert!(c.len() <= protocol::MAX_ID_BYTES, "protocol: accepted a cursor of {} bytes", c.len());
    }
    if let Some(parsed) = parsed {
        assert_eq!(parsed["ch"].as_str(), Some(ch.as_str()), "protocol: channel differs from the text's");
    }
}

/// `bad_json` means "not valid JSON" (docs/protocol.md), checked first. Between what the
/// grammar allows (`is_json`) and what serde_json reads as a value (`is_value`) lies text
/// that either answer fits: lone surrogate escapes (`"\ud800"`, RFC 8259 §8.2 leaves them
/// unpredictable) and numbers beyond f64.
fn check_refusal(data: &[u8], e: &RequestError, is_json: bool, is_value: bool) {
    assert!(REQUEST_CODES.contains(&e.code), "protocol: undocumented refusal code {e:?}");
    if e.code == codes::BAD_JSON {
        assert!(!is_value, "protocol: valid JSON refused as bad_json: {e:?} for {}", hex_prefix(data, 256));
    }
    if !is_json {
        assert_eq!(
            e.code,
            codes::BAD_JSON,
            "protocol: text that is not JSON refused as {e:?}: {}",
            hex_prefix(data, 256)
        );
    }
    if let Some(id) = &e.id {
        assert!(id.len() <= protocol::MAX_ID_BYTES, "protocol: echoed id of {} bytes", id.len());
    }
    check_error_json(e);
}

fn check_error_json(e: &RequestError) {
    let v: Value = serde_json::from_slice(&e.to_json())
        .unwrap_or_else(|err| panic!("protocol: error reply is not JSON ({err}): {e:?}"));
    assert!(v["op"] == "error" && v["code"] == e.code && v["reason"] == e.reason.as_str(), "protocol: error reply {v}");
    assert_eq!(v["id"].as_str(), e.id.as_deref(), "protocol: error reply id");
}

fn assert_compact(json: &str) {
    let compact = protocol::compact_json(json);
    assert!(compact == json, "protocol: not compact: {json:?}");
}

/// Whether JSON text `raw` means `value` (both parsed by serde_json, so numbers compare as
/// serde_json reads them).
fn same_json(raw: &str, value: &Value) -> bool {
    serde_json::from_str::<Value>(raw).is_ok_and(|v| v == *value)
}
