//! Presence on the wire (docs/protocol.md, "Presence"): who is in a channel, as members
//! (`{"client","user","info"}`), and the frames that carry them — the answers to `presence`
//! and `presence_stats`, and the coalesced `presence_diff` / `presence_reset` that
//! `join_leave` subscribers receive.
//!
//! A diff or a reset is encoded once per window at the channel's home and shared by every
//! subscriber that asked for join/leave, as a `msg` frame is.

use std::sync::Arc;

use bytes::Bytes;

use super::{push_channel, push_json_str, push_u64};

/// One member of a channel's presence: one connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Member {
    /// The connection's id, unique across nodes and over a node's life
    /// (`<node id>-<core>-<slot>-<generation>`; opaque to clients).
    pub client: Arc<str>,
    /// The JWT `sub` of the connection's token; `None` without `[auth]`.
    pub user: Option<Arc<str>>,
    /// The token's `info` claim, compact JSON (bounded by `presence.info_max_bytes`), if it
    /// had one.
    pub info: Option<Arc<str>>,
}

impl Member {
    /// Bytes this member adds to a members array (its JSON object and a comma).
    pub fn json_len(&self) -> usize {
        let user = self.user.as_ref().map_or(0, |u| u.len() * 6 + 10);
        let info = self.info.as_ref().map_or(0, |i| i.len() + 8);
        self.client.len() + 14 + user + info
    }
}

/// Appends `m` as `{"client":…[,"user":…][,"info":…]}`: `user` without `[auth]` and `info`
/// without an `info` claim are left out.
pub fn push_member(out: &mut Vec<u8>, m: &Member) {
    out.extend_from_slice(b"{\"client\":");
    push_json_str(out, &m.client);
    if let Some(u) = &m.user {
        out.extend_from_slice(b",\"user\":");
        push_json_str(out, u);
    }
    if let Some(i) = &m.info {
        out.extend_from_slice(b",\"info\":");
        out.extend_from_slice(i.as_bytes());
    }
    out.push(b'}');
}

fn push_members<'a>(out: &mut Vec<u8>, members: impl IntoIterator<Item = &'a Member>) {
    out.push(b'[');
    for (i, m) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_member(out, m);
    }
    out.push(b']');
}

/// `{"op":"presence","ch":CH,"members":[…][,"next":CURSOR]}`: one page of the answer to
/// `presence`; `next`, when present, is the `cursor` of the next page.
pub fn presence_json<'a>(ch: &str, members: impl IntoIterator<Item = &'a Member>, next: Option<&str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"op\":\"presence\",\"ch\":");
    push_channel(&mut out, ch);
    out.extend_from_slice(b",\"members\":");
    push_members(&mut out, members);
    if let Some(n) = next {
        out.extend_from_slice(b",\"next\":");
        push_json_str(&mut out, n);
    }
    out.push(b'}');
    out
}

/// `{"op":"presence_stats","ch":CH,"clients":N,"users":M}`: the answer to `presence_stats`
/// (`users` counts distinct JWT `sub`s; without `[auth]` it is 0).
pub fn presence_stats_json(ch: &str, clients: u64, users: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(80 + ch.len());
    out.extend_from_slice(b"{\"op\":\"presence_stats\",\"ch\":");
    push_channel(&mut out, ch);
    out.extend_from_slice(b",\"clients\":");
    push_u64(&mut out, clients);
    out.extend_from_slice(b",\"users\":");
    push_u64(&mut out, users);
    out.push(b'}');
    out
}

/// The `presence_diff` frame of one window: `{"op":"presence_diff","ch":CH,"joins":[…],
/// "leaves":[…]}`, framed once for every `join_leave` subscriber (an unmasked text frame).
pub fn presence_diff_frame<'a>(
    ch: &str,
    joins: impl IntoIterator<Item = &'a Member>,
    leaves: impl IntoIterator<Item = &'a Member>,
) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"op\":\"presence_diff\",\"ch\":");
    push_channel(&mut out, ch);
    out.extend_from_slice(b",\"joins\":");
    push_members(&mut out, joins);
    out.extend_from_slice(b",\"leaves\":");
    push_members(&mut out, leaves);
    out.push(b'}');
    crate::ws::codec::text_frame(&out)
}

/// [`presence_diff_frame`] of members already encoded as JSON objects (what
/// [`push_member`] writes): a broker that keeps members as JSON text (Redis) frames them
/// without decoding them.
pub fn presence_diff_frame_raw<'a>(
    ch: &str,
    joins: impl IntoIterator<Item = &'a str>,
    leaves: impl IntoIterator<Item = &'a str>,
) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"op\":\"presence_diff\",\"ch\":");
    push_channel(&mut out, ch);
    out.extend_from_slice(b",\"joins\":");
    push_raw_list(&mut out, joins);
    out.extend_from_slice(b",\"leaves\":");
    push_raw_list(&mut out, leaves);
    out.push(b'}');
    crate::ws::codec::text_frame(&out)
}

/// `{"op":"presence","ch":CH,"members":[…][,"next":CURSOR]}` of members already encoded as
/// JSON objects.
pub fn presence_json_raw<'a>(ch: &str, members: impl IntoIterator<Item = &'a str>, next: Option<&str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"op\":\"presence\",\"ch\":");
    push_channel(&mut out, ch);
    out.extend_from_slice(b",\"members\":");
    push_raw_list(&mut out, members);
    if let Some(n) = next {
        out.extend_from_slice(b",\"next\":");
        push_json_str(&mut out, n);
    }
    out.push(b'}');
    out
}

/// Appends a JSON array of `items`, each already a JSON value.
fn push_raw_list<'a>(out: &mut Vec<u8>, items: impl IntoIterator<Item = &'a str>) {
    out.push(b'[');
    for (i, m) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(m.as_bytes());
    }
    out.push(b']');
}

/// Member `m` as its JSON object (what [`push_member`] appends).
pub fn member_json(m: &Member) -> String {
    let mut out = Vec::with_capacity(m.json_len());
    push_member(&mut out, m);
    // push_member writes JSON: valid UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// The `presence_reset` frame: `{"op":"presence_reset","ch":CH}`, sent instead of a diff when
/// one window's changes exceed `presence.max_diff`: the member list changed too much to
/// describe; ask `presence` again.
pub fn presence_reset_frame(ch: &str) -> Bytes {
    let mut out = Vec::with_capacity(40 + ch.len());
    out.extend_from_slice(b"{\"op\":\"presence_reset\",\"ch\":");
    push_channel(&mut out, ch);
    out.push(b'}');
    crate::ws::codec::text_frame(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(client: &str, user: Option<&str>, info: Option<&str>) -> Member {
        Member { client: client.into(), user: user.map(Into::into), info: info.map(Into::into) }
    }

    fn payload(frame: &Bytes) -> serde_json::Value {
        let (_, _, _, p) = crate::ws::codec::decode_server_frame(frame).unwrap().unwrap();
        serde_json::from_slice(&p).unwrap()
    }

    #[test]
    fn members_leave_out_what_is_unknown_and_escape_users() {
        let page = presence_json(
            "room",
            &[m("n-0-1-1", None, None), m("n-0-2-1", Some("a\"b"), Some("{\"x\":1}"))],
            Some("n-0-2-1"),
        );
        let v: serde_json::Value = serde_json::from_slice(&page).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"op":"presence","ch":"room","members":[{"client":"n-0-1-1"},{"client":"n-0-2-1","user":"a\"b","info":{"x":1}}],"next":"n-0-2-1"})
        );
        let last = presence_json("room", &[], None);
        assert_eq!(last, br#"{"op":"presence","ch":"room","members":[]}"#);
    }

    #[test]
    fn stats_diff_and_reset_are_json_objects() {
        assert_eq!(presence_stats_json("room", 3, 2), br#"{"op":"presence_stats","ch":"room","clients":3,"users":2}"#);
        let d = presence_diff_frame("room", &[m("a", Some("u"), None)], &[m("b", None, None)]);
        assert_eq!(
            payload(&d),
            serde_json::json!({"op":"presence_diff","ch":"room","joins":[{"client":"a","user":"u"}],"leaves":[{"client":"b"}]})
        );
        assert_eq!(payload(&presence_reset_frame("room")), serde_json::json!({"op":"presence_reset","ch":"room"}));
    }

    #[test]
    fn raw_frames_equal_the_typed_ones() {
        let (a, b) = (m("a", Some("u"), Some("{\"k\":[1]}")), m("b", None, None));
        let typed = presence_diff_frame("room", [&a], [&b]);
        let (ja, jb) = (member_json(&a), member_json(&b));
        assert_eq!(presence_diff_frame_raw("room", [ja.as_str()], [jb.as_str()]), typed);
        assert_eq!(
            presence_json_raw("room", [ja.as_str(), jb.as_str()], Some("7")),
            presence_json("room", [&a, &b], Some("7"))
        );
    }

    #[test]
    fn json_len_bounds_the_encoding() {
        for mem in [m("n-1-2-3", None, None), m("x", Some("\u{1}\u{2}\"\\"), Some("[1,2,3]"))] {
            let mut out = Vec::new();
            push_member(&mut out, &mem);
            assert!(out.len() < mem.json_len(), "{} >= {}", out.len(), mem.json_len());
        }
    }
}
