//! One task per channel with subscribers on this node: it turns the channel's Redis pub/sub
//! stream into gap-free, duplicate-free deliveries to the cores, and answers `sub`s at a
//! seam that matches them.
//!
//! The task handles its events in order, one at a time, so everything it sends to one core
//! (`Subscribed`, `Deliver`, `Reset`) is ordered, which is the [`Broker`] contract:
//! - `last` is the seq of the last message this node delivered (its head); a `sub` is
//!   answered with head `last`, and every later delivery carries `last + 1, …`;
//! - a pub/sub message with seq `last + 1` is delivered; one at or below `last` is a
//!   duplicate (dropped); one beyond `last + 1` means messages were lost on the way (Redis
//!   pub/sub is at-most-once): the missing ones are read from the stream and delivered
//!   first (`tether_broker_gap_repairs_total`);
//! - after the pub/sub link comes back (`Linked`), after the command link comes back
//!   (`Resync`), and every third of `history_ttl_ms`, the task reads the channel's meta: a
//!   head beyond `last` is repaired the same way, and an epoch other than the one it knows
//!   (Redis restarted empty, the channel expired) is announced to every subscriber as a
//!   `reset` with reason `epoch`, then the new epoch's history reaches each subscriber from
//!   its oldest message as a replay paced by its queue, like a resume's: never a silent gap,
//!   never a seq reused with other data. A head *below* `last`
//!   under the same epoch (a failover lost acked messages) moves the channel to a new epoch
//!   ([`super::keys::BUMP_LUA`]) and is announced the same way; so does a head that is
//!   back at or past `last` with *other data* under seq `last` (a failover lost acked
//!   messages and new publishes took their seqs before this node looked);
//! - a pub/sub message at or below `last` that is not the very message delivered last is
//!   usually a copy that crossed a repair on the way, but it may be the first of the new
//!   publishes after such a failover: unless the head was checked in the last
//!   [`RECHECK_MS`], it makes the task check the head (and data under `last`) now, so the
//!   subscribers get their `reset` at once rather than at the next link change.
//!
//! [`Broker`]: crate::server::broker::Broker

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc::UnboundedReceiver;

use super::thread::{unavailable, Ctx};
use crate::protocol::ResetReason;
use crate::published::Published;
use crate::server::broker::home::REPLAY_BATCH;
use crate::server::broker::Resume;
use crate::server::bus::{ConnRef, CoreMsg};

/// What a channel task is told, in order.
#[derive(Debug)]
pub enum ChanEvent {
    /// A `sub` from `conn` (with its resume point).
    Sub {
        /// The subscribing connection.
        conn: ConnRef,
        /// The last seq the client processed.
        from: Option<u64>,
        /// The epoch `from` belongs to.
        epoch: Option<Box<str>>,
    },
    /// One subscription of core `.0` ended.
    Unsub(usize),
    /// A message from the pub/sub link.
    Live {
        /// Its seq.
        seq: u64,
        /// The channel's epoch it was published under.
        epoch: Box<str>,
        /// The message JSON.
        data: Bytes,
    },
    /// The channel's topic is subscribed on the (new) pub/sub link: check the head.
    Linked,
    /// The pub/sub link is down: `sub`s cannot be answered now.
    Unlinked,
    /// The command link came back: check the head.
    Resync,
    /// The last subscriber left: end the task.
    Stop,
    /// A presence change of the channel, as the topic announced it (`P J|L <member JSON>`).
    Presence {
        /// Joined (`true`) or left.
        joined: bool,
        /// The member's client id.
        client: String,
        /// The member JSON.
        json: Box<str>,
    },
    /// A node announced that changes of the channel may have been lost (`P R`): this node's
    /// `join_leave` subscribers get `presence_reset`.
    PresenceReset,
}

/// The `msg` frame of message `seq` of `ch` with JSON `data`.
pub fn frame(ch: &str, seq: u64, data: &[u8]) -> Bytes {
    crate::server::broker::home::msg_frame(ch, seq, data)
}

/// How long a failed head check waits before it is tried again, in milliseconds (jittered).
const RETRY_MS: u64 = 500;

/// A pub/sub message at or below `last` within this many milliseconds of a head check is taken
/// as a copy of one delivered already; later ones check the head again.
pub const RECHECK_MS: u64 = 100;

struct Chan {
    ctx: Rc<Ctx>,
    name: Arc<str>,
    /// Subscriptions per core.
    interest: Vec<u32>,
    /// Seq of the last message delivered by this node.
    last: u64,
    /// The data of message `last` as this node delivered it; empty when not known (before the
    /// first delivery, and after a reset).
    last_data: Bytes,
    /// When the head was last checked successfully.
    checked: Option<Instant>,
    /// The epoch `last` belongs to; `None` before the first head check.
    epoch: Option<Arc<str>>,
    /// Oldest seq in the stream at the last head check.
    oldest: u64,
    /// The topic is subscribed on the current pub/sub link.
    linked: bool,
    /// The pub/sub link is known to be down.
    unlinked: bool,
    /// The head was checked since the last link change.
    synced: bool,
    /// `sub`s waiting for the topic to be subscribed.
    waiting: Vec<(ConnRef, Option<u64>, Option<Box<str>>)>,
    /// The presence changes of the window in progress (presence channels).
    window: super::presence::Window,
    /// The channel's rule has `join_leave` (a subscriber here may want presence frames).
    join_leave: bool,
}

/// Runs the task of channel `name` until its last subscriber leaves.
pub async fn run(ctx: Rc<Ctx>, name: Arc<str>, mut rx: UnboundedReceiver<ChanEvent>) {
    let touch_every = Duration::from_millis((ctx.cfg.history_ttl_ms / 3).max(1_000));
    let rule = ctx.shared.config.channel_rule(&name);
    let join_leave = rule.presence && rule.join_leave;
    let mut c = Chan {
        interest: vec![0; ctx.shared.cores],
        ctx,
        name,
        last: 0,
        last_data: Bytes::new(),
        checked: None,
        epoch: None,
        oldest: 1,
        linked: false,
        unlinked: false,
        synced: false,
        waiting: Vec::new(),
        window: super::presence::Window::default(),
        join_leave,
    };
    let window_len = Duration::from_millis(c.ctx.shared.config.presence.window_ms);
    let window_end = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(window_end);
    let mut window_armed = false;
    let mut touch = tokio::time::interval_at(tokio::time::Instant::now() + touch_every, touch_every);
    let retry = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(retry);
    let mut retry_armed = false;
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            _ = touch.tick() => Some(ChanEvent::Resync),
            _ = &mut retry, if retry_armed => { retry_armed = false; Some(ChanEvent::Resync) }
            _ = &mut window_end, if window_armed => {
                window_armed = false;
                c.close_window();
                continue;
            }
        };
        let Some(ev) = ev else { return };
        match ev {
            ChanEvent::Stop => return,
            ChanEvent::Sub { conn, from, epoch } => {
                c.waiting.push((conn, from, epoch));
                // Answer every `sub` queued behind this one together (one head check).
                let mut later = Vec::new();
                while let Ok(ev) = rx.try_recv() {
                    match ev {
                        ChanEvent::Sub { conn, from, epoch } if later.is_empty() => c.waiting.push((conn, from, epoch)),
                        ev => later.push(ev),
                    }
                }
                c.answer_waiting().await;
                for ev in later {
                    if c.handle(ev).await {
                        return;
                    }
                }
            }
            ev => {
                if c.handle(ev).await {
                    return;
                }
            }
        }
        if !window_armed && c.window.is_open() {
            window_end.as_mut().reset(tokio::time::Instant::now() + window_len);
            window_armed = true;
        }
        if c.linked && !c.synced && !retry_armed {
            let jitter = rand::random::<u64>() % RETRY_MS;
            retry.as_mut().reset(tokio::time::Instant::now() + Duration::from_millis(RETRY_MS + jitter));
            retry_armed = true;
        }
    }
}

impl Chan {
    /// Handles one event other than a batch of `Sub`s; `true` when the task must end.
    async fn handle(&mut self, ev: ChanEvent) -> bool {
        match ev {
            ChanEvent::Stop => return true,
            ChanEvent::Sub { conn, from, epoch } => {
                self.waiting.push((conn, from, epoch));
                self.answer_waiting().await;
            }
            ChanEvent::Unsub(core) => {
                if let Some(n) = self.interest.get_mut(core) {
                    *n = n.saturating_sub(1);
                }
            }
            ChanEvent::Live { seq, epoch, data } => self.live(seq, &epoch, data).await,
            ChanEvent::Linked => {
                if self.unlinked {
                    // Presence changes announced while the link was down never came.
                    self.presence_reset();
                }
                self.linked = true;
                self.unlinked = false;
                self.synced = false;
                let _ = self.sync().await;
                self.answer_waiting().await;
            }
            ChanEvent::Unlinked => {
                self.linked = false;
                self.unlinked = true;
                self.synced = false;
                self.answer_waiting().await;
            }
            ChanEvent::Resync => {
                if self.linked {
                    let _ = self.sync().await;
                }
            }
            ChanEvent::Presence { joined, client, json } => {
                self.window.add(super::presence::Change { joined, client, json: &json });
            }
            ChanEvent::PresenceReset => self.presence_reset(),
        }
        false
    }

    /// This node cannot vouch that its `join_leave` subscribers saw every change of the
    /// channel: the window in progress closes with a `presence_reset` ("fetch again").
    fn presence_reset(&mut self) {
        if self.join_leave {
            self.window.reset();
        }
    }

    /// Closes the presence window: its frame goes to every core with subscribers here (each
    /// hands it to the subscribers that asked for joins and leaves).
    fn close_window(&mut self) {
        let config = &self.ctx.shared.config;
        let (max_diff, max_bytes) = (config.presence.max_diff, config.presence_frame_max_bytes());
        let Some((frame, reset)) = self.window.close(&self.name, max_diff, max_bytes) else { return };
        self.ctx.shared.metrics[0].presence_frames[usize::from(reset)]
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (core, n) in self.interest.iter().enumerate() {
            if *n > 0 {
                self.ctx.to_core(core, CoreMsg::PresenceDiff { ch: self.name.clone(), frame: frame.clone() });
            }
        }
    }

    /// Answers the waiting `sub`s once the topic is subscribed (or refuses them while the
    /// pub/sub link is down).
    async fn answer_waiting(&mut self) {
        if self.waiting.is_empty() || (!self.linked && !self.unlinked) {
            return; // the topic's subscription is on its way
        }
        let ahead = self.waiting.iter().any(|(_, from, _)| from.is_some_and(|f| f > self.last));
        let ok = self.linked && (self.synced && !ahead || self.sync().await.is_ok());
        let waiting = std::mem::take(&mut self.waiting);
        // Subscribers resuming together mostly resume from the same few points (a node died
        // and its clients all came here): one history read per point, not per subscriber.
        let mut answered: HashMap<(Option<u64>, Option<Box<str>>), Resume> = HashMap::new();
        for (conn, from, epoch) in waiting {
            let resume = if !ok {
                Resume::Unavailable(Box::new(unavailable("redis is unreachable")))
            } else if let Some(r) = answered.get(&(from, epoch.clone())) {
                r.clone()
            } else {
                let r = self.resume(from, epoch.as_deref()).await;
                answered.insert((from, epoch.clone()), r.clone());
                r
            };
            // Counted for every answer: the core ends refused ones with an `Unsubscribe`.
            self.interest[conn.core as usize] += 1;
            let epoch = self.epoch.clone().unwrap_or_else(|| "".into());
            let msg = CoreMsg::Subscribed { ch: self.name.clone(), conn: conn.id, head: self.last, epoch, resume };
            self.ctx.to_core(conn.core as usize, msg);
        }
    }

    /// How a `sub` with resume point `from` (of `epoch`) resolves against this node's head.
    async fn resume(&self, from: Option<u64>, epoch: Option<&str>) -> Resume {
        let Some(from) = from else { return Resume::Live };
        let current = self.epoch.as_deref().unwrap_or("");
        if epoch.is_some_and(|e| e != current) {
            return Resume::Reset { reason: ResetReason::Epoch, oldest: self.oldest };
        }
        if from > self.last {
            return Resume::Ahead;
        }
        if from == self.last {
            return Resume::Recovered { from, frames: Vec::new(), until: self.last };
        }
        match self.ctx.range(&self.name, from, self.last, REPLAY_BATCH).await {
            Ok(entries) if entries.first().is_some_and(|(s, _)| *s == from + 1) => {
                let frames = entries.iter().map(|(s, d)| frame(&self.name, *s, d)).collect();
                Resume::Recovered { from, frames, until: self.last }
            }
            Ok(entries) => {
                let oldest = entries.first().map_or(self.last + 1, |(s, _)| *s);
                Resume::Reset { reason: ResetReason::Evicted, oldest }
            }
            Err(e) => Resume::Unavailable(Box::new(unavailable(&e.to_string()))),
        }
    }

    /// Checks the channel's head in Redis (creating its meta when it has none): repairs up to
    /// it, or announces a new epoch. `Err` when Redis could not be asked.
    async fn sync(&mut self) -> Result<(), ()> {
        let at = if self.last_data.is_empty() { 0 } else { self.last };
        let (head, mut epoch, oldest, stored) = self.ctx.meta(&self.name, at).await.map_err(|_| ())?;
        if self.epoch.as_deref().is_some_and(|known| *known == *epoch) {
            // Under the same epoch, Redis lost acked messages (a failover to a lagging replica)
            // when the head went back, or when it holds other data under the seq delivered
            // last (new publishes took the lost seqs). What follows reuses seqs with other
            // data, so the channel moves to a new epoch, announced below like any change.
            let went_back = head < self.last;
            let rewritten = stored.is_some_and(|d| *d != *self.last_data);
            if went_back || rewritten {
                tracing::warn!(
                    channel = ?crate::logging::Escaped::str(&self.name), head, delivered = self.last, went_back, rewritten,
                    "channel history changed in redis under the same epoch; new epoch"
                );
                epoch = self.ctx.bump_epoch(&self.name, &epoch).await.map_err(|_| ())?;
            }
        }
        self.oldest = oldest;
        match &self.epoch {
            None => {
                self.epoch = Some(epoch.into());
                self.last = head;
            }
            Some(known) if **known == *epoch => {}
            Some(_) => {
                // Numbering restarted: tell every subscriber; each then gets the new epoch's
                // history from its oldest message as a replay paced by its queue (a history
                // of thousands of large messages must not land in every queue at once).
                let epoch: Arc<str> = epoch.into();
                let base = oldest.saturating_sub(1).min(head);
                self.reset_all(ResetReason::Epoch, base, &epoch, oldest, head);
                // Redis lost the channel's data: its presence keys and changes too.
                self.presence_reset();
                self.epoch = Some(epoch);
                self.last = head;
                self.last_data = Bytes::new();
            }
        }
        if head > self.last {
            self.repair(head).await?;
        }
        self.synced = true;
        self.checked = Some(Instant::now());
        Ok(())
    }

    /// A message from the pub/sub link.
    async fn live(&mut self, seq: u64, epoch: &str, data: Bytes) {
        let Some(known) = &self.epoch else { return }; // the first head check delivers it
        if **known != *epoch {
            // Another epoch: the head check resets subscribers and delivers from history.
            if self.sync().await.is_err() {
                self.synced = false;
            }
            return;
        }
        if seq <= self.last {
            // Already delivered (from history, or twice on the link), or the history changed
            // under this node (see the module's docs).
            let copy_of_last = seq == self.last && data == self.last_data;
            let recent = self.synced && self.checked.is_some_and(|t| t.elapsed() < Duration::from_millis(RECHECK_MS));
            if !copy_of_last && !recent && self.sync().await.is_err() {
                self.synced = false;
            }
            return;
        }
        if seq > self.last + 1 && self.repair(seq - 1).await.is_err() {
            // The gap cannot be read now: deliver nothing past it; the retry repairs.
            self.synced = false;
            return;
        }
        if seq == self.last + 1 {
            self.deliver(seq, data);
        }
    }

    /// Reads and delivers the messages after `last` up to `to` from the stream. A part that is
    /// no longer there (trimmed or expired) is announced as a `reset` with reason `evicted`.
    async fn repair(&mut self, to: u64) -> Result<(), ()> {
        self.ctx.shared.broker.gap_repairs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        while self.last < to {
            let entries = self.ctx.range(&self.name, self.last, to, REPLAY_BATCH).await.map_err(|_| ())?;
            let first = entries.first().map_or(to + 1, |(s, _)| *s);
            if first > self.last + 1 {
                let epoch = self.epoch.clone().unwrap_or_else(|| "".into());
                let base = first - 1;
                self.reset_all(ResetReason::Evicted, base, &epoch, first, base);
                self.last = base;
                self.last_data = Bytes::new();
            }
            for (seq, data) in entries {
                if seq == self.last + 1 {
                    self.deliver(seq, data);
                }
            }
        }
        Ok(())
    }

    fn deliver(&mut self, seq: u64, data: Bytes) {
        self.last = seq;
        let msg = Arc::new(Published::new(frame(&self.name, seq, &data)));
        self.last_data = data;
        for (core, n) in self.interest.iter().enumerate() {
            if *n > 0 {
                let msg = CoreMsg::Deliver { ch: self.name.clone(), seq, msg: msg.clone() };
                self.ctx.to_core(core, msg);
            }
        }
    }

    /// Tells every subscriber on this node that the stream restarts after `head`, with
    /// `head + 1 ..= until` replayed to each from history (see [`CoreMsg::Reset`]).
    fn reset_all(&self, reason: ResetReason, head: u64, epoch: &Arc<str>, oldest: u64, until: u64) {
        for (core, n) in self.interest.iter().enumerate() {
            if *n > 0 {
                let msg = CoreMsg::Reset { ch: self.name.clone(), head, epoch: epoch.clone(), reason, oldest, until };
                self.ctx.to_core(core, msg);
            }
        }
    }
}
