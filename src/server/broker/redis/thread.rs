//! The broker thread: one per process, a current-thread tokio runtime that owns every Redis
//! connection of the node.
//!
//! Tasks on it:
//! - **serve** (here): drains the cores' queues; publishes that arrive together are stored as a
//!   batch (`publish`: one call of [`keys::PUBLISH_LUA`]); `sub`/`unsub` go to the channel's
//!   task ([`channel`]), created with the first subscriber and ended with the last; history
//!   fetches of resuming subscribers are `XRANGE` reads; the server API's history pages and
//!   control messages are [`super::api`]'s;
//! - the command link, the pub/sub link and its dispatch, and the health check
//!   ([`links`]).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use redis::Value;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::{Notify, Semaphore};

use super::channel::{self, ChanEvent};
use super::keys::{self, Keys};
use super::links;
use super::members::MemberOp;
use super::publish::{batch_end, publish_batch, Deadline, Pub};
use crate::config::Broker as BrokerConfig;
use crate::log_limit::{Admit, LogLimiter};
use crate::protocol::RequestError;
use crate::redis::clock::local_ms;
use crate::redis::link::Link;
use crate::server::broker::epoch::new_epoch;
use crate::server::broker::{Request, Resume};
use crate::server::bus::CoreMsg;
use crate::server::Shared;
use crate::session::Limit;

/// Batches in flight at once on one Redis; past it the serve task waits (backpressure on the
/// cores). Redis runs the calls one after another anyway: a few in flight hide the round trip
/// and the broker thread's own work, and while they are out, publishes gather in the cores'
/// queues into larger batches, which cost Redis less per publish (benches/broker.rs, 64
/// publishers × 16 in flight, medians of 3: with 4 batches in flight 128 publishes per call
/// and 17 µs of Redis time per publish; with 64, 21 publishes per call and 21 µs).
const BATCHES_IN_FLIGHT: usize = 4;
/// Batches in flight at once on a Redis Cluster. A batch is one call per channel there, and
/// holds its place until its slowest call is answered: while a master fails over, calls to it
/// wait out the request timeout, and a small bound would stall the publishes to every other
/// master behind them.
const BATCHES_IN_FLIGHT_CLUSTER: usize = 64;
/// Requests taken from one core's queue before looking at the next.
const DRAIN_PER_CORE: usize = 1024;
/// The `retry_after_ms` of an `unavailable` answer: how long a client should wait before
/// retrying a publish or a `sub` while the broker reconnects.
pub const UNAVAILABLE_RETRY_MS: u64 = 1_000;

/// Error kinds, indexes into `metrics::BROKER_ERROR_KINDS`.
const ERR_TIMEOUT: usize = 0;
pub(super) const ERR_CONNECTION: usize = 1;
pub(super) const ERR_SCRIPT: usize = 2;
pub(super) const ERR_SERVER: usize = 3;

/// A channel with subscribers on this node, as the serve task sees it.
pub(super) struct ChanHandle {
    tx: UnboundedSender<ChanEvent>,
    /// Subscriptions registered (answered or not) and not yet ended.
    subs: u64,
}

/// Commands for the pub/sub link task, in order.
pub(super) enum Ctl {
    /// Subscribe the topic of this channel (its first subscriber arrived).
    Subscribe(Arc<str>),
    /// Unsubscribe it (its last subscriber left).
    Unsubscribe(Arc<str>),
    /// The pub/sub link of this generation reported a disconnection.
    Lost(u64),
}

/// What every task of the broker thread shares (single thread: `RefCell`, never held across
/// an await).
pub struct Ctx {
    /// Process-wide configuration and metrics.
    pub shared: Arc<Shared>,
    /// `[broker]`.
    pub cfg: BrokerConfig,
    /// Key and topic names.
    pub keys: Keys,
    /// Timeout of one request.
    pub timeout: Duration,
    /// The command link while it is up, with its generation (one per connect).
    pub(super) cmd: RefCell<Option<(u64, Link)>>,
    /// Wakes the command-link task after a request saw the link fail.
    pub(super) cmd_lost: Notify,
    /// Queues to the cores, with what waits for room.
    out: RefCell<Outbox>,
    /// Wakes the spill-retry task.
    spilled: Notify,
    /// Channels with subscribers on this node.
    pub(super) chans: RefCell<HashMap<Arc<str>, ChanHandle>>,
    /// To the pub/sub link task.
    pub(super) ctl: UnboundedSender<Ctl>,
    pub(super) publish_script: redis::Script,
    pub(super) meta_script: redis::Script,
    pub(super) publish_command: &'static str,
    /// To the membership task ([`super::members`]): this node's presence joins and leaves.
    pub(super) members: UnboundedSender<super::members::MemberOp>,
    /// Redis is a Redis Cluster: a script call must stay within one hash slot.
    pub(super) cluster: bool,
    /// Redis's clock minus this node's, in milliseconds (measured with `TIME` on connect and
    /// by every health check): scripts' deadlines are written on Redis's clock, so a node
    /// whose clock is off does not see every publish come back late.
    pub(super) clock_offset_ms: Cell<i64>,
    /// Whether [`Ctx::clock_offset_ms`] was measured at least once.
    pub(super) clock_measured: Cell<bool>,
    /// This node's tag on the control topic (random per process): its own messages come back
    /// to it and are skipped ([`super::api`]).
    pub(super) origin: Arc<str>,
}

/// The queues to the cores and their spill lists (a full queue never blocks the thread).
struct Outbox {
    tx: Vec<Sender<CoreMsg>>,
    spill: Vec<VecDeque<CoreMsg>>,
}

impl Ctx {
    /// Sends `msg` to core `core`, in order, and rings its doorbell.
    pub fn to_core(&self, core: usize, msg: CoreMsg) {
        let mut out = self.out.borrow_mut();
        let Outbox { tx, spill } = &mut *out;
        if spill[core].is_empty() {
            if let Err(TrySendError::Full(m)) = tx[core].try_send(msg) {
                spill[core].push_back(m);
                self.spilled.notify_one();
            }
        } else {
            spill[core].push_back(msg);
        }
        self.shared.doorbells[core].ring();
    }

    /// The command link and its generation, or `None` while it is down.
    pub fn link(&self) -> Option<(u64, Link)> {
        self.cmd.borrow().clone()
    }

    /// Records a failed request made on link generation `gen`; a connection-level failure
    /// takes that link down (the command-link task reconnects). A failure on a link that a
    /// reconnect already replaced leaves the new one alone: during a cluster failover,
    /// requests sent to the lost master time out `request_timeout_ms` later, after the new
    /// link is up, and must not take it down again. On a cluster a timeout is one shard's
    /// (the cluster client holds a connection per node and repairs them itself): it is
    /// counted but leaves the link, and so the other shards' publishes, alone; a cluster
    /// that stops answering altogether is caught by the health check (`TIME`) (`Ctx::drop_link`).
    pub fn failed(&self, gen: u64, e: &redis::RedisError) {
        let m = &self.shared.broker;
        if e.is_timeout() {
            m.error(ERR_TIMEOUT);
            if self.cluster {
                return;
            }
        } else if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
            m.error(ERR_CONNECTION);
        } else if is_noscript(e) {
            return; // answered by sending the script itself
        } else {
            m.error(ERR_SERVER);
            return;
        }
        self.drop_link(gen, e);
    }

    /// Takes command link generation `gen` down after `e`, if it is still the current one (the
    /// command-link task reconnects).
    pub(super) fn drop_link(&self, gen: u64, e: &redis::RedisError) {
        let current = self.cmd.borrow().as_ref().is_some_and(|(g, _)| *g == gen);
        if current {
            *self.cmd.borrow_mut() = None;
            self.shared.broker.up.store(false, Relaxed);
            warn_limited(
                "broker",
                || tracing::warn!(error = %e, "redis command link failed; publishes are refused until it is back"),
            );
            self.cmd_lost.notify_one();
        }
    }

    /// Runs `cmd` on the command link (`Ctx::measured`).
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let Some((gen, mut link)) = self.link() else { return Err(down()) };
        self.measured(gen, cmd.query_async::<T>(&mut link)).await
    }

    /// Awaits one request on the command link with the request timeout, recording its latency
    /// and, on failure, the error (which may take link generation `gen` down).
    pub(super) async fn measured<T>(
        &self,
        gen: u64,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> redis::RedisResult<T> {
        self.measured_until(gen, tokio::time::Instant::now() + self.timeout, f).await
    }

    /// [`Ctx::measured`] with the wait ending at `until` rather than after the request timeout.
    pub(super) async fn measured_until<T>(
        &self,
        gen: u64,
        until: tokio::time::Instant,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> redis::RedisResult<T> {
        let t0 = Instant::now();
        let r = match tokio::time::timeout_at(until, f).await {
            Ok(r) => r,
            Err(_) => Err(timed_out()),
        };
        self.shared.broker.request(t0.elapsed());
        if let Err(e) = &r {
            self.failed(gen, e);
        }
        r
    }

    /// Now on Redis's clock, in milliseconds since the Unix epoch (this node's clock plus the
    /// measured offset).
    pub fn redis_now_ms(&self) -> u64 {
        local_ms().saturating_add(self.clock_offset_ms.get()).max(0) as u64
    }

    /// Calls the meta script ([`keys::META_LUA`]) for `ch`: `(seq, epoch, oldest, data)`, with
    /// `data` the message stored under seq `at` (`None` for `at` 0, or when it is gone).
    pub async fn meta(&self, ch: &str, at: u64) -> redis::RedisResult<(u64, String, u64, Option<Vec<u8>>)> {
        let call = |by_sha| {
            let mut cmd = script_cmd(&self.meta_script, keys::META_LUA, by_sha);
            cmd.arg(2)
                .arg(self.keys.meta(ch))
                .arg(self.keys.stream(ch))
                .arg(&*new_epoch())
                .arg(self.cfg.history_ttl_ms)
                .arg(at);
            cmd
        };
        let r: redis::RedisResult<(u64, String, u64, Vec<u8>)> = match self.query(&call(true)).await {
            Err(e) if is_noscript(&e) => self.query(&call(false)).await,
            r => r,
        };
        r.map(|(seq, epoch, oldest, data)| (seq, epoch, oldest, Some(data).filter(|d| !d.is_empty())))
    }

    /// Calls the epoch bump ([`keys::BUMP_LUA`]) for `ch` known at epoch `known`: the
    /// channel's epoch afterwards.
    pub async fn bump_epoch(&self, ch: &str, known: &str) -> redis::RedisResult<String> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(keys::BUMP_LUA).arg(1).arg(self.keys.meta(ch)).arg(known).arg(&*new_epoch());
        self.query(&cmd).await
    }

    /// Reads history entries of `ch` with seqs `after+1 ..= until`, at most `count`:
    /// `(seq, data)` in order.
    pub async fn range(&self, ch: &str, after: u64, until: u64, count: usize) -> redis::RedisResult<Vec<(u64, Bytes)>> {
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(self.keys.stream(ch)).arg(format!("{}-0", after + 1)).arg(format!("{until}-0")).arg("COUNT").arg(count);
        let v: Value = self.query(&cmd).await?;
        Ok(parse_entries(v))
    }

    /// Hands `ev` to the task of channel `ch`, if it has one.
    pub(super) fn to_channel(&self, ch: &str, ev: ChanEvent) {
        if let Some(h) = self.chans.borrow().get(ch) {
            let _ = h.tx.send(ev);
        }
    }

    /// Hands `ev()` to every channel task.
    pub(super) fn to_all_channels(&self, ev: impl Fn() -> ChanEvent) {
        for h in self.chans.borrow().values() {
            let _ = h.tx.send(ev());
        }
    }
}

thread_local! {
    static LIMITERS: RefCell<(Option<Instant>, HashMap<&'static str, LogLimiter>)> = RefCell::new((None, HashMap::new()));
}

/// Runs `log` unless lines of `kind` exceed 5 per 10 s (Redis being down must not flood the
/// log); the first admitted line after a silence says how many were suppressed.
pub(super) fn warn_limited(kind: &'static str, log: impl FnOnce()) {
    LIMITERS.with(|l| {
        let (start, map) = &mut *l.borrow_mut();
        let now = start.get_or_insert_with(Instant::now).elapsed().as_millis() as u64;
        let lim = map.entry(kind).or_insert_with(|| LogLimiter::new(5, 10_000));
        if let Some(n) = lim.flush(now) {
            tracing::warn!(kind, suppressed = n, "suppressed similar broker log lines");
        }
        if let Admit::Log { .. } = lim.admit(now) {
            log();
        }
    })
}

/// `EVALSHA` of `script`'s hash, or `EVAL` of its `text` (after a `NOSCRIPT`), without keys
/// and arguments yet.
pub(super) fn script_cmd(script: &redis::Script, text: &str, by_sha: bool) -> redis::Cmd {
    let mut cmd = redis::cmd(if by_sha { "EVALSHA" } else { "EVAL" });
    if by_sha {
        cmd.arg(script.get_hash());
    } else {
        cmd.arg(text);
    }
    cmd
}

pub(super) fn down() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "the redis command link is down"))
}

fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "redis request timed out"))
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
}

/// The refusal of a publish (or `sub`) while Redis cannot be reached: a publish refused so
/// is certainly not stored.
pub fn unavailable(why: &str) -> RequestError {
    RequestError::unavailable(format!("the broker cannot reach redis ({why}); retry later"), UNAVAILABLE_RETRY_MS)
}

/// The answer to a publish sent to Redis that got no reply in time (`why`): it may or may
/// not be stored, and a retry with the same id is safe.
pub fn unknown(why: &str) -> RequestError {
    RequestError::unknown_outcome(
        format!(
            "the publish went to redis and no answer came ({why}): it may or may not be \
             stored; retry with the same Idempotency-Key (WebSocket: the same id)"
        ),
        UNAVAILABLE_RETRY_MS,
    )
}

/// Stream entries `[[id, [field, value, …]], …]` as `(seq, value of field d)`.
fn parse_entries(v: Value) -> Vec<(u64, Bytes)> {
    let Value::Array(entries) = v else { return Vec::new() };
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let Value::Array(mut parts) = e else { continue };
        if parts.len() != 2 {
            continue;
        }
        let fields = parts.pop();
        let id = parts.pop();
        let seq = match id {
            Some(Value::BulkString(b)) => std::str::from_utf8(&b).ok().and_then(keys::entry_seq),
            Some(Value::SimpleString(s)) => keys::entry_seq(&s),
            _ => None,
        };
        let data = match fields {
            Some(Value::Array(f)) => f.into_iter().nth(1),
            Some(Value::Map(m)) => m.into_iter().next().map(|(_, v)| v),
            _ => None,
        };
        if let (Some(seq), Some(Value::BulkString(d))) = (seq, data) {
            out.push((seq, Bytes::from(d)));
        }
    }
    out
}

/// The broker thread's body: builds the runtime and serves until every core is gone.
pub fn run(shared: Arc<Shared>, inboxes: Vec<Receiver<Request>>, outboxes: Vec<Sender<CoreMsg>>, wake: Arc<Notify>) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the broker thread's runtime; the redis broker stays down");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, serve(shared, inboxes, outboxes, wake));
}

async fn serve(
    shared: Arc<Shared>,
    inboxes: Vec<Receiver<Request>>,
    outboxes: Vec<Sender<CoreMsg>>,
    wake: Arc<Notify>,
) {
    let cfg = shared.config.broker.clone();
    let (ctl, ctl_rx) = unbounded_channel();
    let (members, members_rx) = unbounded_channel();
    let cores = outboxes.len();
    let ctx = Rc::new(Ctx {
        keys: Keys::new(&cfg.key_prefix),
        timeout: Duration::from_millis(cfg.request_timeout_ms),
        publish_command: Link::publish_command(&cfg),
        members,
        cluster: cfg.cluster_urls().is_some(),
        clock_offset_ms: Cell::new(0),
        clock_measured: Cell::new(false),
        cfg,
        cmd: RefCell::new(None),
        cmd_lost: Notify::new(),
        out: RefCell::new(Outbox { tx: outboxes, spill: (0..cores).map(|_| VecDeque::new()).collect() }),
        spilled: Notify::new(),
        chans: RefCell::new(HashMap::new()),
        ctl,
        publish_script: redis::Script::new(keys::PUBLISH_LUA),
        meta_script: redis::Script::new(keys::META_LUA),
        origin: new_epoch(),
        shared,
    });
    tokio::task::spawn_local(links::command_link(ctx.clone()));
    tokio::task::spawn_local(links::pubsub_link(ctx.clone(), ctl_rx));
    tokio::task::spawn_local(retry_spill(ctx.clone()));
    tokio::task::spawn_local(links::health(ctx.clone()));
    tokio::task::spawn_local(super::members::run(ctx.clone(), members_rx));
    let inflight = Arc::new(Semaphore::new(if ctx.cluster { BATCHES_IN_FLIGHT_CLUSTER } else { BATCHES_IN_FLIGHT }));
    loop {
        let mut batch = Vec::new();
        let mut any = false;
        let mut connected = 0;
        for inbox in &inboxes {
            for _ in 0..DRAIN_PER_CORE {
                match inbox.try_recv() {
                    Ok(req) => {
                        any = true;
                        handle(&ctx, req, &mut batch);
                    }
                    Err(TryRecvError::Empty) => {
                        connected += 1;
                        break;
                    }
                    Err(TryRecvError::Disconnected) => break,
                }
            }
        }
        while !batch.is_empty() {
            let rest = batch.split_off(batch_end(&batch));
            // Its clock starts before the wait for a turn: a batch that waited out the request
            // timeout is refused unsent rather than answered late.
            let deadline = Deadline::from_now(&ctx);
            let Ok(permit) = inflight.clone().acquire_owned().await else { break };
            let ctx = ctx.clone();
            let chunk = std::mem::replace(&mut batch, rest);
            tokio::task::spawn_local(async move {
                publish_batch(&ctx, chunk, deadline).await;
                drop(permit);
            });
        }
        if connected == 0 && !any {
            return; // every core is gone: the server stopped
        }
        if any {
            tokio::task::yield_now().await;
        } else {
            wake.notified().await;
        }
    }
}

fn handle(ctx: &Rc<Ctx>, req: Request, batch: &mut Vec<Pub>) {
    match req {
        Request::Publish { ch, id, data, reply, fence } => batch.push(Pub { ch, id, data, reply, fence }),
        Request::Subscribe { ch, conn, from, epoch, member } => {
            if let Some(m) = member {
                let json = crate::protocol::presence::member_json(&m);
                let entry = super::presence::entry(&m.client, &json, m.user.as_deref());
                let op = MemberOp::Join { ch: ch.clone(), core: conn.core, client: m.client.to_string(), entry };
                let _ = ctx.members.send(op);
            }
            let mut chans = ctx.chans.borrow_mut();
            // A channel's task is this node's per-channel state: it counts against
            // `limits.max_channels` while it lives (publishes create none here).
            if !chans.contains_key(&ch) && !ctx.shared.channels.try_acquire() {
                drop(chans);
                ctx.shared.metrics[conn.core as usize].session.limit_refused(Limit::MaxChannels);
                let resume = Resume::Refused(Box::new(ctx.shared.channels.refusal()));
                let msg = CoreMsg::Subscribed { ch, conn: conn.id, head: 0, epoch: "".into(), resume };
                return ctx.to_core(conn.core as usize, msg);
            }
            let h = chans.entry(ch.clone()).or_insert_with(|| {
                let (tx, rx) = unbounded_channel();
                tokio::task::spawn_local(channel::run(ctx.clone(), ch.clone(), rx));
                let _ = ctx.ctl.send(Ctl::Subscribe(ch.clone()));
                ChanHandle { tx, subs: 0 }
            });
            h.subs += 1;
            let _ = h.tx.send(ChanEvent::Sub { conn, from, epoch });
        }
        Request::Presence { ch, conn, query } => {
            tokio::task::spawn_local(super::members::answer(ctx.clone(), ch, conn, query));
        }
        Request::Unsubscribe { ch, core, member } => {
            if let Some(id) = member {
                let client = crate::server::presence::client_id(&ctx.shared.node_id, core, id);
                let _ = ctx.members.send(MemberOp::Leave { ch: ch.clone(), client });
            }
            let mut chans = ctx.chans.borrow_mut();
            let Some(h) = chans.get_mut(&ch) else { return };
            let _ = h.tx.send(ChanEvent::Unsub(core as usize));
            h.subs = h.subs.saturating_sub(1);
            if h.subs == 0 {
                let _ = h.tx.send(ChanEvent::Stop);
                chans.remove(&ch);
                ctx.shared.channels.release();
                let _ = ctx.ctl.send(Ctl::Unsubscribe(ch));
            }
        }
        Request::Fetch { ch, conn, after, until } => {
            let ctx = ctx.clone();
            tokio::task::spawn_local(async move {
                let n = crate::server::broker::home::REPLAY_BATCH;
                let (frames, evicted) = match ctx.range(&ch, after, until, n).await {
                    Ok(entries) => {
                        if entries.first().is_some_and(|(seq, _)| *seq != after + 1) || entries.is_empty() {
                            let oldest = entries.first().map_or(until + 1, |(s, _)| *s);
                            (Vec::new(), Some(oldest))
                        } else {
                            let frames = entries.iter().map(|(seq, d)| channel::frame(&ch, *seq, d)).collect();
                            (frames, None)
                        }
                    }
                    // The replay cannot go on now: the subscriber restarts from what is kept
                    // (a reset), rather than waiting with a stalled replay.
                    Err(_) => (Vec::new(), Some(until + 1)),
                };
                ctx.to_core(conn.core as usize, CoreMsg::ReplayBatch { ch, conn: conn.id, frames, evicted });
            });
        }
        Request::History { ch, reply, from, limit } => {
            tokio::task::spawn_local(super::api::history(ctx.clone(), ch, reply, from, limit));
        }
        Request::Control { msg, reply } => {
            tokio::task::spawn_local(super::api::send_control(ctx.clone(), msg, reply));
        }
    }
}

/// `f` bounded by the request timeout (a timeout is an error like any other).
pub(super) async fn timed<T>(
    ctx: &Ctx,
    f: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(ctx.timeout, f).await {
        Ok(r) => r,
        Err(_) => Err(timed_out()),
    }
}

/// Retries the spill lists every millisecond while any holds a message.
async fn retry_spill(ctx: Rc<Ctx>) {
    loop {
        ctx.spilled.notified().await;
        loop {
            let pending = {
                let mut out = ctx.out.borrow_mut();
                let Outbox { tx, spill } = &mut *out;
                for (core, q) in spill.iter_mut().enumerate() {
                    let before = q.len();
                    while let Some(m) = q.pop_front() {
                        if let Err(TrySendError::Full(m)) = tx[core].try_send(m) {
                            q.push_front(m);
                            break;
                        }
                    }
                    if q.len() != before {
                        ctx.shared.doorbells[core].ring();
                    }
                }
                spill.iter().any(|q| !q.is_empty())
            };
            if !pending {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
