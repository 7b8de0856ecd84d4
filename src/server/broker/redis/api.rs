//! The server API's requests on the Redis broker (docs/api.md): history pages read from a
//! channel's stream, the node-wide actions carried to the other nodes on the control topic,
//! and the revocations kept in Redis for nodes that connect later.
//!
//! A control message is `ORIGIN JSON` on `PREFIXcontrol` (sharded pub/sub on a cluster):
//! `ORIGIN` is this broker thread's random tag, so a node skips its own messages (its cores
//! were told by the core that served the request), and `JSON` is a [`Control`]. Pub/sub is
//! at most once: a node whose pub/sub link was down misses the disconnects and unsubscribes
//! sent meanwhile; revocations it reads again from the sorted set each time a link comes
//! back.

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use redis::Value;

use super::keys;
use super::thread::{unavailable, warn_limited, Ctx};
use crate::auth::revoke::Revocation;
use crate::protocol::RequestError;
use crate::server::broker::{within_page_bytes, Control, HistoryPage, HISTORY_PAGE_MAX_BYTES};
use crate::server::bus::{ConnRef, CoreMsg};

/// Entries of a history page read from Redis per `XRANGE`.
const HISTORY_READ_CHUNK: usize = 16;

/// `GET /api/history/{ch}`: the channel's meta (head, epoch, oldest kept seq; created like a
/// first subscriber creates it when the channel has none), then the stream entries after
/// `from` (the newest `limit` without it) up to the head read with the meta, answered to
/// `reply`'s core.
pub(super) async fn history(ctx: Rc<Ctx>, ch: Arc<str>, reply: ConnRef, from: Option<u64>, limit: usize) {
    let page = read_history(&ctx, &ch, from, limit).await.map_err(|e| Box::new(unavailable(&e.to_string())));
    ctx.to_core(reply.core as usize, CoreMsg::History { reply, ch, page });
}

async fn read_history(ctx: &Ctx, ch: &str, from: Option<u64>, limit: usize) -> redis::RedisResult<HistoryPage> {
    let (head, epoch, mut oldest, _) = ctx.meta(ch, 0).await?;
    let after = match from {
        Some(f) => f.max(oldest - 1),
        None => head.saturating_sub(limit as u64).max(oldest - 1),
    };
    // Read a few entries at a time, so a page of large messages stops at
    // HISTORY_PAGE_MAX_BYTES without `limit` of them having come from Redis.
    let until = head.min(after.saturating_add(limit as u64));
    let (mut messages, mut bytes, mut next) = (Vec::new(), 0, after);
    while next < until && messages.len() < limit && bytes < HISTORY_PAGE_MAX_BYTES {
        let chunk = ctx.range(ch, next, until, (limit - messages.len()).min(HISTORY_READ_CHUNK)).await?;
        let Some(&(last, _)) = chunk.last() else { break };
        next = last;
        bytes += chunk.iter().map(|(_, d)| d.len()).sum::<usize>();
        messages.extend(chunk);
    }
    let messages = within_page_bytes(messages);
    // Trimmed between the two reads: what is kept starts later.
    if let Some((first, _)) = messages.first().filter(|(s, _)| *s > after + 1) {
        oldest = *first;
    }
    Ok(HistoryPage { epoch: epoch.into(), head, oldest, messages })
}

/// `POST /api/disconnect`, `unsubscribe` and `revoke`: stores a revocation in the sorted set,
/// then publishes `msg` on the control topic; answers `reply` with the number of other nodes
/// that received it (the subscribers of the topic, this node's own link excepted), or
/// `unavailable` when Redis could not be reached.
pub(super) async fn send_control(ctx: Rc<Ctx>, msg: Arc<Control>, reply: ConnRef) {
    let result = tell(&ctx, &msg).await.map_err(|e| {
        Box::new(RequestError::unavailable(
            format!("this node acted, but the other nodes could not be told ({e}); retry later"),
            super::thread::UNAVAILABLE_RETRY_MS,
        ))
    });
    ctx.to_core(reply.core as usize, CoreMsg::ControlSent { reply, result });
}

async fn tell(ctx: &Ctx, msg: &Control) -> redis::RedisResult<u64> {
    if let Control::Revoke { revocation } = msg {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(keys::REVOKE_LUA)
            .arg(1)
            .arg(ctx.keys.revoked())
            .arg(keys::revocation_member(revocation))
            .arg(revocation.until_ms())
            .arg(ctx.redis_now_ms());
        let _: u64 = ctx.query(&cmd).await?;
    }
    let json = serde_json::to_string(msg)
        .map_err(|e| redis::RedisError::from((redis::ErrorKind::Io, "json", e.to_string())))?;
    let mut cmd = redis::cmd(ctx.publish_command);
    cmd.arg(ctx.keys.control_topic()).arg(format!("{} {json}", ctx.origin));
    let receivers: u64 = ctx.query(&cmd).await?;
    let own = u64::from(ctx.shared.broker.pubsub_up.load(Relaxed));
    Ok(receivers.saturating_sub(own))
}

/// A message that arrived on the control topic: unless this node sent it, every core applies
/// it to its connections.
pub(super) fn received(ctx: &Ctx, payload: &[u8]) {
    let parsed = std::str::from_utf8(payload)
        .ok()
        .and_then(|p| p.split_once(' '))
        .filter(|(origin, _)| *origin != &*ctx.origin)
        .map(|(_, json)| serde_json::from_str::<Control>(json));
    match parsed {
        None => {}
        Some(Ok(msg)) => {
            let msg = Arc::new(msg);
            for core in 0..ctx.shared.cores {
                ctx.to_core(core, CoreMsg::Control { msg: msg.clone(), reply: None });
            }
        }
        Some(Err(e)) => warn_limited(
            "broker-control",
            || tracing::warn!(error = %e, "a control message of another node did not parse; ignored"),
        ),
    }
}

/// Reads the revocations in force from the sorted set and hands them to every core (called
/// when the command link or the pub/sub link comes up: what was revoked while this node was
/// away or deaf). A failure is logged; the next link event reads again.
pub(super) async fn load_revocations(ctx: Rc<Ctx>) {
    let mut cmd = redis::cmd("ZRANGE");
    cmd.arg(ctx.keys.revoked()).arg(format!("({}", ctx.redis_now_ms())).arg("+inf").arg("BYSCORE").arg("WITHSCORES");
    match ctx.query::<Value>(&cmd).await {
        Ok(v) => {
            let list: Arc<[Revocation]> = scored(v)
                .into_iter()
                .filter_map(|(member, score)| keys::parse_revocation(&member, score as u64))
                .collect();
            if list.is_empty() {
                return;
            }
            for core in 0..ctx.shared.cores {
                ctx.to_core(core, CoreMsg::Revocations(list.clone()));
            }
        }
        Err(e) => warn_limited(
            "broker-revocations",
            || tracing::warn!(error = %e, "cannot read the revocations from redis; reading again when a link comes back"),
        ),
    }
}

/// `(member, score)` pairs of a `WITHSCORES` reply: flat (RESP2: member, score as a string, …)
/// or nested (RESP3: `[[member, score as a double], …]`).
fn scored(v: Value) -> Vec<(String, f64)> {
    fn leaves(v: Value, out: &mut Vec<Value>) {
        match v {
            Value::Array(items) => items.into_iter().for_each(|i| leaves(i, out)),
            other => out.push(other),
        }
    }
    let mut flat = Vec::new();
    leaves(v, &mut flat);
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    flat.chunks_exact(2)
        .filter_map(|pair| {
            let member = text(&pair[0])?;
            let score = match &pair[1] {
                Value::Double(d) => *d,
                other => text(other)?.parse().ok()?,
            };
            Some((member, score))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_read_in_either_protocol() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![b("j:a"), b("1700000000000"), b("u:5:bob"), b("9")]);
        let resp3 = Value::Array(vec![
            Value::Array(vec![b("j:a"), Value::Double(1.7e12)]),
            Value::Array(vec![b("u:5:bob"), Value::Double(9.0)]),
        ]);
        for v in [resp2, resp3] {
            assert_eq!(scored(v), vec![("j:a".to_owned(), 1.7e12), ("u:5:bob".to_owned(), 9.0)]);
        }
    }
}
