//! Presence in Redis (docs/redis.md, "Presence"): cluster-wide members of a presence channel,
//! kept in three keys of the channel's slot, written by the node that owns each member, and
//! announced on the channel's topic, where every node with subscribers coalesces them into
//! its own windows. Sans-IO: the scripts, the key names, the topic payload and the window;
//! `members.rs` runs them.
//!
//! | what | name | type |
//! |---|---|---|
//! | members | `PREFIX{CH}:pz` | sorted set: client id → expiry (ms, Redis's clock) |
//! | member info | `PREFIX{CH}:pi` | hash: client id → member JSON `{"client","user","info"}` |
//! | users | `PREFIX{CH}:pu` | hash: user → members of that user |
//!
//! A member's entry expires `presence.member_ttl_ms` after its node last refreshed it (every
//! third of that); any node that refreshes the channel also removes what expired (a node
//! killed with `kill -9`) and announces those leaves, so members see them within the TTL.
//! Every change is announced once, by the script that made it: `P J <member JSON>` (join) or
//! `P L <member JSON>` (leave) on the channel's topic, beside the messages (`SEQ EPOCH DATA`;
//! a seq is never `P`).

use std::collections::HashMap;

use bytes::Bytes;

use crate::protocol::presence::{presence_diff_frame_raw, presence_reset_frame};

/// Applies a node's membership changes of one channel, in order, and announces each.
///
/// KEYS: members, member info, users. ARGV: `PUBLISH` or `SPUBLISH`, the topic, the TTL in
/// ms, the channel's `presence_max_members`; then per change `J CLIENT JSON` (join) or
/// `L CLIENT -` (leave). Returns one integer per change: 1 applied (or already so), 0 a join
/// refused because the channel has `presence_max_members` members (not tracked).
pub const MEMBERS_LUA: &str = r#"#!lua
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cmd, topic, ttl, max = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
local function user_of(json)
  local ok, m = pcall(cjson.decode, json)
  if ok and type(m) == 'table' and type(m['user']) == 'string' then return m['user'] end
  return nil
end
for i = 5, #ARGV, 3 do
  local kind, client, json = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if kind == 'J' then
    if redis.call('ZSCORE', KEYS[1], client) then
      redis.call('ZADD', KEYS[1], now + ttl, client)
      out[#out + 1] = 1
    elseif redis.call('ZCARD', KEYS[1]) >= max then
      out[#out + 1] = 0
    else
      redis.call('ZADD', KEYS[1], now + ttl, client)
      redis.call('HSET', KEYS[2], client, json)
      local u = user_of(json)
      if u then redis.call('HINCRBY', KEYS[3], u, 1) end
      redis.call(cmd, topic, 'P J ' .. json)
      out[#out + 1] = 1
    end
  else
    if redis.call('ZREM', KEYS[1], client) == 1 then
      local j = redis.call('HGET', KEYS[2], client)
      redis.call('HDEL', KEYS[2], client)
      if j then
        local u = user_of(j)
        if u and redis.call('HINCRBY', KEYS[3], u, -1) <= 0 then redis.call('HDEL', KEYS[3], u) end
        redis.call(cmd, topic, 'P L ' .. j)
      end
    end
    out[#out + 1] = 1
  end
end
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], 2 * ttl) end
return out
"#;

/// Refreshes a node's members of one channel and removes every member whose entry expired
/// (its node stopped refreshing: killed, cut off), announcing each removal as a leave. A
/// refreshed member that is gone (it expired while its node stalled, or Redis restarted empty)
/// is added again and announced as a join.
///
/// KEYS: members, member info, users. ARGV: `PUBLISH` or `SPUBLISH`, the topic, the TTL in
/// ms; then per member of this node `CLIENT JSON`. Returns the number of expired members
/// removed (at most 1000 per call).
pub const REFRESH_LUA: &str = r#"#!lua
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cmd, topic, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local function user_of(json)
  local ok, m = pcall(cjson.decode, json)
  if ok and type(m) == 'table' and type(m['user']) == 'string' then return m['user'] end
  return nil
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 1000)
for _, client in ipairs(expired) do
  redis.call('ZREM', KEYS[1], client)
  local j = redis.call('HGET', KEYS[2], client)
  redis.call('HDEL', KEYS[2], client)
  if j then
    local u = user_of(j)
    if u and redis.call('HINCRBY', KEYS[3], u, -1) <= 0 then redis.call('HDEL', KEYS[3], u) end
    redis.call(cmd, topic, 'P L ' .. j)
  end
end
for i = 4, #ARGV, 2 do
  local client, json = ARGV[i], ARGV[i + 1]
  if redis.call('ZSCORE', KEYS[1], client) then
    redis.call('ZADD', KEYS[1], now + ttl, client)
  else
    redis.call('ZADD', KEYS[1], now + ttl, client)
    redis.call('HSET', KEYS[2], client, json)
    local u = user_of(json)
    if u then redis.call('HINCRBY', KEYS[3], u, 1) end
    redis.call(cmd, topic, 'P J ' .. json)
  end
end
if #ARGV > 3 then
  for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], 2 * ttl) end
end
return #expired
"#;

/// One page of a channel's members: `HSCAN` of the member info from `cursor`, members whose
/// entry expired left out.
///
/// KEYS: members, member info. ARGV: the cursor (`0` for the first page), the page size (a
/// hint, as `HSCAN COUNT` is). Returns the next cursor (`0` when the scan is over), then the
/// member JSON objects.
pub const PAGE_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('HSCAN', KEYS[2], ARGV[1], 'COUNT', ARGV[2])
local out = {r[1]}
local kv = r[2]
for i = 1, #kv, 2 do
  local exp = redis.call('ZSCORE', KEYS[1], kv[i])
  if exp and tonumber(exp) > now then out[#out + 1] = kv[i + 1] end
end
return out
"#;

/// How many are in a channel: members whose entry has not expired, and distinct users.
///
/// KEYS: members, users. Returns `{clients, users}`.
pub const STATS_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf'), redis.call('HLEN', KEYS[2])}
"#;

/// A presence change as it travels on the channel's topic: `P J <member JSON>` (joined) or
/// `P L <member JSON>` (left).
#[derive(Debug, PartialEq, Eq)]
pub struct Change<'a> {
    /// Joined (`true`) or left.
    pub joined: bool,
    /// The member's client id (read from the JSON).
    pub client: String,
    /// The member JSON object, as the owning node wrote it.
    pub json: &'a str,
}

impl<'a> Change<'a> {
    /// Parses a topic payload; `None` when it is not a presence change.
    pub fn parse(payload: &'a [u8]) -> Option<Change<'a>> {
        let rest = payload.strip_prefix(b"P ")?;
        let (joined, json) = match rest.split_first()? {
            (b'J', json) => (true, json.strip_prefix(b" ")?),
            (b'L', json) => (false, json.strip_prefix(b" ")?),
            _ => return None,
        };
        let json = std::str::from_utf8(json).ok()?;
        #[derive(serde::Deserialize)]
        struct Client {
            client: String,
        }
        let client = serde_json::from_str::<Client>(json).ok()?.client;
        Some(Change { joined, client, json })
    }
}

/// One node's window of a channel's changes (as the topic announced them): a join and a
/// leave of one client within the window cancel out, as at a memory broker's home.
#[derive(Debug, Default)]
pub struct Window {
    /// client → (joined, member JSON) of the window in progress.
    changes: HashMap<String, (bool, Box<str>)>,
}

impl Window {
    /// Whether changes wait to be announced.
    pub fn is_open(&self) -> bool {
        !self.changes.is_empty()
    }

    /// Takes `c` into the window.
    pub fn add(&mut self, c: Change<'_>) {
        match self.changes.remove(&c.client) {
            // The opposite change in this window: the others never saw the first one.
            Some((joined, _)) if joined != c.joined => {}
            _ => {
                self.changes.insert(c.client, (c.joined, c.json.into()));
            }
        }
    }

    /// Closes the window: its `presence_diff` frame, `presence_reset` past `max_diff`
    /// changes or when the diff's members would take more than `max_bytes`, or `None` when
    /// they cancelled out. Returns whether it was a reset too.
    pub fn close(&mut self, ch: &str, max_diff: usize, max_bytes: usize) -> Option<(Bytes, bool)> {
        if self.changes.is_empty() {
            return None;
        }
        let changes = std::mem::take(&mut self.changes);
        let bytes: usize = changes.values().map(|(_, json)| json.len() + 1).sum();
        if changes.len() > max_diff || bytes > max_bytes {
            return Some((presence_reset_frame(ch), true));
        }
        let mut sorted: Vec<(String, (bool, Box<str>))> = changes.into_iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let joins = sorted.iter().filter(|(_, (j, _))| *j).map(|(_, (_, m))| &**m);
        let leaves = sorted.iter().filter(|(_, (j, _))| !*j).map(|(_, (_, m))| &**m);
        Some((presence_diff_frame_raw(ch, joins, leaves), false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(frame: &Bytes) -> serde_json::Value {
        let (_, _, _, p) = crate::ws::codec::decode_server_frame(frame).unwrap().unwrap();
        serde_json::from_slice(&p).unwrap()
    }

    #[test]
    fn changes_parse_from_the_topic_and_messages_do_not() {
        let c = Change::parse(br#"P J {"client":"n-0-1-1","user":"ada"}"#).unwrap();
        assert_eq!((c.joined, c.client.as_str(), c.json), (true, "n-0-1-1", r#"{"client":"n-0-1-1","user":"ada"}"#));
        assert!(!Change::parse(br#"P L {"client":"x"}"#).unwrap().joined);
        assert_eq!(Change::parse(br#"7 e1 {"client":"x"}"#), None, "a message");
        assert_eq!(Change::parse(b"P X {}"), None);
        assert_eq!(Change::parse(b"P J not-json"), None);
    }

    #[test]
    fn a_window_cancels_join_and_leave_of_one_client_and_resets_past_max() {
        let mut w = Window::default();
        for p in [
            &br#"P J {"client":"a"}"#[..],
            br#"P J {"client":"b"}"#,
            br#"P L {"client":"b"}"#,
            br#"P L {"client":"c"}"#,
        ] {
            w.add(Change::parse(p).unwrap());
        }
        let (frame, reset) = w.close("room", 10, usize::MAX).unwrap();
        assert!(!reset);
        assert_eq!(
            text(&frame),
            serde_json::json!({"op":"presence_diff","ch":"room","joins":[{"client":"a"}],"leaves":[{"client":"c"}]})
        );
        assert!(w.close("room", 10, usize::MAX).is_none());
        for i in 0..3 {
            w.add(Change::parse(format!(r#"P J {{"client":"{i}"}}"#).as_bytes()).unwrap());
        }
        let (frame, reset) = w.close("room", 2, usize::MAX).unwrap();
        assert!(reset);
        assert_eq!(text(&frame), serde_json::json!({"op":"presence_reset","ch":"room"}));
    }
}
