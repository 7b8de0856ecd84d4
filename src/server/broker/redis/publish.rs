//! Storing publishes: the publishes that reach the broker thread together go to Redis as one
//! call of the publish script ([`keys::PUBLISH_LUA`]), and each publisher gets its answer.
//!
//! One script call per batch rather than one per publish: Redis's cost of a publish is mostly
//! the script machinery around each command (building its arguments, running it, turning its
//! reply into Lua), not the commands themselves, and a batch reads and writes each channel's
//! meta and expiry once instead of once per publish.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use redis::Value;

use super::keys::{self, PublishCall, PublishParams};
use super::thread::{script_cmd, unavailable, unknown, warn_limited, Ctx, ERR_SCRIPT};
use crate::protocol::RequestError;
use crate::redis::REPLY_GRACE;
use crate::server::broker::epoch::new_epoch;
use crate::server::broker::{Fence, PublishResult};
use crate::server::bus::{ConnRef, CoreMsg};

/// Publishes per batch at most (one script call on one Redis).
const BATCH_MAX: usize = 512;
/// Bytes of data per batch at most (a single larger publish is a batch of its own). Redis runs
/// one script call to its end before anything else, and holds every argument of it in memory
/// twice over (the command, the script's `ARGV`): 512 publishes of the largest size
/// (`limits.max_publish_bytes`, 1 MiB) would block it for seconds and take gigabytes.
const BATCH_MAX_BYTES: usize = 1 << 20;

/// Where the first batch of `pubs` ends: after [`BATCH_MAX`] publishes, or after the publish
/// that brings its data to [`BATCH_MAX_BYTES`]; at least one publish.
pub(super) fn batch_end(pubs: &[Pub]) -> usize {
    let mut bytes = 0;
    for (i, p) in pubs.iter().take(BATCH_MAX).enumerate() {
        bytes += p.data.len();
        if bytes >= BATCH_MAX_BYTES {
            return i + 1;
        }
    }
    pubs.len().min(BATCH_MAX)
}

/// When a batch's time is up. Past [`Deadline::at`] the batch is not sent (nothing stored:
/// `unavailable`), the script it runs stores nothing ([`keys::PUBLISH_LUA`], deadline), and
/// [`REPLY_GRACE`] later the wait for its reply ends (outcome unknown).
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    /// The request timeout after the batch was formed, on this node's monotonic clock.
    pub at: tokio::time::Instant,
    /// The same moment on Redis's clock, in milliseconds since the Unix epoch.
    pub redis_ms: u64,
}

impl Deadline {
    /// The request timeout from now.
    pub(super) fn from_now(ctx: &Ctx) -> Deadline {
        let at = tokio::time::Instant::now() + ctx.timeout;
        Deadline { at, redis_ms: ctx.redis_now_ms() + ctx.timeout.as_millis() as u64 }
    }
}

/// Why a script call answered none of its publishes.
#[derive(Debug)]
enum Failure {
    /// Certainly nothing stored: the call was not sent, Redis refused it before running it
    /// (`NOSCRIPT`, `OOM`, `BUSY`, …), or it ran past its deadline (`LATE`). `unavailable`.
    NotStored(String),
    /// Sent, and no reply came in time, or the connection failed while it was out: it may
    /// have run. `unknown_outcome` (HTTP 504).
    Unknown(String),
}

/// A publish waiting for its batch.
pub(super) struct Pub {
    pub ch: Arc<str>,
    pub id: Option<Box<str>>,
    pub data: Bytes,
    pub reply: Option<ConnRef>,
    pub fence: Option<Fence>,
}

/// Stores a batch of publishes and answers each publisher. On one Redis the batch is one
/// script call. On a Redis Cluster every key of a call must live in one hash slot, so the
/// batch goes out as one call per channel, all at once, each with its channel's publishes in
/// the order they arrived.
pub(super) async fn publish_batch(ctx: &Ctx, batch: Vec<Pub>, deadline: Deadline) {
    if !ctx.cluster {
        return publish_call(ctx, batch, deadline).await;
    }
    let mut groups: Vec<Vec<Pub>> = Vec::new();
    let mut group_of: HashMap<Arc<str>, usize> = HashMap::new();
    for p in batch {
        let i = *group_of.entry(p.ch.clone()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(p);
    }
    futures::future::join_all(groups.into_iter().map(|g| publish_call(ctx, g, deadline))).await;
}

/// One script call for `batch`; answers each publisher. A call that certainly stored nothing
/// (not sent, Redis refusing the script, run past its deadline) answers every publish of it
/// `unavailable`; one whose outcome is unknown (sent, no reply in time) answers each
/// `unknown_outcome`; one that stopped at a failing publish answers those before it with
/// their seqs and the rest `unavailable` (none of those is stored, so a retry, even without
/// an id, stores it once).
async fn publish_call(ctx: &Ctx, batch: Vec<Pub>, deadline: Deadline) {
    match store(ctx, &batch, deadline).await {
        Ok((results, failed)) => {
            let metrics = &ctx.shared.metrics;
            let mut batch = batch.into_iter();
            // `results` first: zip takes from its left side before it finds the right one
            // exhausted, which would drop the first publish left unanswered.
            for (outcome, p) in results.into_iter().zip(batch.by_ref()) {
                let core = p.reply.map_or(0, |r| r.core as usize);
                match outcome {
                    Outcome::Stored(seq) => {
                        metrics[core].published.fetch_add(1, Relaxed);
                        answer(ctx, p, Ok(seq));
                    }
                    Outcome::Duplicate(seq) => {
                        metrics[core].publish_duplicates.fetch_add(1, Relaxed);
                        answer(ctx, p, Ok(seq));
                    }
                    Outcome::Fenced { highest } => {
                        metrics[core].feed_fenced.fetch_add(1, Relaxed);
                        let refusal = match &p.fence {
                            Some(f) => RequestError::fenced(&f.feed, f.token, highest),
                            None => unavailable("unexpected script reply"),
                        };
                        answer(ctx, p, Err(refusal));
                    }
                }
            }
            if let Some(why) = failed {
                script_failed(ctx, &why);
                for p in batch {
                    answer(ctx, p, Err(unavailable(&why)));
                }
            }
        }
        Err(failure) => {
            for p in batch {
                let e = match &failure {
                    Failure::NotStored(why) => unavailable(why),
                    Failure::Unknown(why) => {
                        ctx.shared.broker.unknown.fetch_add(1, Relaxed);
                        unknown(why)
                    }
                };
                answer(ctx, p, Err(e));
            }
        }
    }
}

/// Runs the script for `batch` (`EVALSHA`, then `EVAL` with its text after a `NOSCRIPT`: the
/// script cache is empty after a Redis restart): an [`Outcome`] per publish, in order, up to a
/// publish that failed and why; or why there is none.
async fn store(ctx: &Ctx, batch: &[Pub], deadline: Deadline) -> Result<Published, Failure> {
    let reply = match send(ctx, batch, true, deadline).await? {
        Value::ServerError(e) if e.code() == "NOSCRIPT" => send(ctx, batch, false, deadline).await?,
        v => v,
    };
    match reply {
        // Redis answers an error before running the script (a script that fails while
        // running stops inside its `pcall` and says so in its reply). On a cluster the call
        // may be the cluster client's retry of one that ran (see `LATE` below).
        Value::ServerError(e) => {
            script_failed(ctx, e.details().unwrap_or(e.code()));
            let why = e.code().to_owned();
            Err(if ctx.cluster { Failure::Unknown(why) } else { Failure::NotStored(why) })
        }
        Value::SimpleString(s) if s == keys::LATE => {
            ctx.shared.broker.late.fetch_add(1, Relaxed);
            // The cluster client may have sent the call before (it retries a call whose
            // connection failed): a late run of this attempt does not prove that none stored.
            Err(if ctx.cluster {
                Failure::Unknown("redis ran a retried call past its deadline".into())
            } else {
                Failure::NotStored("redis ran the publish past its deadline and stored nothing".into())
            })
        }
        v => parse_published(v, batch.len()).ok_or_else(|| {
            ctx.shared.broker.error(ERR_SCRIPT);
            Failure::Unknown("unexpected script reply".to_owned())
        }),
    }
}

/// One script call for `batch` on the command link, unless the link is down or the deadline
/// passed already (then nothing is sent). It goes as a pipeline of one command with errors
/// kept as values, so that a script's error reply is an answer to map, not a failure of the
/// link. The reply is awaited up to [`REPLY_GRACE`] past the deadline.
async fn send(ctx: &Ctx, batch: &[Pub], by_sha: bool, deadline: Deadline) -> Result<Value, Failure> {
    let Some((gen, mut link)) = ctx.link() else {
        return Err(Failure::NotStored("the redis command link is down".into()));
    };
    if tokio::time::Instant::now() >= deadline.at {
        return Err(Failure::NotStored("no turn to send within the request timeout".into()));
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.add_command(publish_cmd(ctx, batch, by_sha, deadline));
    let values = ctx.measured_until(gen, deadline.at + REPLY_GRACE, pipe.query_async::<Vec<Value>>(&mut link));
    let mut values = values.await.map_err(|e| Failure::Unknown(e.to_string()))?;
    values.pop().ok_or_else(|| Failure::Unknown("no reply to the publish script".into()))
}

/// Counts and logs (rate-limited) a failed publish script call.
fn script_failed(ctx: &Ctx, why: &str) {
    ctx.shared.broker.error(ERR_SCRIPT);
    warn_limited("broker-script", || tracing::warn!(error = %why, "the publish script failed"));
}

fn answer(ctx: &Ctx, p: Pub, outcome: Result<u64, RequestError>) {
    let Some(reply) = p.reply else { return };
    let result = match outcome {
        Ok(seq) => PublishResult::Stored { seq },
        Err(e) => PublishResult::Refused(Box::new(e)),
    };
    ctx.to_core(reply.core as usize, CoreMsg::Published { reply, ch: p.ch, id: p.id, result });
}

/// The script call for `batch` (`EVALSHA`, or `EVAL` with the script's text).
fn publish_cmd(ctx: &Ctx, batch: &[Pub], by_sha: bool, deadline: Deadline) -> redis::Cmd {
    let mut call = PublishCall::default();
    for p in batch {
        let fence = p.fence.as_ref().map(|f| (&*f.feed, f.token));
        call.push(&p.ch, p.id.as_deref(), &p.data, fence, || ctx.shared.config.channel_rule(&p.ch).history);
    }
    let epoch = new_epoch();
    let params = PublishParams {
        ttl_ms: ctx.cfg.history_ttl_ms,
        dedup_window_ms: ctx.shared.config.dedup.window_ms,
        epoch: &epoch,
        command: ctx.publish_command,
        deadline_ms: deadline.redis_ms,
    };
    let mut cmd = script_cmd(&ctx.publish_script, keys::PUBLISH_LUA, by_sha);
    call.args(&ctx.keys, &params, |a| {
        cmd.arg(a);
    });
    cmd
}

/// What the publish script did with one publish (its triple's `kind`, [`keys::PUBLISH_LUA`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Stored now as this seq (kind 0).
    Stored(u64),
    /// A duplicate id: the seq stored for it earlier (kind 1).
    Duplicate(u64),
    /// Fenced out (kind 2): `highest` is the highest fencing token seen for its feed.
    Fenced {
        /// The highest fencing token the script found for the publish's feed.
        highest: u64,
    },
}

/// An [`Outcome`] per publish answered (in order), and why the call stopped before the rest.
type Published = (Vec<Outcome>, Option<String>);

/// The script's flat array of `n` triples `seq, epoch, kind` → an [`Outcome`] per publish;
/// or `k < n` triples and the error that stopped the call at publish `k + 1`; `None` when it
/// is anything else.
fn parse_published(v: Value, n: usize) -> Option<Published> {
    let Value::Array(mut a) = v else { return None };
    let failed = match a.len() % 3 {
        0 if a.len() == 3 * n => None,
        1 if a.len() < 3 * n => match a.pop() {
            Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
            Some(Value::SimpleString(s)) => Some(s),
            _ => return None,
        },
        _ => return None,
    };
    let int = |v: &Value| match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    };
    let outcome = |t: &[Value]| {
        let n = int(&t[0])?;
        match int(&t[2])? {
            0 => Some(Outcome::Stored(n)),
            1 => Some(Outcome::Duplicate(n)),
            2 => Some(Outcome::Fenced { highest: n }),
            _ => None,
        }
    };
    let stored = a.chunks(3).map(outcome).collect::<Option<Vec<_>>>()?;
    Some((stored, failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_end_at_a_count_or_a_size() {
        let p =
            |len: usize| Pub { ch: "c".into(), id: None, data: Bytes::from(vec![b'x'; len]), reply: None, fence: None };
        let small: Vec<Pub> = (0..1000).map(|_| p(64)).collect();
        assert_eq!(batch_end(&small), BATCH_MAX);
        assert_eq!(batch_end(&small[..3]), 3);
        assert_eq!(batch_end(&[]), 0);
        let big: Vec<Pub> = (0..10).map(|_| p(BATCH_MAX_BYTES / 4)).collect();
        assert_eq!(batch_end(&big), 4, "the publish that reaches the size ends the batch");
        let huge = [p(BATCH_MAX_BYTES * 3), p(1)];
        assert_eq!(batch_end(&huge), 1, "a publish larger than the bound is a batch of its own");
    }

    #[test]
    fn published_triples() {
        let t = |seq: i64, dup: i64| [Value::Int(seq), Value::BulkString(b"e".to_vec()), Value::Int(dup)];
        let v = Value::Array([t(7, 0), t(3, 1)].concat());
        use Outcome::*;
        assert_eq!(parse_published(v.clone(), 2), Some((vec![Stored(7), Duplicate(3)], None)));
        assert_eq!(parse_published(v.clone(), 3), None, "a reply short of a publish answers none");
        let stopped = |v: &Value, why: &[u8]| match v {
            Value::Array(a) => Value::Array([a.clone(), vec![Value::BulkString(why.to_vec())]].concat()),
            _ => unreachable!(),
        };
        assert_eq!(
            parse_published(stopped(&v, b"WRONGTYPE"), 4),
            Some((vec![Stored(7), Duplicate(3)], Some("WRONGTYPE".to_owned()))),
            "two stored, the third failed, the fourth not tried"
        );
        assert_eq!(
            parse_published(Value::Array(vec![Value::BulkString(b"ERR x".to_vec())]), 1),
            Some((vec![], Some("ERR x".to_owned())))
        );
        assert_eq!(parse_published(stopped(&v, b"x"), 2), None, "an error after every publish is no reply");
        assert_eq!(parse_published(Value::Array(t(-1, 0).to_vec()), 1), None);
        let fenced = [Value::BulkString(b"9".to_vec()), Value::BulkString(b"e".to_vec()), Value::Int(2)];
        assert_eq!(parse_published(Value::Array(fenced.to_vec()), 1), Some((vec![Fenced { highest: 9 }], None)));
        assert_eq!(parse_published(Value::Array(t(1, 3).to_vec()), 1), None, "an unknown kind");
        assert_eq!(parse_published(Value::Nil, 1), None);
    }
}
