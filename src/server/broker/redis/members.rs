//! The node's presence members in Redis (docs/redis.md, "Presence"): one task per broker
//! thread applies the joins and leaves of this node's connections in the order the cores made
//! them ([`super::presence::MEMBERS_LUA`], one call per channel for a burst), refreshes every
//! member it owns every third of `presence.member_ttl_ms` and at once when the command link
//! comes back (which also removes and announces the members other nodes stopped refreshing,
//! and writes back this node's members after Redis lost them), and answers `presence` /
//! `presence_stats`.
//!
//! A change whose call fails (Redis away) is not retried as such: a join stays in this node's
//! list and the next refresh adds it (announcing it), a leave is gone from the list and the
//! member's entry expires within the TTL (announced by whichever node refreshes first) or is
//! gone with Redis's data (announced by nobody). So after a failed leave no node can vouch
//! that its `join_leave` subscribers will see it: the channel is marked, its next successful
//! refresh announces `P R`, and every node's subscribers of it get `presence_reset`.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use super::presence::{page_start, valid_cursor, MEMBERS_LUA, PAGE_LUA, REFRESH_LUA, STATS_LUA};
use super::thread::Ctx;
use crate::protocol::presence::{presence_json_raw, presence_stats_json};
use crate::protocol::{self, codes};
use crate::server::broker::PresenceQuery;
use crate::server::bus::{ConnRef, CoreMsg};

/// Changes (or refreshed members) per script call: a herd of thousands of joins goes in a
/// few calls, none of which holds Redis for long.
const PER_CALL: usize = 500;

/// One membership change of a connection of this node.
#[derive(Debug)]
pub enum MemberOp {
    /// The connection joined the presence of `ch` (its subscription was made).
    Join {
        /// Channel name.
        ch: Arc<str>,
        /// The connection's core (whose untracked counter a refused join counts in).
        core: u16,
        /// Its client id.
        client: String,
        /// Its entry ([`super::presence::entry`]: client id, member JSON, user).
        entry: String,
    },
    /// The connection left `ch`.
    Leave {
        /// Channel name.
        ch: Arc<str>,
        /// Its client id.
        client: String,
    },
    /// The command link came back: refresh every member now (Redis may have come back
    /// empty), and announce the resets of the channels whose changes failed meanwhile.
    Relinked,
}

impl MemberOp {
    fn channel(&self) -> Option<&Arc<str>> {
        match self {
            MemberOp::Join { ch, .. } | MemberOp::Leave { ch, .. } => Some(ch),
            MemberOp::Relinked => None,
        }
    }
}

/// The three presence keys of `ch`: members, member entries, users.
fn keys(ctx: &Ctx, ch: &str) -> [String; 3] {
    let topic = ctx.keys.topic(ch);
    [format!("{topic}:pz"), format!("{topic}:pl"), format!("{topic}:pu")]
}

/// Runs `script` (its text `text`) by hash, sending the text once when Redis does not know it.
async fn eval<T: redis::FromRedisValue>(
    ctx: &Ctx,
    script: &redis::Script,
    text: &str,
    keys: &[String],
    args: &[&str],
) -> redis::RedisResult<T> {
    let call = |by_sha| {
        let mut cmd = super::thread::script_cmd(script, text, by_sha);
        cmd.arg(keys.len());
        for k in keys {
            cmd.arg(k);
        }
        for a in args {
            cmd.arg(*a);
        }
        cmd
    };
    match ctx.query(&call(true)).await {
        Err(e) if e.code() == Some("NOSCRIPT") => ctx.query(&call(false)).await,
        r => r,
    }
}

/// The scripts, hashed once.
struct Scripts {
    members: redis::Script,
    refresh: redis::Script,
}

/// Runs the node's membership task until the broker thread stops (see the module docs).
pub async fn run(ctx: Rc<Ctx>, mut rx: UnboundedReceiver<MemberOp>) {
    let ttl = ctx.shared.config.presence.member_ttl_ms;
    let every = Duration::from_millis((ttl / 3).max(100));
    let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let scripts = Scripts { members: redis::Script::new(MEMBERS_LUA), refresh: redis::Script::new(REFRESH_LUA) };
    let mut state = Mine::default();
    loop {
        tokio::select! {
            op = rx.recv() => {
                let Some(op) = op else { return };
                let mut ops = vec![op];
                while let Ok(op) = rx.try_recv() {
                    ops.push(op);
                }
                let relinked = ops.iter().any(|op| matches!(op, MemberOp::Relinked));
                ops.retain(|op| !matches!(op, MemberOp::Relinked));
                apply(&ctx, &scripts, &mut state, ops).await;
                if relinked {
                    refresh_all(&ctx, &scripts, &mut state).await;
                }
            }
            _ = refresh.tick() => refresh_all(&ctx, &scripts, &mut state).await,
        }
    }
}

/// What the membership task keeps.
#[derive(Default)]
struct Mine {
    /// This node's members per channel: client → entry.
    members: HashMap<Arc<str>, HashMap<String, String>>,
    /// Channels with a leave whose call failed: their next successful refresh announces a
    /// reset.
    unsure: HashSet<Arc<str>>,
}

/// Applies a burst of changes: per channel in the order they were made.
async fn apply(ctx: &Ctx, scripts: &Scripts, state: &mut Mine, ops: Vec<MemberOp>) {
    let mut by_ch: Vec<(Arc<str>, Vec<MemberOp>)> = Vec::new();
    for op in ops {
        let Some(ch) = op.channel().cloned() else { continue };
        match by_ch.iter_mut().find(|(c, _)| *c == ch) {
            Some((_, list)) => list.push(op),
            None => by_ch.push((ch, vec![op])),
        }
    }
    let Mine { members: mine, unsure } = state;
    let (ttl, cmd) = (ctx.shared.config.presence.member_ttl_ms.to_string(), ctx.publish_command);
    for (ch, ops) in by_ch {
        let max = ctx.shared.config.channel_rule(&ch).max_members().to_string();
        let (keys, topic) = (keys(ctx, &ch), ctx.keys.topic(&ch));
        for chunk in ops.chunks(PER_CALL) {
            let mut args: Vec<&str> = vec![cmd, &topic, &ttl, &max];
            for op in chunk {
                match op {
                    MemberOp::Join { entry, .. } => args.extend(["J", entry.as_str()]),
                    MemberOp::Leave { client, .. } => args.extend(["L", client.as_str()]),
                    MemberOp::Relinked => {}
                }
            }
            let applied: Option<Vec<i64>> = eval(ctx, &scripts.members, MEMBERS_LUA, &keys, &args).await.ok();
            if applied.is_none() && chunk.iter().any(|op| matches!(op, MemberOp::Leave { .. })) {
                unsure.insert(ch.clone());
            }
            let list = mine.entry(ch.clone()).or_default();
            for (i, op) in chunk.iter().enumerate() {
                match op {
                    MemberOp::Join { core, client, entry, .. } => {
                        if applied.as_ref().is_some_and(|a| a.get(i) == Some(&0)) {
                            ctx.shared.metrics[*core as usize].presence_untracked.fetch_add(1, Relaxed);
                        } else {
                            list.insert(client.clone(), entry.clone());
                        }
                    }
                    MemberOp::Leave { client, .. } => {
                        list.remove(client);
                    }
                    MemberOp::Relinked => {}
                }
            }
        }
        if mine.get(&ch).is_some_and(HashMap::is_empty) {
            mine.remove(&ch);
        }
    }
    ctx.shared.metrics[0].presence_members.store(mine.values().map(HashMap::len).sum::<usize>() as i64, Relaxed);
}

/// Refreshes every member of this node, channel by channel, and removes the expired ones; a
/// channel with a failed leave (members here or not) gets its reset announced by the first
/// call that succeeds.
async fn refresh_all(ctx: &Ctx, scripts: &Scripts, state: &mut Mine) {
    let (ttl, cmd) = (ctx.shared.config.presence.member_ttl_ms.to_string(), ctx.publish_command);
    let Mine { members: mine, unsure } = state;
    let empty = HashMap::new();
    let channels: Vec<Arc<str>> =
        mine.keys().chain(unsure.iter().filter(|c| !mine.contains_key(*c))).cloned().collect();
    for ch in channels {
        let members = mine.get(&ch).unwrap_or(&empty);
        let (keys, topic) = (keys(ctx, &ch), ctx.keys.topic(&ch));
        let list: Vec<&String> = members.values().collect();
        // A channel with no member here left still needs its one call (to announce the reset).
        let chunks: Vec<&[&String]> = if list.is_empty() { vec![&[]] } else { list.chunks(PER_CALL).collect() };
        for chunk in chunks {
            let reset = if unsure.contains(&ch) { "1" } else { "0" };
            let mut args: Vec<&str> = vec![cmd, &topic, &ttl, reset];
            args.extend(chunk.iter().map(|e| e.as_str()));
            // A failed refresh needs no reset: its members expire and come back announced.
            if eval::<i64>(ctx, &scripts.refresh, REFRESH_LUA, &keys, &args).await.is_ok() {
                unsure.remove(&ch);
            }
        }
    }
}

/// Answers a `presence` / `presence_stats` of `conn` about `ch` from Redis.
pub async fn answer(ctx: Rc<Ctx>, ch: Arc<str>, conn: ConnRef, query: PresenceQuery) {
    let [pz, pl, pu] = keys(&ctx, &ch);
    let json = match query {
        PresenceQuery::Stats => {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(STATS_LUA).arg(2).arg(&pz).arg(&pu);
            match ctx.query::<(u64, u64)>(&cmd).await {
                Ok((clients, users)) => presence_stats_json(&ch, clients, users),
                Err(e) => unavailable(&ch, &e),
            }
        }
        PresenceQuery::Members { cursor } => {
            if cursor.as_deref().is_some_and(|c| !valid_cursor(c)) {
                let e = protocol::error_json(codes::BAD_REQUEST, "cursor is not one this server gave", None);
                protocol::with_channel(e, &ch)
            } else {
                let page = ctx.shared.config.presence.page_size.to_string();
                let max_bytes = ctx.shared.config.presence_frame_max_bytes().to_string();
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(PAGE_LUA)
                    .arg(2)
                    .arg(&pz)
                    .arg(&pl)
                    .arg(page_start(cursor.as_deref()))
                    .arg(&page)
                    .arg(&max_bytes);
                match ctx.query::<Vec<String>>(&cmd).await {
                    Ok(r) => {
                        let next = r.first().filter(|n| !n.is_empty()).map(String::as_str);
                        presence_json_raw(&ch, r.iter().skip(1).map(String::as_str), next)
                    }
                    Err(e) => unavailable(&ch, &e),
                }
            }
        }
    };
    ctx.to_core(conn.core as usize, CoreMsg::PresenceAnswer { conn: conn.id, ch, json });
}

/// The `unavailable` answer to a presence query that failed with `e`. Redis's own error text
/// (a script's hash, its line) is for the log, not for the client.
fn unavailable(ch: &str, e: &redis::RedisError) -> Vec<u8> {
    let why = if e.is_timeout() || e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
        e.to_string()
    } else {
        super::thread::warn_limited(
            "broker-presence",
            || tracing::warn!(error = %e, "a presence query failed in redis"),
        );
        "redis refused the query".to_owned()
    };
    protocol::with_channel(super::thread::unavailable(&why).to_json(), ch)
}
