//! What tether stores in Redis and how it is named: the keys of a channel, its pub/sub topic,
//! the payload of a published message, and the two server-side scripts. Sans-IO and
//! unit-tested; the broker thread only sends what this file builds.
//!
//! Every key of channel `CH` carries the hash tag `{CH}`, so on a Redis Cluster all of them
//! (and the sharded pub/sub topic) live in one slot and one script may touch them all:
//!
//! | what | name | type |
//! |---|---|---|
//! | meta | `PREFIX{CH}:m` | hash: `seq` (last seq), `epoch` |
//! | history | `PREFIX{CH}:s` | stream, entry id `SEQ-0`, field `d` = the message JSON |
//! | dedup | `PREFIX{CH}:d:ID` | string: the seq stored for publish id `ID` |
//! | topic | `PREFIX{CH}` | (sharded) pub/sub channel, payload `SEQ EPOCH DATA` |

/// The publish script: dedup check, seq, history, expiry and fan-out, atomically.
///
/// KEYS: meta, stream, dedup key. ARGV: data, history length (0 keeps none), ttl ms, dedup
/// window ms, epoch for a channel without one, topic, `PUBLISH` or `SPUBLISH`, `1` when the
/// publish has an id. Returns `{seq, epoch, duplicate}`: a duplicate id returns the seq stored
/// for it and publishes nothing.
pub const PUBLISH_LUA: &str = r#"
local meta, stream, dkey = KEYS[1], KEYS[2], KEYS[3]
if ARGV[8] == '1' then
  local old = redis.call('GET', dkey)
  if old then
    return {tonumber(old), redis.call('HGET', meta, 'epoch') or '', 1}
  end
end
local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then
  epoch = ARGV[5]
  redis.call('HSET', meta, 'epoch', epoch)
end
local seq = redis.call('HINCRBY', meta, 'seq', 1)
if tonumber(ARGV[2]) > 0 then
  redis.call('XADD', stream, 'MAXLEN', '~', ARGV[2], seq .. '-0', 'd', ARGV[1])
  redis.call('PEXPIRE', stream, ARGV[3])
end
redis.call('PEXPIRE', meta, ARGV[3])
if ARGV[8] == '1' then
  redis.call('SET', dkey, seq, 'PX', ARGV[4])
end
redis.call(ARGV[7], ARGV[6], seq .. ' ' .. epoch .. ' ' .. ARGV[1])
return {seq, epoch, 0}
"#;

/// The meta script: reads a channel's head, creating its meta (seq 0 and the given epoch) when
/// it has none, so a never-published channel's epoch lives in the store and survives its
/// subscribers leaving; refreshes the expiry of both keys (a node calls it while it has
/// subscribers).
///
/// KEYS: meta, stream. ARGV: epoch for a channel without one, ttl ms, a seq `at` (0: none).
/// Returns `{seq, epoch, oldest, data}` with `oldest` the first seq still in the stream
/// (`seq + 1` when the stream is empty) and `data` the message stored under seq `at` (nil
/// when `at` is 0 or the stream no longer holds it): a node passes the seq it delivered last
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
local data = false
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

    /// The pub/sub topic of `ch`.
    pub fn topic(&self, ch: &str) -> String {
        format!("{}{{{ch}}}", self.prefix)
    }

    /// The channel a topic names, if it is one of ours.
    pub fn channel_of<'a>(&self, topic: &'a [u8]) -> Option<&'a str> {
        let t = std::str::from_utf8(topic).ok()?;
        t.strip_prefix(self.prefix.as_str())?.strip_prefix('{')?.strip_suffix('}')
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
    fn keys_share_the_channel_hash_tag() {
        let k = Keys::new("tether:");
        assert_eq!(k.meta("news.eu"), "tether:{news.eu}:m");
        assert_eq!(k.stream("news.eu"), "tether:{news.eu}:s");
        assert_eq!(k.dedup("news.eu", "a b"), "tether:{news.eu}:d:a b");
        assert_eq!(k.topic("news.eu"), "tether:{news.eu}");
        assert_eq!(k.channel_of(b"tether:{news.eu}"), Some("news.eu"));
        assert_eq!(k.channel_of(b"other:{news.eu}"), None);
        assert_eq!(k.channel_of(b"tether:news"), None);
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
