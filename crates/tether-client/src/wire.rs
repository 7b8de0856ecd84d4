//! Wire protocol v1 frames as the client sees them (docs/protocol.md): `sub`, `unsub`, `pub`,
//! `refresh` out (`presence` and `presence_stats` are `presence`'s); `subscribed`, `msg`,
//! `reset`, `ack`, `error`, `refreshed`, `presence`, `presence_stats`, `presence_diff`,
//! `presence_reset` in.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::presence::Member;
use super::ClientError;

pub use tether_proto::protocol::valid_channel;

pub(crate) fn check_channel(name: &str) -> Result<(), ClientError> {
    if valid_channel(name) {
        Ok(())
    } else {
        Err(ClientError::InvalidChannel(name.to_string()))
    }
}

/// A fresh publish id: 128 random bits as 32 lowercase hex digits. Random rather than a
/// counter so that ids stay unique across client restarts within the server's dedup window.
pub fn new_publish_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[derive(Serialize)]
struct Sub<'a> {
    op: &'static str,
    ch: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    join_leave: bool,
}

#[derive(Serialize)]
struct Pub<'a, T: ?Sized> {
    op: &'static str,
    ch: &'a str,
    id: &'a str,
    data: &'a T,
}

/// `{"op":"sub","ch":…}` plus `from`/`epoch` when known, and `"join_leave":true` when asked.
pub(crate) fn sub_frame(ch: &str, from: Option<u64>, epoch: Option<&str>, join_leave: bool) -> String {
    let sub = Sub { op: "sub", ch, from, epoch, join_leave };
    serde_json::to_string(&sub).unwrap_or_default()
}

/// `{"op":"unsub","ch":…}`.
pub(crate) fn unsub_frame(ch: &str) -> String {
    let unsub = Sub { op: "unsub", ch, from: None, epoch: None, join_leave: false };
    serde_json::to_string(&unsub).unwrap_or_default()
}

/// `{"op":"refresh","token":…}` (docs/security.md).
pub(crate) fn refresh_frame(token: &str) -> String {
    serde_json::json!({"op": "refresh", "token": token}).to_string()
}

/// `{"op":"pub","ch":…,"id":…,"data":…}`.
///
/// # Errors
/// [`ClientError::InvalidData`] when `data` cannot be serialized as JSON.
pub(crate) fn pub_frame<T: Serialize + ?Sized>(ch: &str, id: &str, data: &T) -> Result<String, ClientError> {
    serde_json::to_string(&Pub { op: "pub", ch, id, data }).map_err(|e| ClientError::InvalidData(e.to_string()))
}

/// Any server frame, flat: which fields are required depends on `op`, checked by the caller.
#[derive(Debug, Deserialize)]
pub(crate) struct Inbound {
    pub op: String,
    pub ch: Option<String>,
    pub seq: Option<u64>,
    #[serde(default, deserialize_with = "opaque_text")]
    pub epoch: Option<String>,
    pub recovered: Option<bool>,
    // `"data": null` is a valid payload, so null must not collapse into "absent".
    #[serde(default, deserialize_with = "present_raw")]
    pub data: Option<Box<RawValue>>,
    pub reason: Option<String>,
    pub oldest: Option<u64>,
    pub id: Option<String>,
    #[serde(default, deserialize_with = "opaque_text")]
    pub code: Option<String>,
    /// On an `unavailable` or `unknown_outcome` error: wait this long (milliseconds) before
    /// sending it again (with the same id); on a `limit` error, before asking again.
    pub retry_after_ms: Option<u64>,
    /// A `presence` page's members.
    pub members: Option<Vec<Member>>,
    /// A `presence` page's cursor for the next page, when more follow.
    pub next: Option<String>,
    /// A `presence_diff`'s joins and leaves.
    pub joins: Option<Vec<Member>>,
    pub leaves: Option<Vec<Member>>,
    /// A `presence_stats`'s counts.
    pub clients: Option<u64>,
    pub users: Option<u64>,
}

fn present_raw<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// Accepts a string or any other JSON value (rendered as JSON text), so an `epoch` or error
/// `code` the server chose to send as a number still round-trips as an opaque token.
fn opaque_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Null => None,
        Value::String(s) => Some(s),
        other => Some(other.to_string()),
    })
}

impl Inbound {
    pub(crate) fn parse(text: &str) -> Result<Self, ClientError> {
        serde_json::from_str(text).map_err(|e| ClientError::Protocol(format!("server frame is not a v1 object: {e}")))
    }
}

/// `field`, or a protocol error naming the `op` and the missing field.
pub(crate) fn need<T>(op: &str, field: Option<T>, name: &str) -> Result<T, ClientError> {
    field.ok_or_else(|| ClientError::Protocol(format!("`{op}` frame without `{name}`")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names() {
        assert!(valid_channel("news"));
        assert!(valid_channel("prices.EUR:usd_1-2"));
        assert!(valid_channel(&"a".repeat(128)));
        assert!(!valid_channel(""));
        assert!(!valid_channel(&"a".repeat(129)));
        assert!(!valid_channel("a b"));
        assert!(!valid_channel("a/b"));
        assert!(!valid_channel("é"));
    }

    #[test]
    fn ids_are_unique_hex() {
        let a = new_publish_id();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_publish_id());
    }

    #[test]
    fn outbound_frames() {
        assert_eq!(sub_frame("n", None, None, false), r#"{"op":"sub","ch":"n"}"#);
        assert_eq!(sub_frame("n", Some(0), Some("e"), false), r#"{"op":"sub","ch":"n","from":0,"epoch":"e"}"#);
        assert_eq!(sub_frame("n", None, None, true), r#"{"op":"sub","ch":"n","join_leave":true}"#);
        assert_eq!(unsub_frame("n"), r#"{"op":"unsub","ch":"n"}"#);
        assert_eq!(refresh_frame("a.b.c"), r#"{"op":"refresh","token":"a.b.c"}"#);
        let data: Box<RawValue> = serde_json::from_str(r#"{"x": [1, 2]}"#).expect("json");
        assert_eq!(
            pub_frame("n", "id1", &*data).expect("frame"),
            r#"{"op":"pub","ch":"n","id":"id1","data":{"x": [1, 2]}}"#
        );
    }

    #[test]
    fn inbound_frames() {
        let m = Inbound::parse(r#"{"op":"msg","ch":"n","seq":3,"data":null}"#).expect("msg");
        assert_eq!(m.data.as_deref().map(RawValue::get), Some("null"));
        let m = Inbound::parse(r#"{"op":"msg","ch":"n","seq":3}"#).expect("msg");
        assert!(need(&m.op, m.data, "data").is_err());
        let s = Inbound::parse(r#"{"op":"subscribed","ch":"n","seq":0,"epoch":17}"#).expect("s");
        assert_eq!(s.epoch.as_deref(), Some("17"));
        let e = Inbound::parse(r#"{"op":"error","code":"bad_channel","reason":"x"}"#).expect("e");
        assert_eq!(e.code.as_deref(), Some("bad_channel"));
        let d = Inbound::parse(r#"{"op":"presence_diff","ch":"r","joins":[{"client":"a","info":[1]}],"leaves":[]}"#)
            .expect("diff");
        let joins = d.joins.expect("joins");
        assert_eq!((joins[0].client.as_str(), joins[0].info.as_deref().map(RawValue::get)), ("a", Some("[1]")));
        assert!(
            Inbound::parse(r#"{"op":"presence","ch":"r","members":[{"user":"u"}]}"#).is_err(),
            "a member has a client"
        );
        assert!(Inbound::parse("[1]").is_err());
        assert!(Inbound::parse(r#"{"ch":"n"}"#).is_err());
    }
}
