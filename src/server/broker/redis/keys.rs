//! What tether stores in Redis and how it is named: the keys of a channel, its pub/sub topic,
//! the payload of a published message, the server-side scripts and the arguments of a
//! publish call. Sans-IO and unit-tested; the broker thread only sends what this file builds.
//!
//! Every key of channel `CH` carries the hash tag `{CH}`, so on a Redis Cluster all of them
//! (and the sharded pub/sub topic) live in one slot and one script may touch them all:
//!
//! | what | name | type |
//! |---|---|---|
//! | meta | `PREFIX{CH}:m` | hash: `seq` (last seq), `epoch` |
//! | history | `PREFIX{CH}:s` | stream, entry id `SEQ-0`, field `d` = the message JSON |
//! | dedup | `PREFIX{CH}:d:ID` | string: the seq stored for publish id `ID` |
//! | fences | `PREFIX{CH}:f` | hash: feed id → highest fencing token seen (docs/feeds.md) |
//! | topic | `PREFIX{CH}` | (sharded) pub/sub channel, payload `SEQ EPOCH DATA` |
//!
//! Two names are the node's, not a channel's (they hold no `{`, so no channel's name can
//! collide with them): `PREFIXrevoked`, a sorted set of the revocations in force (member
//! [`revocation_member`], score its `until_ms`), and `PREFIXcontrol`, the (sharded) pub/sub
//! topic of the server API's node-wide actions, payload `ORIGIN JSON`.

use crate::auth::revoke::Revocation;

/// The publish script: stores a batch of publishes (fence check, dedup check, seq, history,
/// fan-out, expiry), in order, in one call.
///
/// With `C` channels and `N` publishes (build them with [`PublishCall`]):
/// - KEYS: per channel `c` = 1..C its meta then its stream (`KEYS[2c-1]`, `KEYS[2c]`), then per
///   publish `i` = 1..N its dedup key (`KEYS[2C+i]`; for a publish without id any key of its
///   channel, untouched, so that every key stays in the channel's slot), then per *fenced*
///   publish, in publish order, its channel's fence hash (`KEYS[2C+N+f]` for the `f`-th fenced
///   publish): an unfenced publish costs no key and no argument;
/// - ARGV: `C`, ttl in ms, dedup window in ms, the epoch for a channel without one, `PUBLISH` or
///   `SPUBLISH`, the deadline (ms since the Unix epoch on Redis's clock); then per channel its
///   topic and history length (0 keeps none); then per
///   publish its channel's index `c`, its flag and its data. The flag is `1` when the publish
///   has an id, else `0`; a fenced publish appends ` TOKEN FEED` (its fencing token in
///   decimal and its feed id, which holds no space), e.g. `1 7 btc`.
///
/// Returns `N` triples `seq, epoch, kind` in one flat array, in publish order; `kind` is `0`
/// for a publish stored now, `1` for a duplicate, `2` for a fenced-out one.
///
/// **Deadline.** The script first reads Redis `TIME`; past the deadline it writes nothing and
/// returns the status reply [`LATE`]. The caller waits for the reply a little longer than the
/// deadline, so a call that Redis runs late (it slept, or was busy with another command) is a
/// no-op rather than a publish stored after its publisher was told the outcome is unknown,
/// and a `LATE` reply proves that nothing was stored. (`TIME` before writes is allowed: Redis
/// 7 replicates a script's effects, not the script.)
///
/// A fenced publish is checked first: when its feed's field in the fence hash holds a higher
/// token (compared as decimal strings, exact over the whole u64 range), it is fenced out: its
/// triple is `highest token, epoch (or empty), 2`, and nothing is written for it (no seq, no
/// dedup key, no history, no fan-out). Otherwise the field is set to its token, the hash's
/// expiry pushed to the ttl, and the publish goes on as an unfenced one. A publish
/// whose dedup key exists (stored by an earlier call, or by an earlier publish of this call)
/// is a duplicate: it returns the seq stored for it and the channel's epoch (empty if the
/// channel has none), and publishes nothing. Any other gets the channel's next seq: its dedup
/// key is set to that seq for the window (`SET NX GET`: the check and the claim are one
/// command), its entry `SEQ-0` added to the stream (trimmed to about the history length),
/// `SEQ EPOCH DATA` published on the topic. Each channel's meta is read once (`HMGET`) and its
/// `seq` written once, and its expiry (meta and stream) pushed to the ttl once, at the end.
///
/// A command that fails (`WRONGTYPE`, a stream whose top is past the meta's seq) ends the call
/// at that publish: the reply is then the triples of the `K` publishes before it (stored, or
/// duplicates) followed by one string, the error (`3K + 1` elements, never a multiple of 3);
/// that publish and the ones after it are not stored. What was written stays consistent: the
/// `seq` written back covers
/// every seq handed out, the failing one included, so none is ever handed out twice; and the
/// dedup key the failing publish claimed is removed, so a retry is stored rather than
/// answered as a duplicate of nothing. The `#!lua` shebang (Redis 7 script flags, none set)
/// makes Redis refuse the whole call with `OOM` before it runs when `maxmemory` is reached,
/// rather than failing a write half-way.
pub const PUBLISH_LUA: &str = r#"#!lua
local now = redis.call('TIME')
if tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) > tonumber(ARGV[6]) then
  return redis.status_reply('LATE')
end
local nc = tonumber(ARGV[1])
local ttl, window, fresh, command = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local base = 6 + 2 * nc
local n = (#ARGV - base) / 3
local epoch, seq, head = {}, {}, {}
local function lower(a, b)
  return #a < #b or (#a == #b and a < b)
end
for c = 1, nc do
  local m = redis.call('HMGET', KEYS[2 * c - 1], 'epoch', 'seq')
  epoch[c], seq[c] = m[1], tonumber(m[2] or '0')
  head[c] = seq[c]
end
local out, claimed, fenced = {}, nil, 0
local function store()
  for i = 1, n do
    local a = base + 3 * i - 2
    local c, flag, data = tonumber(ARGV[a]), ARGV[a + 1], ARGV[a + 2]
    local id, highest = string.byte(flag, 1) == 49, nil
    if #flag > 1 then
      fenced = fenced + 1
      local fkey, sp = KEYS[2 * nc + n + fenced], string.find(flag, ' ', 3, true)
      local token, feed = string.sub(flag, 3, sp - 1), string.sub(flag, sp + 1)
      highest = redis.call('HGET', fkey, feed)
      if highest and not lower(token, highest) then
        highest = nil
      end
      if not highest then
        redis.call('HSET', fkey, feed, token)
        redis.call('PEXPIRE', fkey, ttl)
      end
    end
    local s = seq[c] + 1
    local ss = string.format('%d', s)
    local old = not highest and id and redis.call('SET', KEYS[2 * nc + i], ss, 'NX', 'GET', 'PX', window)
    if highest then
      out[3 * i - 2], out[3 * i - 1], out[3 * i] = highest, epoch[c] or '', 2
    elseif old then
      out[3 * i - 2], out[3 * i - 1], out[3 * i] = tonumber(old), epoch[c] or '', 1
    else
      if id then claimed = KEYS[2 * nc + i] end
      seq[c] = s
      if not epoch[c] then
        epoch[c] = fresh
        redis.call('HSET', KEYS[2 * c - 1], 'epoch', fresh)
      end
      local history = ARGV[6 + 2 * c]
      if history ~= '0' then
        redis.call('XADD', KEYS[2 * c], 'MAXLEN', '~', history, ss .. '-0', 'd', data)
      end
      redis.call(command, ARGV[5 + 2 * c], ss .. ' ' .. epoch[c] .. ' ' .. data)
      claimed = nil
      out[3 * i - 2], out[3 * i - 1], out[3 * i] = s, epoch[c], 0
    end
  end
end
local ok, err = pcall(store)
if claimed then
  redis.call('DEL', claimed)
end
for c = 1, nc do
  if seq[c] ~= head[c] then
    redis.call('HSET', KEYS[2 * c - 1], 'seq', seq[c])
    if ARGV[6 + 2 * c] ~= '0' then
      redis.call('PEXPIRE', KEYS[2 * c], ttl)
    end
    redis.call('PEXPIRE', KEYS[2 * c - 1], ttl)
  end
end
if not ok then
  if type(err) == 'table' then
    err = err.err or 'ERR the publish script failed'
  end
  out[#out + 1] = tostring(err)
end
return out
"#;

/// The meta script: reads a channel's head, creating its meta (seq 0 and the given epoch) when
/// it has none, so a never-published channel's epoch lives in the store and survives its
/// subscribers leaving; refreshes the expiry of both keys (a node calls it while it has
/// subscribers).
///
/// KEYS: meta, stream. ARGV: epoch for a channel without one, ttl ms, a seq `at` (0: none).
/// Returns `{seq, epoch, oldest, data}` with `oldest` the first seq still in the stream
/// (`seq + 1` when the stream is empty) and `data` the message stored under seq `at` (empty
/// when `at` is 0 or the stream no longer holds it; a message is JSON, never empty, and an
/// empty string reads the same over RESP2 and RESP3, where a Lua `false` would not): a node passes the seq it delivered last
/// and compares, to find a history that changed under it (a failover that lost acked
/// messages, then took new ones under the same seqs).
pub const META_LUA: &str = r#"
local meta, stream = KEYS[1], KEYS[2]
local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then
  epoch = ARGV[1]
  redis.call('HSET', meta, 'epoch', epoch, 'seq', 0)
end
redis.call('PEXPIRE', meta, ARGV[2])
local seq = tonumber(redis.call('HGET', meta, 'seq') or '0')
local oldest = seq + 1
local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
if #first > 0 then
  oldest = tonumber(string.match(first[1][1], '^(%d+)'))
  redis.call('PEXPIRE', stream, ARGV[2])
end
local data = ''
if ARGV[3] ~= '0' then
  local at = redis.call('XRANGE', stream, ARGV[3] .. '-0', ARGV[3] .. '-0')
  if #at > 0 then
    data = at[1][2][2]
  end
end
return {seq, epoch, oldest, data}
"#;

/// The epoch bump: gives a channel a new epoch if it still has the one a node knows. A node
/// calls it when the channel's head went *back* under the same epoch (a failover to a replica
/// that had not received the last acked messages): the numbering after that point reuses
/// seqs with other data, so it must not continue under the same epoch.
///
/// KEYS: meta. ARGV: the epoch the node knows, the new epoch. Returns the channel's epoch
/// afterwards (the new one, or the one another node already put there).
pub const BUMP_LUA: &str = r#"
local e = redis.call('HGET', KEYS[1], 'epoch')
if e == ARGV[1] then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[2])
  return ARGV[2]
end
return e or ''
"#;

/// Stores one revocation: drops the ended ones, adds this one (or moves its end later), and
/// sets the set's expiry to its last end, so the key goes with its last revocation.
///
/// KEYS: the revocations sorted set. ARGV: the member, its `until_ms`, now (ms since the Unix
/// epoch, on Redis's clock as the node measures it). Returns the number of revocations kept.
pub const REVOKE_LUA: &str = r#"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
redis.call('ZADD', KEYS[1], 'GT', ARGV[2], ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return redis.call('ZCARD', KEYS[1])
"#;

/// The member of `r` in the revocations sorted set: `j:JTI`, or `u:REVOKED_AT_MS:USER` (the
/// user last: it may hold `:`). Its score is `r.until_ms()`.
pub fn revocation_member(r: &Revocation) -> String {
    match r {
        Revocation::Jti { jti, .. } => format!("j:{jti}"),
        Revocation::User { user, revoked_at_ms, .. } => format!("u:{revoked_at_ms}:{user}"),
    }
}

/// The revocation a member of the sorted set stands for, with its score `until_ms`; `None`
/// for a member tether did not write.
pub fn parse_revocation(member: &str, until_ms: u64) -> Option<Revocation> {
    if let Some(jti) = member.strip_prefix("j:") {
        return Some(Revocation::Jti { jti: jti.into(), until_ms });
    }
    let (at, user) = member.strip_prefix("u:")?.split_once(':')?;
    Some(Revocation::User { user: user.into(), revoked_at_ms: at.parse().ok()?, until_ms })
}

/// Names of a channel's keys and topic under a key prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Names under `prefix` (`[broker] key_prefix`, validated to contain no `{` or `}`).
    pub fn new(prefix: &str) -> Keys {
        Keys { prefix: prefix.to_owned() }
    }

    /// The meta hash of `ch`.
    pub fn meta(&self, ch: &str) -> String {
        format!("{}{{{ch}}}:m", self.prefix)
    }

    /// The history stream of `ch`.
    pub fn stream(&self, ch: &str) -> String {
        format!("{}{{{ch}}}:s", self.prefix)
    }

    /// The dedup key of publish id `id` on `ch`.
    pub fn dedup(&self, ch: &str, id: &str) -> String {
        format!("{}{{{ch}}}:d:{id}", self.prefix)
    }

    /// The fence hash of `ch` (feed id → highest fencing token seen).
    pub fn fence(&self, ch: &str) -> String {
        format!("{}{{{ch}}}:f", self.prefix)
    }

    /// The pub/sub topic of `ch`.
    pub fn topic(&self, ch: &str) -> String {
        format!("{}{{{ch}}}", self.prefix)
    }

    /// The sorted set of the revocations in force (`POST /api/revoke`).
    pub fn revoked(&self) -> String {
        format!("{}revoked", self.prefix)
    }

    /// The topic of the server API's node-wide actions.
    pub fn control_topic(&self) -> String {
        format!("{}control", self.prefix)
    }

    /// The channel a topic names, if it is one of ours.
    pub fn channel_of<'a>(&self, topic: &'a [u8]) -> Option<&'a str> {
        let t = std::str::from_utf8(topic).ok()?;
        t.strip_prefix(self.prefix.as_str())?.strip_prefix('{')?.strip_suffix('}')
    }
}

/// What every publish of one [`PUBLISH_LUA`] call shares.
#[derive(Debug, Clone, Copy)]
pub struct PublishParams<'a> {
    /// Expiry of a channel's meta and stream after its last publish, in milliseconds
    /// (`[broker] history_ttl_ms`).
    pub ttl_ms: u64,
    /// How long a publish id is remembered, in milliseconds (`dedup.window_ms`).
    pub dedup_window_ms: u64,
    /// The epoch a channel without one gets.
    pub epoch: &'a str,
    /// `PUBLISH`, or `SPUBLISH` on a cluster.
    pub command: &'a str,
    /// Past this time (milliseconds since the Unix epoch, on Redis's clock) the script stores
    /// nothing and answers [`LATE`].
    pub deadline_ms: u64,
}

/// The publish script's status reply when it ran past its deadline and stored nothing.
pub const LATE: &str = "LATE";

/// One publish of a [`PublishCall`]: its channel's index from 1, its id, its data and its
/// fence (feed id, fencing token).
type CallPub<'a> = (usize, Option<&'a str>, &'a [u8], Option<(&'a str, u64)>);

/// The arguments of one [`PUBLISH_LUA`] call, built publish by publish: the channels in the
/// order they first appear, each publish pointing at its channel. Sans-IO; the caller writes
/// [`PublishCall::args`] after `EVALSHA sha` (or `EVAL script`).
#[derive(Debug, Default)]
pub struct PublishCall<'a> {
    /// `(name, history length)` per channel; a channel's index in the script is its place
    /// here plus one.
    channels: Vec<(&'a str, usize)>,
    index: std::collections::HashMap<&'a str, usize>,
    pubs: Vec<CallPub<'a>>,
}

impl<'a> PublishCall<'a> {
    /// Adds a publish of `data` to `ch` (with publish id `id`, if any; with `fence` = (feed id,
    /// fencing token), if any). `history` gives the channel's history length; it is asked once
    /// per channel of the call.
    pub fn push(
        &mut self,
        ch: &'a str,
        id: Option<&'a str>,
        data: &'a [u8],
        fence: Option<(&'a str, u64)>,
        history: impl FnOnce() -> usize,
    ) {
        let c = match self.index.get(ch) {
            Some(&c) => c,
            None => {
                self.channels.push((ch, history()));
                self.index.insert(ch, self.channels.len());
                self.channels.len()
            }
        };
        self.pubs.push((c, id, data, fence));
    }

    /// Publishes added.
    pub fn len(&self) -> usize {
        self.pubs.len()
    }

    /// Whether no publish was added.
    pub fn is_empty(&self) -> bool {
        self.pubs.is_empty()
    }

    /// Calls `arg` with each argument after the script, in order: the number of keys, KEYS,
    /// ARGV (their shapes are in [`PUBLISH_LUA`]).
    pub fn args(&self, keys: &Keys, p: &PublishParams, mut arg: impl FnMut(&[u8])) {
        let n = |v: usize| v.to_string();
        let fenced = self.pubs.iter().filter(|p| p.3.is_some()).count();
        arg(n(2 * self.channels.len() + self.pubs.len() + fenced).as_bytes());
        for (ch, _) in &self.channels {
            arg(keys.meta(ch).as_bytes());
            arg(keys.stream(ch).as_bytes());
        }
        for (c, id, _, _) in &self.pubs {
            let ch = self.channels[c - 1].0;
            match id {
                Some(id) => arg(keys.dedup(ch, id).as_bytes()),
                None => arg(keys.meta(ch).as_bytes()),
            }
        }
        for (c, _, _, fence) in &self.pubs {
            if fence.is_some() {
                arg(keys.fence(self.channels[c - 1].0).as_bytes());
            }
        }
        arg(n(self.channels.len()).as_bytes());
        arg(p.ttl_ms.to_string().as_bytes());
        arg(p.dedup_window_ms.to_string().as_bytes());
        arg(p.epoch.as_bytes());
        arg(p.command.as_bytes());
        arg(p.deadline_ms.to_string().as_bytes());
        for (ch, history) in &self.channels {
            arg(keys.topic(ch).as_bytes());
            arg(n(*history).as_bytes());
        }
        for (c, id, data, fence) in &self.pubs {
            arg(n(*c).as_bytes());
            let has_id = if id.is_some() { "1" } else { "0" };
            match fence {
                Some((feed, token)) => arg(format!("{has_id} {token} {feed}").as_bytes()),
                None => arg(has_id.as_bytes()),
            }
            arg(data);
        }
    }
}

/// One message as it travels on a topic: `SEQ EPOCH DATA` (the epoch has no space, DATA is
/// the message JSON).
#[derive(Debug, PartialEq, Eq)]
pub struct Payload<'a> {
    /// The message's seq.
    pub seq: u64,
    /// The channel's epoch when it was published.
    pub epoch: &'a str,
    /// The message JSON.
    pub data: &'a str,
}

impl<'a> Payload<'a> {
    /// Parses a topic payload; `None` when it is not `SEQ EPOCH DATA`.
    pub fn parse(raw: &'a [u8]) -> Option<Payload<'a>> {
        let s = std::str::from_utf8(raw).ok()?;
        let (seq, rest) = s.split_once(' ')?;
        let (epoch, data) = rest.split_once(' ')?;
        Some(Payload { seq: seq.parse().ok()?, epoch, data })
    }
}

/// The seq of a stream entry id `SEQ-0`.
pub fn entry_seq(id: &str) -> Option<u64> {
    id.split_once('-').map_or(id, |(s, _)| s).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revocations_round_trip_through_their_members() {
        let k = Keys::new("tether:");
        assert_eq!((k.revoked(), k.control_topic()), ("tether:revoked".into(), "tether:control".into()));
        assert_eq!(k.channel_of(k.control_topic().as_bytes()), None, "not a channel's topic");
        for r in [
            Revocation::Jti { jti: "a:b".into(), until_ms: 9 },
            Revocation::User { user: "team:alice".into(), revoked_at_ms: 1_700_000_000_123, until_ms: 9 },
        ] {
            assert_eq!(parse_revocation(&revocation_member(&r), 9), Some(r));
        }
        assert_eq!(parse_revocation("x:1", 1), None);
        assert_eq!(parse_revocation("u:notanumber:bob", 1), None);
    }

    #[test]
    fn keys_share_the_channel_hash_tag() {
        let k = Keys::new("tether:");
        assert_eq!(k.meta("news.eu"), "tether:{news.eu}:m");
        assert_eq!(k.stream("news.eu"), "tether:{news.eu}:s");
        assert_eq!(k.dedup("news.eu", "a b"), "tether:{news.eu}:d:a b");
        assert_eq!(k.fence("news.eu"), "tether:{news.eu}:f");
        assert_eq!(k.topic("news.eu"), "tether:{news.eu}");
        assert_eq!(k.channel_of(b"tether:{news.eu}"), Some("news.eu"));
        assert_eq!(k.channel_of(b"other:{news.eu}"), None);
        assert_eq!(k.channel_of(b"tether:news"), None);
    }

    #[test]
    fn publish_call_arguments() {
        let k = Keys::new("t:");
        let mut call = PublishCall::default();
        let asked = std::cell::Cell::new(0);
        let history = |h: usize| {
            let asked = &asked;
            move || {
                asked.set(asked.get() + 1);
                h
            }
        };
        call.push("a", Some("x"), b"1", None, history(10));
        call.push("b", None, b"2", Some(("f1", 7)), history(0));
        call.push("a", None, b"3", None, history(10));
        call.push("a", Some("x"), b"4", Some(("f2", u64::MAX)), history(10));
        assert_eq!(call.len(), 4);
        assert_eq!(asked.get(), 2, "a channel's history is asked once per call");
        let p = PublishParams {
            ttl_ms: 600_000,
            dedup_window_ms: 300_000,
            epoch: "e1",
            command: "PUBLISH",
            deadline_ms: 1_700_000_000_500,
        };
        let mut args = Vec::new();
        call.args(&k, &p, |a| args.push(String::from_utf8(a.to_vec()).unwrap()));
        #[rustfmt::skip]
        let want = [
            "10",
            "t:{a}:m", "t:{a}:s", "t:{b}:m", "t:{b}:s",
            "t:{a}:d:x", "t:{b}:m", "t:{a}:m", "t:{a}:d:x",
            // Fence hashes of the fenced publishes only.
            "t:{b}:f", "t:{a}:f",
            "2", "600000", "300000", "e1", "PUBLISH", "1700000000500",
            "t:{a}", "10", "t:{b}", "0",
            "1", "1", "1",
            "2", "0 7 f1", "2",
            "1", "0", "3",
            "1", "1 18446744073709551615 f2", "4",
        ];
        assert_eq!(args, want);
    }

    #[test]
    fn payload_round_trip() {
        let p = Payload::parse(br#"42 00ff {"a":"b c"}"#).unwrap();
        assert_eq!(p, Payload { seq: 42, epoch: "00ff", data: r#"{"a":"b c"}"# });
        assert!(Payload::parse(b"x e d").is_none());
        assert!(Payload::parse(b"1 e").is_none());
        assert_eq!(entry_seq("17-0"), Some(17));
        assert_eq!(entry_seq("17"), Some(17));
        assert_eq!(entry_seq("x-0"), None);
    }
}
