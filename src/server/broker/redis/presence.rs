//! Presence in Redis (docs/redis.md, "Presence"): cluster-wide members of a presence channel,
//! kept in three keys of the channel's slot, written by the node that owns each member, and
//! announced on the channel's topic, where every node with subscribers coalesces them into
//! its own windows. Sans-IO: the scripts, the key names, the topic payload and the window;
//! `members.rs` runs them.
//!
//! | what | name | type |
//! |---|---|---|
//! | members | `PREFIX{CH}:pz` | sorted set: client id → expiry (ms, Redis's clock) |
//! | member entries | `PREFIX{CH}:pl` | sorted set, every score 0: [`entry`] `CLIENT \0 JSON [\0 USER]` |
//! | users | `PREFIX{CH}:pu` | hash: user → members of that user |
//!
//! The entries sort by client id (byte order), so a page is a `ZRANGEBYLEX` after the last
//! client of the previous page: a page never exceeds `presence.page_size`, and paging through
//! a channel that changes meanwhile lists every member present throughout exactly once
//! (members that come or go meanwhile may be listed or not). A member's user is stored as
//! bytes of its own beside the JSON, so counting users never decodes client JSON in Lua.
//!
//! A member's entry expires `presence.member_ttl_ms` after its node last refreshed it (every
//! third of that); any node that refreshes the channel also removes what expired (a node
//! killed with `kill -9`) and announces those leaves, so members see them within the TTL.
//! Every change is announced once, by the script that made it: `P J <member JSON>` (join) or
//! `P L <member JSON>` (leave) on the channel's topic, beside the messages (`SEQ EPOCH DATA`;
//! a seq is never `P`). A node that cannot vouch that a leave of a channel will be announced
//! (its call failed while Redis was away) announces `P R` once its refresh of the channel
//! succeeds again: every node's `join_leave` subscribers get `presence_reset`.

use std::collections::HashMap;

use bytes::Bytes;

use crate::protocol::presence::{presence_diff_frame_raw, presence_reset_frame};

/// The topic payload asking every node's `join_leave` subscribers of the channel to fetch
/// the members again (`presence_reset`).
pub const RESET_PAYLOAD: &[u8] = b"P R";

/// The longest `cursor` taken, in bytes (a client id; the HTTP API's bound too).
pub const MAX_CURSOR_BYTES: usize = 128;

/// A member's entry in `:pl`: `CLIENT \0 JSON`, then `\0 USER` when it has a user. Neither a
/// client id nor serialized JSON holds a NUL byte, so the first two NULs split it whatever
/// the user holds.
pub fn entry(client: &str, json: &str, user: Option<&str>) -> String {
    let mut e = String::with_capacity(client.len() + json.len() + user.map_or(0, |u| u.len() + 1) + 1);
    e.push_str(client);
    e.push('\0');
    e.push_str(json);
    if let Some(u) = user {
        e.push('\0');
        e.push_str(u);
    }
    e
}

/// Whether `cursor` can be the `next` of a page: a client id (`NODE-CORE-SLOT-GENERATION`,
/// the last three decimal, 1-[`MAX_CURSOR_BYTES`] bytes of printable ASCII without spaces).
/// Any other is refused (`bad_request`) before Redis sees it.
pub fn valid_cursor(cursor: &str) -> bool {
    let mut parts = cursor.rsplitn(4, '-');
    let decimal = |p: &str| p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u64>().is_ok();
    let numbers = parts.by_ref().take(3).filter(|p| decimal(p));
    (1..=MAX_CURSOR_BYTES).contains(&cursor.len())
        && cursor.bytes().all(|b| b.is_ascii_graphic())
        && numbers.count() == 3
        && parts.next().is_some_and(|node| !node.is_empty())
}

/// The `ZRANGEBYLEX` start of the page after `cursor` (a client id; `None`: the first page).
/// Every entry of client `cursor` sorts below `cursor \x01` (its next byte is NUL) and every
/// entry of a greater client above it (client ids hold no byte below `!`).
pub fn page_start(cursor: Option<&str>) -> String {
    match cursor {
        None => "-".into(),
        Some(c) => format!("[{c}\x01"),
    }
}

/// Lua shared by the scripts: Redis's time in ms, and an entry split into client, member JSON
/// and user (`nil` when it has none).
macro_rules! lua_common {
    () => {
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function split(e)
  local a = string.find(e, '\0', 1, true)
  if not a then return e, e, nil end
  local b = string.find(e, '\0', a + 1, true)
  if b then return string.sub(e, 1, a - 1), string.sub(e, a + 1, b - 1), string.sub(e, b + 1) end
  return string.sub(e, 1, a - 1), string.sub(e, a + 1), nil
end
local function entry_of(key, client)
  return redis.call('ZRANGEBYLEX', key, '[' .. client .. '\0', '(' .. client .. '\1', 'LIMIT', 0, 1)[1]
end
local function add(cmd, topic, ttl, e)
  local client, json, user = split(e)
  redis.call('ZADD', KEYS[1], now + ttl, client)
  redis.call('ZADD', KEYS[2], 0, e)
  if user then redis.call('HINCRBY', KEYS[3], user, 1) end
  redis.call(cmd, topic, 'P J ' .. json)
end
local function remove(cmd, topic, client)
  if redis.call('ZREM', KEYS[1], client) == 0 then return end
  local e = entry_of(KEYS[2], client)
  if not e then return end
  redis.call('ZREM', KEYS[2], e)
  local _, json, user = split(e)
  if user and redis.call('HINCRBY', KEYS[3], user, -1) <= 0 then redis.call('HDEL', KEYS[3], user) end
  redis.call(cmd, topic, 'P L ' .. json)
end
"#
    };
}

/// Applies a node's membership changes of one channel, in order, and announces each.
///
/// KEYS: members, member entries, users. ARGV: `PUBLISH` or `SPUBLISH`, the topic, the TTL in
/// ms, the channel's `presence_max_members`; then per change `J ENTRY` (join, an [`entry`])
/// or `L CLIENT` (leave). Returns one integer per change: 1 applied (or already so), 0 a join
/// refused because the channel has `presence_max_members` members (not tracked).
pub const MEMBERS_LUA: &str = concat!(
    "#!lua\n",
    lua_common!(),
    r#"
local cmd, topic, ttl, max = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
for i = 5, #ARGV, 2 do
  local kind, arg = ARGV[i], ARGV[i + 1]
  if kind == 'J' then
    local client = split(arg)
    if redis.call('ZSCORE', KEYS[1], client) then
      redis.call('ZADD', KEYS[1], now + ttl, client)
      out[#out + 1] = 1
    elseif redis.call('ZCARD', KEYS[1]) >= max then
      out[#out + 1] = 0
    else
      add(cmd, topic, ttl, arg)
      out[#out + 1] = 1
    end
  else
    remove(cmd, topic, arg)
    out[#out + 1] = 1
  end
end
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], 2 * ttl) end
return out
"#
);

/// Refreshes a node's members of one channel and removes every member whose entry expired
/// (its node stopped refreshing: killed, cut off), announcing each removal as a leave. A
/// refreshed member that is gone (it expired while its node stalled, or Redis restarted empty)
/// is added again and announced as a join. With the reset flag set, `P R` is announced last
/// ([`RESET_PAYLOAD`]): changes of this node may have been lost.
///
/// KEYS: members, member entries, users. ARGV: `PUBLISH` or `SPUBLISH`, the topic, the TTL in
/// ms, the reset flag (`1` or `0`); then per member of this node its [`entry`]. Returns the
/// number of expired members removed (at most 1000 per call).
pub const REFRESH_LUA: &str = concat!(
    "#!lua\n",
    lua_common!(),
    r#"
local cmd, topic, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 1000)
for _, client in ipairs(expired) do remove(cmd, topic, client) end
for i = 5, #ARGV do
  local client = split(ARGV[i])
  if redis.call('ZSCORE', KEYS[1], client) then
    redis.call('ZADD', KEYS[1], now + ttl, client)
  else
    add(cmd, topic, ttl, ARGV[i])
  end
end
if #ARGV > 4 then
  for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], 2 * ttl) end
end
if ARGV[4] == '1' then redis.call(cmd, topic, 'P R') end
return #expired
"#
);

/// One page of a channel's members: the entries from `start` ([`page_start`]) on, in client
/// order, members whose entry expired left out.
///
/// KEYS: members, member entries. ARGV: the start, the page size, the most bytes of member
/// JSON (each counted with a comma) a page holds past its first member. Returns the client id
/// to continue after (empty when the page is the last), then the member JSON objects (at most
/// the page size).
pub const PAGE_LUA: &str = concat!(
    // No shebang: a script without one that writes nothing runs under `maxmemory` too.
    lua_common!(),
    r#"
local n, max_bytes = tonumber(ARGV[2]), tonumber(ARGV[3])
local es = redis.call('ZRANGEBYLEX', KEYS[2], ARGV[1], '+', 'LIMIT', 0, n + 1)
local out, bytes, prev = {''}, 0, nil
for i = 1, math.min(#es, n) do
  local client, json = split(es[i])
  local exp = redis.call('ZSCORE', KEYS[1], client)
  if exp and tonumber(exp) > now then
    if #out > 1 and bytes + #json + 1 > max_bytes then
      out[1] = prev
      return out
    end
    out[#out + 1] = json
    bytes = bytes + #json + 1
  end
  prev = client
  if i == n and #es > n then out[1] = client end
end
return out
"#
);

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
    /// This node cannot vouch for the changes its subscribers saw: the window closes with a
    /// `presence_reset`, whatever it holds.
    reset: bool,
}

impl Window {
    /// Whether changes (or a reset) wait to be announced.
    pub fn is_open(&self) -> bool {
        self.reset || !self.changes.is_empty()
    }

    /// Makes the window close with a `presence_reset` (changes may have been missed: a link
    /// was down, Redis lost data, another node's changes failed). Resets that come within one
    /// window are one frame.
    pub fn reset(&mut self) {
        self.reset = true;
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
    /// changes, when the diff's members would take more than `max_bytes`, or after
    /// [`Window::reset`]; `None` when they cancelled out. Returns whether it was a reset too.
    pub fn close(&mut self, ch: &str, max_diff: usize, max_bytes: usize) -> Option<(Bytes, bool)> {
        let reset = std::mem::take(&mut self.reset);
        if self.changes.is_empty() && !reset {
            return None;
        }
        let changes = std::mem::take(&mut self.changes);
        let bytes: usize = changes.values().map(|(_, json)| json.len() + 1).sum();
        if reset || changes.len() > max_diff || bytes > max_bytes {
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

    #[test]
    fn a_reset_takes_the_whole_window_and_resets_within_one_window_are_one_frame() {
        let mut w = Window::default();
        w.add(Change::parse(br#"P J {"client":"a"}"#).unwrap());
        w.reset();
        w.reset();
        assert!(w.is_open());
        let (frame, reset) = w.close("room", 10, usize::MAX).unwrap();
        assert!(reset);
        assert_eq!(text(&frame), serde_json::json!({"op":"presence_reset","ch":"room"}));
        assert!(!w.is_open());
        assert!(w.close("room", 10, usize::MAX).is_none(), "one frame");
    }

    #[test]
    fn entries_split_at_their_first_two_nuls_and_cursors_start_after_their_client() {
        assert_eq!(entry("n-0-1-1", r#"{"client":"n-0-1-1"}"#, None), "n-0-1-1\0{\"client\":\"n-0-1-1\"}");
        assert_eq!(entry("c", "{}", Some("a\0b")), "c\0{}\0a\0b");
        assert_eq!(page_start(None), "-");
        let start = page_start(Some("n-0-1-1"));
        // Every entry of the cursor's client sorts below the start, a longer client id above.
        assert!(entry("n-0-1-1", "{}", Some("\u{10ffff}")).as_str() < &start[1..]);
        assert!(entry("n-0-1-10", "{}", None).as_str() > &start[1..]);
        assert!(entry("n-0-1-2", "{}", None).as_str() > &start[1..]);
        assert!(valid_cursor("n-0-1-1"));
        assert!(valid_cursor("web-3-a1b2c3d4-0-17-4"));
        let long = format!("{}-0-1-1", "h".repeat(122));
        assert!(valid_cursor(&long));
        for bad in [
            "",
            "18446744073709551616",
            "0-17-4",
            "-0-1-1",
            "n-0-1-18446744073709551616",
            "n-0-+1-1",
            "n 0-1-1-1",
            "n\u{0}-0-1-1",
            "é-0-1-1",
            &format!("h{long}"),
        ] {
            assert!(!valid_cursor(bad), "{bad:?}");
        }
    }
}
