//! The broker thread's two connections to Redis, kept up by their own tasks:
//! - **command link** (`command_link`): connects (full-jitter backoff), loads the scripts,
//!   and reconnects after a failure; while it is down `tether_broker_up` is 0, `/readyz` is
//!   503 and publishes are refused with `unavailable`. `health` pings it every second so a
//!   dead Redis is noticed on an idle node too;
//! - **pub/sub link** (`pubsub_link`): subscribes and unsubscribes the topics of channels
//!   with local subscribers, in order; after a loss it reconnects, resubscribes them all and
//!   tells every channel task, which repairs its gap. While it is down
//!   `tether_broker_pubsub_up` is 0, `/readyz` is 503 and `sub` is refused with
//!   `unavailable`. `dispatch` hands its pushes to the channel tasks.

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::channel::ChanEvent;
use super::clock::measure_clock;
use super::keys::Payload;
use super::thread::{timed, warn_limited, Ctl, Ctx, ERR_CONNECTION, ERR_SERVER};
use crate::config::Broker as BrokerConfig;
use crate::protocol::backoff::{Backoff, BackoffConfig};
use crate::redis::link::Link;
use crate::redis::REPLY_GRACE;

/// Topics per `SUBSCRIBE` command when resubscribing after a reconnect.
const SUBSCRIBE_CHUNK: usize = 256;

fn backoff() -> Backoff {
    Backoff::new(BackoffConfig {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(5),
        stable_after: Duration::from_secs(10),
    })
}

/// Keeps the command link up: connects, waits for a failure, reconnects with full-jitter
/// backoff. Each return of the link asks every channel task to check its head (a Redis that
/// came back empty changes epochs; one that failed over may have lost messages).
pub(super) async fn command_link(ctx: Rc<Ctx>) {
    let mut backoff = backoff();
    let mut ever = false;
    let mut gen = 0u64;
    loop {
        // Replies to publishes are awaited up to REPLY_GRACE past the request timeout; every
        // other request is bounded by the request timeout itself (`timed`). On one Redis the
        // link speaks RESP3 for its disconnection push: a connection that Redis closed while
        // idle is taken down at once, so a publish after it is refused unsent (503) rather
        // than meeting the dead connection (an unknown outcome, 504). A cluster client
        // repairs its connections itself.
        let (push_tx, push_rx) = unbounded_channel();
        let push = if ctx.cluster { None } else { Some(push_tx) };
        let opened = match Link::open_with(&ctx.cfg, push, ctx.timeout, ctx.timeout + REPLY_GRACE).await {
            Ok(mut link) => load_scripts(&ctx, &mut link).await.map(|()| link),
            Err(e) => Err(e),
        };
        match opened {
            Ok(link) => {
                let since = Instant::now();
                gen += 1;
                *ctx.cmd.borrow_mut() = Some((gen, link));
                if !ctx.cluster {
                    tokio::task::spawn_local(command_link_lost(ctx.clone(), push_rx, gen));
                }
                if let Err(e) = measure_clock(&ctx).await {
                    // Publishes then go out with this node's clock (offset 0, or the last
                    // measured); the next health check measures again.
                    tracing::debug!(error = %e, "redis TIME failed");
                }
                ctx.shared.broker.up.store(true, Relaxed);
                if ever {
                    ctx.shared.broker.reconnects.fetch_add(1, Relaxed);
                    tracing::info!("redis command link is back");
                    ctx.to_all_channels(|| ChanEvent::Resync);
                    let _ = ctx.members.send(super::members::MemberOp::Relinked);
                } else {
                    tracing::info!(url = %redacted(&ctx.cfg), "connected to redis");
                }
                tokio::task::spawn_local(super::api::load_revocations(ctx.clone()));
                ever = true;
                ctx.cmd_lost.notified().await;
                backoff.connected_for(since.elapsed());
                tokio::time::sleep(backoff.next_delay(None)).await;
            }
            Err(e) => {
                ctx.shared.broker.error(ERR_CONNECTION);
                warn_limited(
                    "broker-connect",
                    || tracing::warn!(error = %e, url = %redacted(&ctx.cfg), "cannot connect to redis; retrying"),
                );
                tokio::time::sleep(backoff.next_delay(None)).await;
            }
        }
    }
}

/// Takes command link generation `gen` down when its connection reports its end (a RESP3
/// disconnection push, or its push channel closing with it).
async fn command_link_lost(ctx: Rc<Ctx>, mut pushes: UnboundedReceiver<PushInfo>, gen: u64) {
    while let Some(p) = pushes.recv().await {
        if p.kind == PushKind::Disconnection {
            break;
        }
    }
    let e = redis::RedisError::from((redis::ErrorKind::Io, "the redis connection ended"));
    ctx.drop_link(gen, &e);
}

/// Loads both scripts into Redis's script cache (on a cluster, each node loads them on its
/// first `NOSCRIPT`, answered by sending the script itself).
async fn load_scripts(ctx: &Ctx, link: &mut Link) -> redis::RedisResult<()> {
    if let Link::Single(_) = link {
        for script in [&ctx.publish_script, &ctx.meta_script] {
            timed(ctx, script.load_async(link)).await?;
        }
    }
    Ok(())
}

/// The Redis URL(s) without credentials, for logs.
fn redacted(cfg: &BrokerConfig) -> String {
    use crate::logging::redact_url;
    match cfg.cluster_urls() {
        Some(urls) => urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>().join(","),
        None => redact_url(&cfg.url),
    }
}

/// Keeps the pub/sub link: subscribes and unsubscribes topics in order, reconnects after a
/// loss and resubscribes every channel with local subscribers, telling each channel task.
pub(super) async fn pubsub_link(ctx: Rc<Ctx>, mut ctl: UnboundedReceiver<Ctl>) {
    let mut backoff = backoff();
    let mut gen = 0u64;
    let mut ever = false;
    // Full jitter before every attempt after a failure, the first one included: a Redis
    // restart must not see every node come back in the same millisecond.
    'connect: loop {
        gen += 1;
        let (push_tx, push_rx) = unbounded_channel();
        let mut link = match Link::open(&ctx.cfg, Some(push_tx), ctx.timeout).await {
            Ok(l) => l,
            Err(e) => {
                let why = "cannot open the redis pub/sub link; retrying";
                if pubsub_down(&ctx, &mut ctl, backoff.next_delay(None), why, &e).await {
                    continue 'connect;
                }
                return;
            }
        };
        let since = Instant::now();
        tokio::task::spawn_local(dispatch(ctx.clone(), push_rx, gen));
        // The control topic first (the server API's node-wide actions), then everything with
        // subscribers now, in chunks; then each channel repairs its gap.
        let names: Vec<Arc<str>> = ctx.chans.borrow().keys().cloned().collect();
        let control = std::iter::once::<Vec<String>>(vec![ctx.keys.control_topic()]);
        let channels = names.chunks(SUBSCRIBE_CHUNK).map(|chunk| chunk.iter().map(|c| ctx.keys.topic(c)).collect());
        for topics in control.chain(channels) {
            if let Err(e) = timed(&ctx, link.subscribe(&topics)).await {
                // E.g. an ACL without `subscribe`: the link is up but useless.
                let why = "resubscribing on the redis pub/sub link failed; reconnecting";
                backoff.connected_for(since.elapsed());
                if pubsub_down(&ctx, &mut ctl, backoff.next_delay(None), why, &e).await {
                    continue 'connect;
                }
                return;
            }
        }
        if ever {
            ctx.shared.broker.reconnects.fetch_add(1, Relaxed);
            tracing::info!(channels = names.len(), "redis pub/sub link is back; repairing gaps");
        }
        ever = true;
        for ch in &names {
            ctx.to_channel(ch, ChanEvent::Linked);
        }
        // Revocations made while this link was down reached this node by no message. With the
        // command link down there is nothing to read them with: its coming up reads them.
        if ctx.cmd.borrow().is_some() {
            tokio::task::spawn_local(super::api::load_revocations(ctx.clone()));
        }
        // After the `Linked`s: a `sub` that saw the node ready reaches its channel task behind
        // them, so it is answered from the relinked channel, not refused.
        ctx.shared.broker.pubsub_up.store(true, Relaxed);
        loop {
            let Some(first) = ctl.recv().await else { return };
            let mut cmds = vec![first];
            while let Ok(c) = ctl.try_recv() {
                cmds.push(c);
            }
            for c in cmds {
                let r = match c {
                    Ctl::Lost(g) if g == gen => {
                        Err(redis::RedisError::from((redis::ErrorKind::Io, "pub/sub link lost")))
                    }
                    Ctl::Lost(_) => Ok(()),
                    Ctl::Subscribe(ch) => {
                        // A channel whose last subscriber already left again needs nothing.
                        if !ctx.chans.borrow().contains_key(&ch) {
                            continue;
                        }
                        let r = timed(&ctx, link.subscribe(&[ctx.keys.topic(&ch)])).await;
                        if r.is_ok() {
                            ctx.to_channel(&ch, ChanEvent::Linked);
                        }
                        r
                    }
                    Ctl::Unsubscribe(ch) => {
                        if ctx.chans.borrow().contains_key(&ch) {
                            continue; // subscribed again meanwhile
                        }
                        timed(&ctx, link.unsubscribe(&[ctx.keys.topic(&ch)])).await
                    }
                };
                if let Err(e) = r {
                    let why = "redis pub/sub link lost; reconnecting";
                    backoff.connected_for(since.elapsed());
                    if pubsub_down(&ctx, &mut ctl, backoff.next_delay(None), why, &e).await {
                        continue 'connect;
                    }
                    return;
                }
            }
        }
    }
}

/// The pub/sub link is down (`why`, after `e`; logged within the broker's log limit): marks it so
/// (`tether_broker_pubsub_up` 0, `/readyz` 503), tells every channel task, and waits `delay`
/// before the next attempt, answering the `sub`s of new channels meanwhile (their channels
/// learn the link is down and refuse with `unavailable`; the reconnect subscribes whatever
/// has subscribers then). `false` when the broker thread is ending.
async fn pubsub_down(
    ctx: &Ctx,
    ctl: &mut UnboundedReceiver<Ctl>,
    delay: Duration,
    why: &str,
    e: &redis::RedisError,
) -> bool {
    ctx.shared.broker.pubsub_up.store(false, Relaxed);
    ctx.shared.broker.error(ERR_CONNECTION);
    warn_limited("broker-pubsub", || tracing::warn!(error = %e, "{why}"));
    ctx.to_all_channels(|| ChanEvent::Unlinked);
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return true,
            c = ctl.recv() => match c {
                None => return false,
                Some(Ctl::Subscribe(ch)) => ctx.to_channel(&ch, ChanEvent::Unlinked),
                Some(_) => {}
            },
        }
    }
}

/// Hands the pushes of pub/sub link generation `gen` to channel tasks.
async fn dispatch(ctx: Rc<Ctx>, mut rx: UnboundedReceiver<PushInfo>, gen: u64) {
    let cluster = ctx.cfg.cluster_urls().is_some();
    let control_topic = ctx.keys.control_topic();
    while let Some(push) = rx.recv().await {
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                let mut data = push.data.into_iter();
                let (Some(Value::BulkString(topic)), Some(Value::BulkString(payload))) = (data.next(), data.next())
                else {
                    continue;
                };
                if topic == control_topic.as_bytes() {
                    super::api::received(&ctx, &payload);
                    continue;
                }
                let Some(ch) = ctx.keys.channel_of(&topic) else { continue };
                if payload == super::presence::RESET_PAYLOAD {
                    ctx.to_channel(ch, ChanEvent::PresenceReset);
                    continue;
                }
                if let Some(c) = super::presence::Change::parse(&payload) {
                    let ev = ChanEvent::Presence { joined: c.joined, client: c.client, json: c.json.into() };
                    ctx.to_channel(ch, ev);
                    continue;
                }
                let Some(p) = Payload::parse(&payload) else {
                    ctx.shared.broker.error(ERR_SERVER);
                    continue;
                };
                let start = payload.len() - p.data.len();
                let ev =
                    ChanEvent::Live { seq: p.seq, epoch: p.epoch.into(), data: Bytes::from(payload).slice(start..) };
                ctx.to_channel(ch, ev);
            }
            // A cluster link resubscribes by itself after a node is lost or a slot moves;
            // the confirmation is when that channel can repair its gap.
            PushKind::SSubscribe | PushKind::Subscribe if cluster => {
                if let Some(Value::BulkString(topic)) = push.data.first() {
                    if let Some(ch) = ctx.keys.channel_of(topic) {
                        ctx.to_channel(ch, ChanEvent::Linked);
                    }
                }
            }
            // A lost node (on a cluster: one of its nodes, perhaps failing over) ends this
            // link: a new one learns the topology afresh and resubscribes everything, and each
            // channel repairs its gap. (The cluster client's own resubscription would keep
            // retrying the dead node's address.)
            PushKind::Disconnection => break,
            _ => {}
        }
    }
    let _ = ctx.ctl.send(Ctl::Lost(gen));
}

/// How often an idle command link is checked (with `TIME`), in milliseconds.
const HEALTH_MS: u64 = 1_000;

/// Checks the command link every [`HEALTH_MS`] with `TIME` (which also measures Redis's clock
/// against this node's, for the publish script's deadline): a Redis that died while this
/// node had nothing to ask is noticed within a second or so (`/readyz` turns 503, a load
/// balancer sends new clients elsewhere).
pub(super) async fn health(ctx: Rc<Ctx>) {
    let mut every = tokio::time::interval(Duration::from_millis(HEALTH_MS));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Some((gen, _)) = ctx.link() {
            // A timeout here means Redis as a whole stopped answering (on a cluster, a request
            // timeout alone only counts: see `Ctx::failed`).
            if let Err(e) = measure_clock(&ctx).await {
                if e.is_timeout() {
                    ctx.drop_link(gen, &e);
                }
            }
        }
    }
}
