//! [`RedisLeaseStore`]: feeds and leases in the broker's Redis (`[broker] url`/`urls`,
//! `key_prefix`), each compare-and-set one Lua script (`EVALSHA`, `EVAL` after a
//! `NOSCRIPT`, through `redis::Script`).
//!
//! | what | name | type |
//! |---|---|---|
//! | feed | `PREFIX{feeds}:feed:ID` | hash: the [`FeedDef`] fields, `lease_owner`, `lease_expires_at_ms`, `fencing_token`, `last_seq` (absent = none) |
//! | index | `PREFIX{feeds}:ids` | set of feed ids, for `list` |
//! | releases | `PREFIXfeeds:released` | pub/sub topic, payload the feed id |
//!
//! All keys share the hash tag `{feeds}`: on a Redis Cluster they live in one slot, so a
//! script may write a feed and the index together and `get_many` reads any number of feeds
//! in one script call. Feeds are few (thousands at most), so one slot is no hot spot.
//!
//! Time: the scripts compare the caller's `now_ms`, not Redis `TIME`, so that the memory and
//! Redis stores follow one rule and tests can step a simulated clock. The price is the clock
//! assumption of [`crate::feeds`]: nodes' clocks agree within the skew margin.
//!
//! Deadlines: every write script takes, as its last argument, a deadline on Redis's clock
//! (the request timeout after the call, through the offset measured with `TIME` at connect)
//! and first checks it against Redis `TIME`: a script that Redis runs late (it slept, or was
//! busy) writes nothing and fails with `LATE`. The reply is awaited up to
//! [`REPLY_GRACE`] longer, so a `LATE` or an error reply means nothing was written
//! ([`LeaseError::Store`]); only a write with no reply in time is [`LeaseError::Unknown`].

use std::sync::Arc;

use redis::Script;
use tokio::sync::mpsc::UnboundedReceiver;

use super::releases::{pubsub_url, released_topic, subscribe};
use super::{merge_chunks, LeaseError, LeaseStore, LeaseTerm, Renewal};
use crate::config::Broker as BrokerConfig;
use crate::feeds::metrics::{StoreOp, StoreRequests};
use crate::feeds::record::{validate_id, DesiredState, Feed, FeedDef, Lease};
use crate::redis::clock::{clock_offset_ms, local_ms};
use crate::redis::link::Link;
use crate::redis::REPLY_GRACE;

/// The start of every write script: past the deadline (its last argument, milliseconds since
/// the Unix epoch on Redis's clock) it writes nothing and fails with `LATE`.
macro_rules! deadline_check {
    () => {
        "local clock = redis.call('TIME')
if tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) > tonumber(ARGV[#ARGV]) then
  return redis.error_reply('LATE the write reached redis past its deadline; nothing was written')
end
"
    };
}

/// `put`: KEYS feed, index; ARGV id, the six definition fields, deadline. Returns 1 if created.
const PUT_LUA: &str = concat!(
    deadline_check!(),
    r#"
local created = redis.call('EXISTS', KEYS[1]) == 0 and 1 or 0
redis.call('HSET', KEYS[1], 'url', ARGV[2], 'channel', ARGV[3], 'desired_state', ARGV[4],
  'subscribe', ARGV[5], 'resume_query', ARGV[6], 'seq_pointer', ARGV[7])
redis.call('SADD', KEYS[2], ARGV[1])
return created
"#
);

/// `delete`: KEYS feed, index; ARGV id, deadline. Returns 1 if it existed.
const DELETE_LUA: &str = concat!(
    deadline_check!(),
    r#"
local n = redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return n
"#
);

/// `acquire`: KEYS feed; ARGV owner, now_ms, lease_ms, deadline. Returns `{'ok', token}`,
/// `{'held', owner, expires}` or `{'missing'}`.
const ACQUIRE_LUA: &str = concat!(
    deadline_check!(),
    r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local m = redis.call('HMGET', KEYS[1], 'lease_owner', 'lease_expires_at_ms')
local now = tonumber(ARGV[2])
local exp = tonumber(m[2] or '0')
if exp > now then return {'held', m[1] or '', m[2]} end
local t = redis.call('HINCRBY', KEYS[1], 'fencing_token', 1)
redis.call('HSET', KEYS[1], 'lease_owner', ARGV[1],
  'lease_expires_at_ms', string.format('%d', now + tonumber(ARGV[3])))
return {'ok', string.format('%d', t)}
"#
);

/// `renew`: KEYS feed; ARGV owner, token, now_ms, lease_ms, has_seq (0/1), last_seq, deadline.
/// Returns `{'ok'}`, `{'lost', owner, token, expires}` or `{'missing'}`.
const RENEW_LUA: &str = concat!(
    deadline_check!(),
    r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local m = redis.call('HMGET', KEYS[1], 'lease_owner', 'fencing_token', 'lease_expires_at_ms')
local now = tonumber(ARGV[3])
if m[1] ~= ARGV[1] or m[2] ~= ARGV[2] or tonumber(m[3] or '0') <= now then
  return {'lost', m[1] or '', m[2] or '0', m[3] or '0'}
end
redis.call('HSET', KEYS[1], 'lease_expires_at_ms', string.format('%d', now + tonumber(ARGV[4])))
if ARGV[5] == '1' then redis.call('HSET', KEYS[1], 'last_seq', ARGV[6]) end
return {'ok'}
"#
);

/// `renew_many`: KEYS the feeds; ARGV owner, now_ms, lease_ms, then per feed token, has_seq
/// (0/1), last_seq; then the deadline. Returns one `renew` reply per key, in order; each feed follows `renew`'s
/// rule, all in one atomic step.
const RENEW_MANY_LUA: &str = concat!(
    deadline_check!(),
    r#"
local owner, now = ARGV[1], tonumber(ARGV[2])
local exp = string.format('%d', now + tonumber(ARGV[3]))
local out = {}
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 3
  if redis.call('EXISTS', KEYS[i]) == 0 then
    out[i] = {'missing'}
  else
    local m = redis.call('HMGET', KEYS[i], 'lease_owner', 'fencing_token', 'lease_expires_at_ms')
    if m[1] ~= owner or m[2] ~= ARGV[a + 1] or tonumber(m[3] or '0') <= now then
      out[i] = {'lost', m[1] or '', m[2] or '0', m[3] or '0'}
    else
      if ARGV[a + 2] == '1' then
        redis.call('HSET', KEYS[i], 'lease_expires_at_ms', exp, 'last_seq', ARGV[a + 3])
      else
        redis.call('HSET', KEYS[i], 'lease_expires_at_ms', exp)
      end
      out[i] = {'ok'}
    end
  end
end
return out
"#
);

/// Most leases in one `renew_many` script call: bounds the script's run (Redis serves nothing
/// else meanwhile) and its argument list (3 + 3 × 500 values).
pub const RENEW_CHUNK: usize = 500;

/// `release`: KEYS feed; ARGV owner, token, has_seq (0/1), last_seq, topic, id, deadline. Returns
/// `{'ok'}`, `{'lost', owner, token, expires}` or `{'missing'}`; publishes the id on `ok`.
const RELEASE_LUA: &str = concat!(
    deadline_check!(),
    r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local m = redis.call('HMGET', KEYS[1], 'lease_owner', 'fencing_token', 'lease_expires_at_ms')
if m[1] ~= ARGV[1] or m[2] ~= ARGV[2] then
  return {'lost', m[1] or '', m[2] or '0', m[3] or '0'}
end
redis.call('HSET', KEYS[1], 'lease_expires_at_ms', '0')
if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'last_seq', ARGV[4]) end
redis.call('PUBLISH', ARGV[5], ARGV[6])
return {'ok'}
"#
);

/// `get_many`: KEYS the feeds. Returns one entry per key: the [`FIELDS`] values, or nil for
/// a missing feed.
const GET_MANY_LUA: &str = r#"
local out = {}
for i = 1, #KEYS do
  local v = redis.call('HMGET', KEYS[i], 'url', 'channel', 'desired_state', 'subscribe',
    'resume_query', 'seq_pointer', 'lease_owner', 'lease_expires_at_ms', 'fencing_token', 'last_seq')
  if v[1] then out[i] = v else out[i] = false end
end
return out
"#;

/// The hash fields `get_many` reads, in order.
const FIELDS: usize = 10;

/// A lease store in the broker's Redis (single instance or Cluster). Cheap to share behind
/// an `Arc`; requests are multiplexed on one connection, opened again by the next call after
/// a failure that ended it (a Redis restart, `CLIENT KILL`).
pub struct RedisLeaseStore {
    /// The connection and Redis's clock minus this node's on it (ms, `TIME` at connect);
    /// `None` after a failure that ended the connection: the next call opens another.
    link: std::sync::Mutex<Option<(Link, i64)>>,
    /// `[broker]`, to open the connection again.
    cfg: BrokerConfig,
    /// For the pub/sub connection of [`LeaseStore::released`]: a Cluster broadcasts `PUBLISH`
    /// to every node, so one seed is enough.
    pubsub_url: String,
    prefix: String,
    put: Script,
    delete: Script,
    acquire: Script,
    renew: Script,
    renew_many: Script,
    release: Script,
    get_many: Script,
    requests: Arc<StoreRequests>,
    /// `request_timeout_ms`: a write's deadline is this long after it is sent.
    timeout: std::time::Duration,
}

fn store_err(e: impl std::fmt::Display) -> LeaseError {
    LeaseError::Store(e.to_string())
}

/// A failed write script call: an error reply (`LATE`: run past its deadline; or refused
/// before it ran) wrote nothing ([`LeaseError::Store`]); no reply in time, or a connection
/// that failed while the call was out, may have written ([`LeaseError::Unknown`]).
fn write_err(e: redis::RedisError) -> LeaseError {
    if e.code().is_some() {
        LeaseError::Store(e.to_string())
    } else {
        LeaseError::Unknown(e.to_string())
    }
}

fn num(s: Option<&String>) -> u64 {
    s.and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Maps a `{'lost', owner, token, expires}` / `{'missing'}` / `{'ok'}` script reply.
fn outcome(reply: Vec<String>) -> Result<(), LeaseError> {
    match reply.first().map(String::as_str) {
        Some("ok") => Ok(()),
        Some("missing") => Err(LeaseError::NotFound),
        Some("lost") => Err(LeaseError::Lost {
            owner: reply.get(1).filter(|o| !o.is_empty()).cloned(),
            fencing_token: num(reply.get(2)),
            expires_at_ms: num(reply.get(3)),
        }),
        _ => Err(LeaseError::Store(format!("unexpected script reply {reply:?}"))),
    }
}

/// Opens the connection for `[broker]` and measures Redis's clock against this node's on it.
async fn open(cfg: &BrokerConfig, timeout: std::time::Duration) -> Result<(Link, i64), LeaseError> {
    let mut link = Link::open_with(cfg, None, timeout, timeout + REPLY_GRACE).await.map_err(store_err)?;
    let before = local_ms();
    let time = redis::cmd("TIME").query_async(&mut link).await.map_err(store_err)?;
    Ok((link, clock_offset_ms(before, time, local_ms())))
}

/// Builds a feed from `get_many`'s field values for `id`.
fn feed_of(id: &str, v: Vec<Option<String>>) -> Result<Feed, LeaseError> {
    if v.len() != FIELDS {
        return Err(LeaseError::Store(format!("feed {id}: {} fields read, {FIELDS} expected", v.len())));
    }
    let mut it = v.into_iter();
    let mut next = || it.next().flatten();
    let text = |s: Option<String>| s.unwrap_or_default();
    let (url, channel, state) = (text(next()), text(next()), text(next()));
    let (subscribe, resume_query, seq_pointer) = (text(next()), text(next()), text(next()));
    let desired_state = DesiredState::parse(&state)
        .ok_or_else(|| LeaseError::Store(format!("feed {id}: stored desired_state {state:?}")))?;
    let lease_owner = next();
    let lease_expires_at_ms = num(next().as_ref());
    let fencing_token = num(next().as_ref());
    let last_seq = next();
    Ok(Feed {
        def: FeedDef { id: id.to_owned(), url, channel, desired_state, subscribe, resume_query, seq_pointer },
        lease: Lease { lease_owner, lease_expires_at_ms, fencing_token, last_seq },
    })
}

impl RedisLeaseStore {
    /// Connects to the Redis of `[broker]` (`url`, or `urls` for a Cluster; `key_prefix`;
    /// `request_timeout_ms` bounds each call). Errors: a bad URL, a refused or timed-out
    /// connection.
    pub async fn connect(cfg: &BrokerConfig) -> Result<RedisLeaseStore, LeaseError> {
        let timeout = std::time::Duration::from_millis(cfg.request_timeout_ms);
        let link = open(cfg, timeout).await?;
        Ok(RedisLeaseStore {
            timeout,
            link: std::sync::Mutex::new(Some(link)),
            cfg: cfg.clone(),
            pubsub_url: pubsub_url(cfg),
            prefix: cfg.key_prefix.clone(),
            put: Script::new(PUT_LUA),
            delete: Script::new(DELETE_LUA),
            acquire: Script::new(ACQUIRE_LUA),
            renew: Script::new(RENEW_LUA),
            renew_many: Script::new(RENEW_MANY_LUA),
            release: Script::new(RELEASE_LUA),
            get_many: Script::new(GET_MANY_LUA),
            requests: Arc::default(),
        })
    }

    /// The connection and its clock offset, opened again when a failure ended it. Errors:
    /// it cannot be opened ([`LeaseError::Store`]: nothing was sent).
    async fn conn(&self) -> Result<(Link, i64), LeaseError> {
        if let Some(c) = self.link.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(c);
        }
        let c = open(&self.cfg, self.timeout).await?;
        *self.link.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Forgets the connection after `e` when `e` may have ended it (neither an error reply
    /// nor a timeout, after which the multiplexed connection goes on).
    fn failed(&self, e: &redis::RedisError) {
        if e.code().is_none() && !e.is_timeout() {
            *self.link.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    /// Runs the write script call `inv` with its deadline (the request timeout from now, on
    /// Redis's clock) as its last argument ([`write_err`]).
    async fn write<T: redis::FromRedisValue>(&self, mut inv: redis::ScriptInvocation<'_>) -> Result<T, LeaseError> {
        let (mut link, offset) = self.conn().await?;
        inv.arg((local_ms() + offset).max(0) as u64 + self.timeout.as_millis() as u64);
        inv.invoke_async(&mut link).await.map_err(|e| {
            self.failed(&e);
            write_err(e)
        })
    }

    /// Runs the read script call `inv`.
    async fn read<T: redis::FromRedisValue>(&self, inv: redis::ScriptInvocation<'_>) -> Result<T, LeaseError> {
        let (mut link, _) = self.conn().await?;
        inv.invoke_async(&mut link).await.map_err(|e| {
            self.failed(&e);
            store_err(e)
        })
    }

    /// `get_many`'s script for `ids` (already checked), counted as a request of `op`.
    async fn read_many(&self, ids: &[String], op: StoreOp) -> Result<Vec<Option<Feed>>, LeaseError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = self.get_many.prepare_invoke();
        for id in ids {
            inv.key(self.feed_key(id));
        }
        self.requests.add(op, 1);
        let rows: Vec<Option<Vec<Option<String>>>> = self.read(inv).await?;
        if rows.len() != ids.len() {
            return Err(store_err(format!("get_many: {} rows for {} ids", rows.len(), ids.len())));
        }
        ids.iter().zip(rows).map(|(id, row)| row.map(|v| feed_of(id, v)).transpose()).collect()
    }

    /// One `renew_many` script call for at most [`RENEW_CHUNK`] checked leases.
    async fn renew_chunk(
        &self,
        term: LeaseTerm<'_>,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
        let mut inv = self.renew_many.prepare_invoke();
        inv.arg(term.owner).arg(term.now_ms).arg(term.lease_ms);
        for r in leases {
            inv.key(self.feed_key(r.id));
            inv.arg(r.token).arg(if r.last_seq.is_some() { "1" } else { "0" }).arg(r.last_seq.unwrap_or(""));
        }
        self.requests.add(StoreOp::RenewMany, 1);
        let replies: Vec<Vec<String>> = self.write(inv).await?;
        if replies.len() != leases.len() {
            return Err(store_err(format!("renew_many: {} replies for {} leases", replies.len(), leases.len())));
        }
        Ok(replies.into_iter().map(outcome).collect())
    }

    /// The hash of feed `id`: `PREFIX{feeds}:feed:ID`.
    pub fn feed_key(&self, id: &str) -> String {
        format!("{}{{feeds}}:feed:{id}", self.prefix)
    }

    /// The set of feed ids: `PREFIX{feeds}:ids`.
    pub fn index_key(&self) -> String {
        format!("{}{{feeds}}:ids", self.prefix)
    }

    /// The release notification topic: `PREFIXfeeds:released` (`tether:feeds:released`).
    pub fn released_topic(&self) -> String {
        released_topic(&self.prefix)
    }
}

impl LeaseStore for RedisLeaseStore {
    async fn put(&self, def: &FeedDef) -> Result<bool, LeaseError> {
        debug_assert!(def.validate().is_ok(), "checked by the front door");
        let mut inv = self.put.key(self.feed_key(&def.id));
        inv.key(self.index_key()).arg(&def.id).arg(&def.url).arg(&def.channel);
        inv.arg(def.desired_state.as_str()).arg(&def.subscribe).arg(&def.resume_query).arg(&def.seq_pointer);
        self.requests.add(StoreOp::Put, 1);
        let created: i64 = self.write(inv).await?;
        Ok(created == 1)
    }

    async fn get(&self, id: &str) -> Result<Option<Feed>, LeaseError> {
        let mut v = self.read_many(&[id.to_owned()], StoreOp::Get).await?;
        Ok(v.pop().flatten())
    }

    async fn delete(&self, id: &str) -> Result<bool, LeaseError> {
        let mut inv = self.delete.key(self.feed_key(id));
        inv.key(self.index_key()).arg(id);
        self.requests.add(StoreOp::Delete, 1);
        let n: i64 = self.write(inv).await?;
        Ok(n == 1)
    }

    async fn acquire(&self, id: &str, term: LeaseTerm<'_>) -> Result<u64, LeaseError> {
        let mut inv = self.acquire.key(self.feed_key(id));
        inv.arg(term.owner).arg(term.now_ms).arg(term.lease_ms);
        self.requests.add(StoreOp::Acquire, 1);
        let reply: Vec<String> = self.write(inv).await?;
        match reply.first().map(String::as_str) {
            Some("ok") => {
                reply.get(1).and_then(|t| t.parse().ok()).ok_or_else(|| store_err(format!("acquire reply {reply:?}")))
            }
            Some("held") => Err(LeaseError::Held {
                owner: reply.get(1).cloned().unwrap_or_default(),
                expires_at_ms: num(reply.get(2)),
            }),
            Some("missing") => Err(LeaseError::NotFound),
            _ => Err(store_err(format!("unexpected acquire reply {reply:?}"))),
        }
    }

    async fn renew(&self, term: LeaseTerm<'_>, lease: Renewal<'_>) -> Result<(), LeaseError> {
        let Renewal { id, token, last_seq } = lease;
        let mut inv = self.renew.key(self.feed_key(id));
        inv.arg(term.owner).arg(token).arg(term.now_ms).arg(term.lease_ms);
        inv.arg(if last_seq.is_some() { "1" } else { "0" }).arg(last_seq.unwrap_or(""));
        self.requests.add(StoreOp::Renew, 1);
        outcome(self.write(inv).await?)
    }

    async fn renew_many(
        &self,
        term: LeaseTerm<'_>,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
        // The chunks go out together on the multiplexed connection: pipelined, one round trip.
        let chunks = leases.chunks(RENEW_CHUNK).map(|c| self.renew_chunk(term, c));
        merge_chunks(leases, RENEW_CHUNK, futures::future::join_all(chunks).await)
    }

    async fn release(&self, id: &str, owner: &str, token: u64, last_seq: Option<&str>) -> Result<(), LeaseError> {
        let mut inv = self.release.key(self.feed_key(id));
        inv.arg(owner).arg(token);
        inv.arg(if last_seq.is_some() { "1" } else { "0" }).arg(last_seq.unwrap_or(""));
        inv.arg(self.released_topic()).arg(id);
        self.requests.add(StoreOp::Release, 1);
        outcome(self.write(inv).await?)
    }

    async fn get_many(&self, ids: &[String]) -> Result<Vec<Option<Feed>>, LeaseError> {
        self.read_many(ids, StoreOp::GetMany).await
    }

    async fn list(&self) -> Result<Vec<Feed>, LeaseError> {
        self.requests.add(StoreOp::List, 1);
        let (mut link, _) = self.conn().await?;
        let ids: Vec<String> =
            redis::cmd("SMEMBERS").arg(self.index_key()).query_async(&mut link).await.map_err(|e| {
                self.failed(&e);
                store_err(e)
            })?;
        // An id in the index is valid (put checked it); a malformed one was written by
        // something else and is skipped rather than failing the whole list.
        let ids: Vec<String> = ids.into_iter().filter(|id| validate_id(id).is_ok()).collect();
        Ok(self.read_many(&ids, StoreOp::List).await?.into_iter().flatten().collect())
    }

    async fn released(&self) -> Result<UnboundedReceiver<String>, LeaseError> {
        self.requests.add(StoreOp::Released, 1);
        subscribe(&self.pubsub_url, &self.released_topic()).await
    }

    fn requests(&self) -> &Arc<StoreRequests> {
        &self.requests
    }
}
