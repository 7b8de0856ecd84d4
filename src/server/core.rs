//! One core's state and the operations on it. Everything here runs on the core's own thread,
//! without locks; other cores are reached only through [`CoreState::route`].

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use slab::Slab;

use super::bus::{ConnRef, CoreMsg, Endpoint, HttpWait, PublishResult};
use super::conn_state::*;
use super::home::{home_of, Homes};
use super::local::LocalChannels;
use super::metrics::{CoreMetrics, ReapReason};
use super::replay::{hold_for_replay, Held};
use super::timer::{TimerWheel, TICK_MS};
use super::Shared;
use crate::config::Overflow;
use crate::protocol;
use crate::ws::codec;

/// Close reason (1013) when live frames held behind a resume replay overflow.
const SLOW_REPLAY_REASON: &str = r#"{"reason":"slow","limit":"replay backlog","retry_after_ms":1000}"#;

/// A ping with an empty payload (RFC 6455 §5.5.2), shared by every heartbeat.
pub static PING: Bytes = Bytes::from_static(&[0x89, 0x00]);

/// One core's state. Borrowed mutably only between awaits.
pub struct CoreState {
    /// This core's index.
    pub me: usize,
    /// Process-wide configuration, metrics and flags.
    pub shared: Arc<Shared>,
    /// Connections, by slab key.
    pub conns: Slab<Conn>,
    next_gen: u32,
    /// Local subscription index.
    pub local: LocalChannels,
    /// Channels homed on this core.
    pub homes: Homes,
    /// Messages from this core to itself, in order.
    pub local_q: VecDeque<CoreMsg>,
    /// This core's side of the cross-core queues.
    pub bus: Endpoint,
    /// Heartbeat, handshake, close and drain deadlines.
    pub wheel: TimerWheel,
    /// Connections with frames queued in this pass, to flush at the end of it.
    pub dirty: Vec<ConnId>,
    /// The local channel a delivery is walking right now (no compaction there meanwhile).
    pub active_chan: Option<u32>,
    /// Set once this core has started its drain.
    pub draining: bool,
    /// Waker of the accept loop, woken when the drain starts.
    pub accept_waker: Option<std::task::Waker>,
    /// Waker of the clock task, woken when the drain is over.
    pub tick_waker: Option<std::task::Waker>,
    /// The drain is over on this core: the clock task returns and the core stops.
    pub drain_done: bool,
    /// When this core's drain gives up waiting for close answers (tick).
    pub drain_deadline: Option<u32>,
    /// Timer entries fired in one clock step (kept to reuse its allocation).
    pub fired: Vec<(ConnId, u32)>,
    /// Publishing connections whose reads are paused until the overload clears.
    pub held: Vec<ConnId>,
    /// Tick of the last sweep of idle channels.
    pub last_sweep: u32,
    /// Token bucket for `accept_rate` (tokens, last refill in ms).
    rate: (f64, u64),
    start: Instant,
}

impl CoreState {
    /// Fresh state for core `me`.
    pub fn new(me: usize, shared: Arc<Shared>, bus: Endpoint, start: Instant) -> CoreState {
        let cfg = &shared.config;
        let dedup = super::home::Dedup::new(cfg.dedup.window_ms, (cfg.dedup.max_entries / shared.cores).max(1));
        CoreState {
            me,
            homes: Homes::new(shared.cores, dedup),
            conns: Slab::new(),
            next_gen: 0,
            local: LocalChannels::default(),
            local_q: VecDeque::new(),
            bus,
            wheel: TimerWheel::new(4096, 0),
            dirty: Vec::new(),
            active_chan: None,
            draining: false,
            accept_waker: None,
            tick_waker: None,
            drain_done: false,
            drain_deadline: None,
            fired: Vec::new(),
            held: Vec::new(),
            last_sweep: 0,
            rate: (cfg.accept_rate as f64, 0),
            start,
            shared,
        }
    }

    /// This core's metrics.
    pub fn metrics(&self) -> &CoreMetrics {
        &self.shared.metrics[self.me]
    }

    /// Milliseconds since the core started.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Current tick ([`TICK_MS`] each).
    pub fn now_tick(&self) -> u32 {
        (self.now_ms() / TICK_MS) as u32
    }

    /// Milliseconds → ticks, rounded up.
    pub fn ticks(ms: u64) -> u32 {
        ms.div_ceil(TICK_MS) as u32
    }

    /// Registers a freshly accepted socket; returns its id.
    pub fn insert_conn(&mut self, fd: std::os::fd::RawFd) -> ConnId {
        self.next_gen = self.next_gen.wrapping_add(1);
        let now = self.now_tick();
        let gen = self.next_gen;
        let key = self.conns.insert(Conn::new(gen, fd, now)) as u32;
        let id = ConnId { key, gen };
        let due = now + Self::ticks(self.shared.config.limits.handshake_timeout_ms);
        self.schedule(id, due);
        id
    }

    /// The connection `id`, if it is still the same one.
    pub fn conn(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.conns.get_mut(id.key as usize).filter(|c| c.gen == id.gen)
    }

    /// Moves `id`'s single timer entry to tick `due`.
    pub fn schedule(&mut self, id: ConnId, due: u32) {
        if let Some(c) = self.conn(id) {
            c.timer_due = due;
            self.wheel.schedule(id, due);
        }
    }

    /// Sends `msg` to core `dst`: in order through the bus, or through the local queue when
    /// `dst` is this core (so same-core work is ordered exactly like cross-core work).
    pub fn route(&mut self, dst: usize, msg: CoreMsg) {
        if dst == self.me {
            self.local_q.push_back(msg);
            self.shared.doorbells[self.me].ring();
        } else {
            let d = self.bus.send(dst, msg);
            if d > 0 {
                self.metrics().bus_spilled.fetch_add(d, Relaxed);
            }
        }
    }

    /// Whether publishers should pause: some core-to-core queue is full (its sender spills)
    /// or this core's own queue holds more than a bus queue's worth. Publishers that keep
    /// writing then stop being read until it clears, so an offered load above capacity turns
    /// into backpressure on the publishers instead of a growing backlog.
    pub fn overloaded(&self) -> bool {
        self.local_q.len() > super::bus::QUEUE_CAPACITY || self.shared.metrics.iter().any(|m| m.bus_spilled.load(Relaxed) > 0)
    }

    /// Home core of channel `ch`.
    pub fn home(&self, ch: &str) -> usize {
        home_of(ch, self.shared.cores)
    }

    /// One token of the `accept_rate` bucket (always granted when the rate is 0).
    pub fn take_accept_token(&mut self) -> bool {
        let per_s = self.shared.config.accept_rate as f64 / self.shared.cores as f64;
        if per_s <= 0.0 {
            return true;
        }
        let now = self.now_ms();
        let (tokens, last) = self.rate;
        let tokens = (tokens + (now - last) as f64 * per_s / 1000.0).min(per_s.max(1.0));
        self.rate = if tokens >= 1.0 { (tokens - 1.0, now) } else { (tokens, now) };
        tokens >= 1.0
    }

    /// Queues `frame` on `id` under the overflow policy `policy` (`None` for replies, which
    /// overflow like `disconnect`). Returns false if it was not queued.
    pub fn enqueue(&mut self, id: ConnId, frame: Bytes, chan: u32, policy: Option<Overflow>) -> bool {
        let limits = &self.shared.config.limits;
        let (max_bytes, max_msgs) = (limits.queue_max_bytes, limits.queue_max_messages);
        let metrics = &self.shared.metrics[self.me];
        let Some(c) = self.conns.get_mut(id.key as usize).filter(|c| c.gen == id.gen) else { return false };
        if !c.phase.can_write() {
            return false;
        }
        if c.replays.is_some() && chan != NO_CHAN {
            let policy = policy.unwrap_or(Overflow::Disconnect);
            match hold_for_replay(c, chan, &frame, policy, max_bytes, max_msgs) {
                Some(Held::Queued) => return true,
                Some(Held::Overflow) => {
                    metrics.overflow(0, c.out_bytes as u64);
                    super::events::overflow_closed(self.me, c.fd, c.out_bytes, "replay backlog");
                    self.close_by_us(id, 1013, SLOW_REPLAY_REASON, ReapReason::Overflow);
                    return false;
                }
                None => {}
            }
        }
        let fits = |c: &Conn, extra: usize| c.out.len() < max_msgs && c.out_bytes + extra <= max_bytes;
        if !fits(c, frame.len()) {
            match policy.unwrap_or(Overflow::Disconnect) {
                Overflow::Disconnect => {
                    metrics.overflow(0, c.out_bytes as u64);
                    super::events::overflow_closed(self.me, c.fd, c.out_bytes, "queue_max_bytes / queue_max_messages");
                    let reason = format!("{{\"reason\":\"slow\",\"limit\":\"queue_max_bytes={max_bytes},queue_max_messages={max_msgs}\",\"retry_after_ms\":1000}}");
                    self.close_by_us(id, 1013, &reason, ReapReason::Overflow);
                    return false;
                }
                Overflow::DropOldest => {
                    metrics.overflow(1, c.out_bytes as u64);
                    // The front may be partly written: never drop it.
                    let mut i = 1;
                    while !fits(c, frame.len()) && i < c.out.len() {
                        if c.out[i].chan == chan {
                            let o = c.out.remove(i).expect("index checked");
                            c.out_bytes -= o.frame.len();
                        } else {
                            i += 1;
                        }
                    }
                    if !fits(c, frame.len()) {
                        return false;
                    }
                }
                Overflow::Conflate => {
                    metrics.overflow(2, c.out_bytes as u64);
                    let start = if c.out_offset > 0 { 1 } else { 0 };
                    let pos = (start..c.out.len()).rev().find(|&i| c.out[i].chan == chan);
                    match pos {
                        Some(i) => {
                            c.out_bytes = c.out_bytes - c.out[i].frame.len() + frame.len();
                            c.out[i].frame = frame;
                            return true;
                        }
                        None => return false,
                    }
                }
            }
        }
        c.push(frame, chan);
        if c.flags & DIRTY == 0 {
            c.flags |= DIRTY;
            self.dirty.push(id);
        }
        true
    }

    /// Queues a reply (ack, error, pong, subscribed …) and writes it at once.
    pub fn reply(&mut self, id: ConnId, frame: Bytes) {
        if self.enqueue(id, frame, NO_CHAN, None) {
            self.flush(id);
        }
    }

    /// Writes what `id` has queued; on a full socket the task is asked to wait for
    /// writability; on an error the connection is reaped.
    pub fn flush(&mut self, id: ConnId) {
        let now = self.now_tick();
        let Some(c) = self.conn(id) else { return };
        c.flags &= !DIRTY;
        if c.flags & WANT_WRITE != 0 {
            return;
        }
        let mut r = c.flush();
        // A resume replay refills the queue each time the socket has taken all of it.
        while matches!(r, Ok(true)) && self.pump_replay(id) {
            let Some(again) = self.conn(id) else { return };
            again.flags &= !DIRTY;
            r = again.flush();
        }
        let Some(c) = self.conn(id) else { return };
        match r {
            Ok(true) => {
                c.last_drained = now;
                if c.phase == Phase::Flushing {
                    // SAFETY: fd is open while the entry exists.
                    unsafe { libc::shutdown(c.fd, libc::SHUT_WR) };
                    c.phase = Phase::Lingering;
                    c.reap.get_or_insert(ReapReason::Close);
                    let due = now + Self::ticks(self.shared.config.limits.close_timeout_ms);
                    self.schedule(id, due);
                }
            }
            Ok(false) => {
                c.flags |= WANT_WRITE;
                c.wake();
            }
            Err(_) => c.kill(ReapReason::Reset),
        }
    }

    /// Flushes every connection queued to in this pass.
    pub fn flush_dirty(&mut self) {
        // Taken out (and given back, to keep its capacity) because flushing may queue more.
        let mut dirty = std::mem::take(&mut self.dirty);
        for id in dirty.drain(..) {
            self.flush(id);
        }
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
    }

    /// Fails the connection (RFC 6455 §7.1.7): sends a close frame with `code`, then FIN once
    /// it is written, without waiting for the peer's close.
    pub fn fail(&mut self, id: ConnId, code: u16, reason: &str) {
        let shared = self.shared.clone();
        let Some(c) = self.conn(id) else { return };
        if !c.phase.can_write() {
            c.kill(ReapReason::Protocol);
            return;
        }
        c.push(codec::close_frame(code, reason), NO_CHAN);
        c.phase = Phase::Flushing;
        c.reap = Some(ReapReason::Protocol);
        shared.metrics[self.me].close(code);
        let due = self.now_tick() + Self::ticks(shared.config.limits.close_timeout_ms);
        self.schedule(id, due);
        self.flush(id);
    }

    /// Starts the close handshake from our side (RFC 6455 §7.1.2): the close frame goes out
    /// (ahead of queued data when `why` is an overflow), then we wait for the peer's close
    /// until `limits.close_timeout_ms`.
    pub fn close_by_us(&mut self, id: ConnId, code: u16, reason: &str, why: ReapReason) {
        let due = self.now_tick() + Self::ticks(self.shared.config.limits.close_timeout_ms);
        let shared = self.shared.clone();
        let metrics = &shared.metrics[self.me];
        let Some(c) = self.conn(id) else { return };
        if !c.phase.can_write() {
            return;
        }
        if why == ReapReason::Overflow {
            c.clear_queue();
        }
        c.push(codec::close_frame(code, reason), NO_CHAN);
        c.phase = Phase::ClosingByUs;
        c.reap = Some(why);
        metrics.close(code);
        self.schedule(id, due);
        self.flush(id);
    }

    /// A client `pub` (or an HTTP publish when `reply` names an HTTP connection).
    pub fn client_pub(&mut self, reply: ConnId, ch: &str, id: Option<Box<str>>, data: Bytes) {
        if let Some(c) = self.conn(reply) {
            c.flags |= PUBLISHER;
        }
        let home = self.home(ch);
        let msg = CoreMsg::Publish { ch: ch.into(), id, data, reply: Some(ConnRef { core: self.me as u16, id: reply }) };
        self.route(home, msg);
    }

    /// Removes connection `id` and every trace of it: subscriptions, queue, gauge.
    pub fn teardown(&mut self, id: ConnId) {
        if self.conn(id).is_none() {
            return;
        }
        let c = self.conns.remove(id.key as usize);
        let metrics = &self.shared.metrics[self.me];
        if c.flags & UPGRADED != 0 {
            metrics.connections.fetch_sub(1, Relaxed);
            self.shared.open.fetch_sub(1, Relaxed);
            let why = c.reap.unwrap_or(ReapReason::Eof);
            metrics.reaped(why);
            super::events::reaped(self.me, c.fd, why);
            if matches!(why, ReapReason::Reset | ReapReason::Eof | ReapReason::PongTimeout) {
                metrics.close(1006);
            }
            if c.flags & DRAIN != 0 {
                metrics.drain_remaining.fetch_sub(1, Relaxed);
            }
        } else if c.reap == Some(ReapReason::HandshakeTimeout) {
            metrics.reaped(ReapReason::HandshakeTimeout);
        }
        for e in c.subs {
            self.drop_sub(e);
        }
    }

    /// Handles one message from the bus or the local queue, except `Deliver` (the processor
    /// walks subscriber lists itself so it can yield between chunks).
    pub fn handle(&mut self, msg: CoreMsg) {
        match msg {
            CoreMsg::Publish { ch, id, data, reply } => {
                let cap = self.shared.config.channel_rule(&ch).history;
                let now = self.now_ms();
                let (p, name) = self.homes.publish(&ch, id.as_deref(), &data, cap, now);
                let metrics = &self.shared.metrics[self.me];
                match p.frame {
                    Some(frame) => {
                        metrics.published.fetch_add(1, Relaxed);
                        let cores: Vec<usize> = self.homes.get(&ch).map(|c| c.interested().collect()).unwrap_or_default();
                        for core in cores {
                            self.route(core, CoreMsg::Deliver { ch: name.clone(), seq: p.seq, frame: frame.clone() });
                        }
                    }
                    None => {
                        metrics.publish_duplicates.fetch_add(1, Relaxed);
                    }
                }
                if let Some(r) = reply {
                    let result = PublishResult::Stored { seq: p.seq };
                    self.route(r.core as usize, CoreMsg::Published { reply: r, ch: name, id, result });
                }
            }
            CoreMsg::Published { reply, ch, id, result } => {
                let Some(c) = self.conn(reply.id) else { return };
                if c.phase == Phase::Http {
                    c.reply = Some(Box::new(HttpWait::Publish(result)));
                    c.flags |= REPLY_READY;
                    c.wake();
                    return;
                }
                let json = match &result {
                    PublishResult::Stored { seq } => protocol::ack_json(id.as_deref().unwrap_or(""), &ch, *seq),
                    PublishResult::Refused(e) => protocol::error_json(e.code, &e.reason, id.as_deref()),
                };
                self.reply(reply.id, codec::encode_frame(0x1, &json));
            }
            CoreMsg::Subscribe { ch, conn, from, epoch } => {
                let cap = self.shared.config.channel_rule(&ch).history;
                let (name, head, ep, resume) = self.homes.subscribe(&ch, conn.core as usize, from, epoch.as_deref(), cap);
                self.route(conn.core as usize, CoreMsg::Subscribed { ch: name, conn: conn.id, head, epoch: ep, resume });
            }
            CoreMsg::Subscribed { ch, conn, head, epoch, resume } => self.subscribed(&ch, conn, head, &epoch, resume),
            CoreMsg::Unsubscribe { ch, core } => self.homes.unsubscribe(&ch, core as usize),
            CoreMsg::ReplayFetch { ch, conn, after, until } => {
                let (frames, evicted) = match self.homes.replay_batch(&ch, after, until) {
                    Ok(f) => (f, None),
                    Err(oldest) => (Vec::new(), Some(oldest)),
                };
                self.route(conn.core as usize, CoreMsg::ReplayBatch { ch, conn: conn.id, frames, evicted });
            }
            CoreMsg::ReplayBatch { ch, conn, frames, evicted } => self.replay_batch(conn, &ch, frames, evicted),
            CoreMsg::Inspect { reply, top } => {
                let rows = self.inspect(top);
                self.route(reply.core as usize, CoreMsg::Inspected { reply, rows });
            }
            CoreMsg::Inspected { reply, rows: more } => {
                let Some(c) = self.conn(reply.id) else { return };
                if let Some(HttpWait::Inspect { missing, top, rows }) = c.reply.as_deref_mut() {
                    rows.extend(more);
                    *missing -= 1;
                    if *missing == 0 {
                        rows.sort_by(|a, b| b.queued_bytes.cmp(&a.queued_bytes));
                        rows.truncate(*top);
                        c.flags |= REPLY_READY;
                        c.wake();
                    }
                }
            }
            CoreMsg::Deliver { .. } => unreachable!("the processor walks deliveries itself"),
        }
    }

}
