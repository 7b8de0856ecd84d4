//! The bounded queues between cores (one per ordered pair) and their wake-up.
//!
//! A core never touches another core's state: it sends a [`BusMsg`] through its [`Router`]:
//! a [`Request`] for the memory broker at a channel's home core, or a [`CoreMsg`] for a core
//! about its own connections. Each ordered pair of cores has its own bounded
//! single-producer single-consumer queue, so the consumer knows the producer and FIFO order
//! per pair is what the protocol's ordering rests on (a `Subscribed` answer is ordered against
//! the `Deliver`s that the same home core sends to the same core).
//! When a queue is full the message waits in a per-destination spill list of the sender, in
//! order, and is retried on the sender's next pass: a busy core never blocks another (two cores
//! each blocked on the other's full queue would deadlock), and the spill's length is exported
//! as `tether_bus_spilled` so overload is visible.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use futures::task::AtomicWaker;

use super::broker::{Control, HistoryPage, Outbox, PublishResult, Request, Resume};
use super::{ConnId, Shared};
use crate::auth::revoke::Revocation;
use crate::protocol::RequestError;

/// Capacity of each core-to-core queue, in messages.
pub const QUEUE_CAPACITY: usize = 8192;

/// Identifies a connection anywhere in the process: its core and its id there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnRef {
    /// Core index that owns the connection.
    pub core: u16,
    /// Slab key + generation on that core.
    pub id: ConnId,
}

/// Everything that travels between cores: a request for a channel's home (memory broker), or
/// a message for a core about its own connections and subscribers.
#[derive(Debug)]
pub enum BusMsg {
    /// For the broker at the channel's home core.
    Broker(Request),
    /// For this core.
    Core(CoreMsg),
}

/// A message for a core about its connections: the broker's answers and fan-out, and
/// `GET /connections` gathering.
#[derive(Debug)]
pub enum CoreMsg {
    /// The answer to a [`Request::Publish`], for the publisher's core.
    Published {
        /// The publishing connection.
        reply: ConnRef,
        /// Channel name.
        ch: Arc<str>,
        /// The publish id, echoed in the `ack`.
        id: Option<Box<str>>,
        /// Stored (with its seq) or refused.
        result: PublishResult,
    },
    /// The home registered the subscription: `conn` receives every seq after `head`.
    Subscribed {
        /// Channel name.
        ch: Arc<str>,
        /// The subscribing connection, on the receiving core.
        conn: ConnId,
        /// The channel's head when the subscription was registered (0 before any publish).
        head: u64,
        /// The channel's current epoch.
        epoch: Arc<str>,
        /// How the resume point, if any, resolved.
        resume: Resume,
    },
    /// Deliver the encoded frame of message `seq` of `ch` to local subscribers.
    Deliver {
        /// Channel name.
        ch: Arc<str>,
        /// The message's seq.
        seq: u64,
        /// The complete `msg` frame, shared by every subscriber.
        frame: Bytes,
    },
    /// The answer to a [`Request::Fetch`]: frames after `after`, or `evicted = Some(oldest)`
    /// when that part of history is gone meanwhile.
    ReplayBatch {
        /// Channel name.
        ch: Arc<str>,
        /// The resuming connection, on the receiving core.
        conn: ConnId,
        /// `msg` frames of the next seqs, in order.
        frames: Vec<Bytes>,
        /// `Some(oldest kept seq)` when the rest of the replay was evicted from history.
        evicted: Option<u64>,
    },
    /// The channel's numbering restarted (`reason` epoch: Redis came back empty) or a part of
    /// it can no longer be delivered (`evicted`): every local subscriber of `ch` gets a
    /// `reset` and continues with the seqs after `head`.
    Reset {
        /// Channel name.
        ch: Arc<str>,
        /// Deliveries continue with `head + 1`.
        head: u64,
        /// The channel's epoch from now on.
        epoch: Arc<str>,
        /// Why.
        reason: crate::protocol::ResetReason,
        /// Oldest seq still in history.
        oldest: u64,
        /// Messages `head + 1 ..= until` are in history and reach each subscriber as a
        /// replay paced by its outbound queue, like a resume's (none when `until == head`);
        /// deliveries continue after `until`.
        until: u64,
    },
    /// The answer to a [`Request::Presence`]: a `presence` or `presence_stats` object for
    /// `conn` (or its `error`), as JSON text: a WebSocket client gets it as a text frame, an
    /// HTTP one (`GET /api/presence…`) as the body of the answer.
    PresenceAnswer {
        /// The asking connection, on the receiving core.
        conn: ConnId,
        /// The channel asked about: the connection's requests about it held behind this
        /// query go when it is answered.
        ch: Arc<str>,
        /// The answer's JSON object.
        json: Vec<u8>,
    },
    /// One presence window of `ch` closed: its `presence_diff` (or `presence_reset`) frame,
    /// for every local subscriber that asked for join/leave.
    PresenceDiff {
        /// Channel name.
        ch: Arc<str>,
        /// The encoded frame, shared by every such subscriber.
        frame: Bytes,
    },
    /// `GET /connections`: list this core's `top` connections by queued bytes.
    Inspect {
        /// The HTTP connection that asked.
        reply: ConnRef,
        /// Rows wanted.
        top: usize,
    },
    /// One core's answer to [`CoreMsg::Inspect`].
    Inspected {
        /// The HTTP connection that asked.
        reply: ConnRef,
        /// This core's largest queues.
        rows: Vec<ConnRow>,
        /// This core's outbound queues, summed (`GET /status.json`).
        load: CoreLoad,
        /// The presence channels homed on this core with the most members, at most
        /// `http::inspect::PRESENCE_TOP` (`GET /status.json`).
        presence: Vec<PresenceRow>,
    },
    /// The answer to a [`Request::History`].
    History {
        /// The HTTP connection that asked.
        reply: ConnRef,
        /// Channel name.
        ch: Arc<str>,
        /// The page, or why the broker cannot read it now (`unavailable`).
        page: Result<HistoryPage, Box<RequestError>>,
    },
    /// Apply a node-wide action of the server API to this core's connections; with `reply`,
    /// answer [`CoreMsg::ControlDone`] (from the node that was asked), without (from another
    /// node, through the broker) silently.
    Control {
        /// What to do.
        msg: Arc<Control>,
        /// The HTTP connection that asked, on this node.
        reply: Option<ConnRef>,
    },
    /// One core's answer to [`CoreMsg::Control`]: how many of its connections it affected.
    ControlDone {
        /// The HTTP connection that asked.
        reply: ConnRef,
        /// Connections closed, or subscriptions ended.
        affected: u64,
    },
    /// The broker's answer to a [`Request::Control`]: how many other nodes it reached (0 for
    /// the memory broker), or why it could not tell them.
    ControlSent {
        /// The HTTP connection that asked.
        reply: ConnRef,
        /// Other nodes told, or the refusal (`unavailable`).
        result: Result<u64, Box<RequestError>>,
    },
    /// The revocations in force in the shared store (Redis), read when the broker
    /// (re)connects: added to this core's set.
    Revocations(Arc<[Revocation]>),
    /// `GET /api/channels`: list this core's channels whose name starts with `prefix`.
    ListChannels {
        /// The HTTP connection that asked.
        reply: ConnRef,
        /// Name prefix (empty: every channel).
        prefix: Arc<str>,
        /// Rows wanted: the first `limit` names in byte order.
        limit: usize,
    },
    /// One core's answer to [`CoreMsg::ListChannels`].
    ChannelRows {
        /// The HTTP connection that asked.
        reply: ConnRef,
        /// `(name, subscribers on this core)`, the first `limit` names in byte order.
        rows: Vec<(Arc<str>, u64)>,
        /// Whether the core had more matching channels than `limit`.
        truncated: bool,
    },
}

/// One connection in `GET /connections` (a debugging view of the largest outbound queues).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConnRow {
    /// `core:key:generation`.
    pub id: String,
    /// Peer address.
    pub peer: String,
    /// Bytes queued and not yet written.
    pub queued_bytes: usize,
    /// Frames queued.
    pub queued_messages: usize,
    /// Seconds since the outbound queue was last empty.
    pub secs_since_drain: f64,
    /// Channels subscribed to (confirmed ones).
    pub subscriptions: Vec<String>,
}

/// One presence channel in `GET /status.json` (docs/http.md), as its home counts it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PresenceRow {
    /// Channel name.
    pub ch: String,
    /// Members tracked (connections).
    pub members: u64,
    /// Distinct JWT `sub`s among them (0 without `[auth]`).
    pub users: u64,
}

/// One core's outbound queues in `GET /status.json`, summed over its upgraded connections
/// when the core answered [`CoreMsg::Inspect`].
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CoreLoad {
    /// The core's index.
    pub core: usize,
    /// Bytes queued and not yet written, all connections of the core.
    pub queued_bytes: usize,
    /// Frames queued, all connections of the core.
    pub queued_messages: usize,
    /// Connections whose outbound queue is not empty.
    pub backlogged: usize,
}

/// The wake-up half of a core, shared by every producer.
#[derive(Default)]
pub struct Doorbell {
    waker: AtomicWaker,
    rung: AtomicBool,
}

impl Doorbell {
    /// Marks work pending and wakes the core's processor if it was not already marked.
    pub fn ring(&self) {
        if !self.rung.swap(true, Ordering::AcqRel) {
            self.waker.wake();
        }
    }

    /// Registers the processor's waker; `Ready` when work was marked since the last poll.
    pub fn poll_rung(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.waker.register(cx.waker());
        if self.rung.swap(false, Ordering::AcqRel) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// The queues of all cores, built once and split into per-core [`Endpoint`]s.
pub struct Bus {
    /// One doorbell per core.
    pub doorbells: Arc<[Doorbell]>,
    endpoints: Vec<Endpoint>,
}

impl Bus {
    /// Queues for `cores` cores (one per ordered pair).
    pub fn new(cores: usize) -> Bus {
        let doorbells: Arc<[Doorbell]> = (0..cores).map(|_| Doorbell::default()).collect();
        let mut senders: Vec<Vec<Option<Sender<BusMsg>>>> =
            (0..cores).map(|_| (0..cores).map(|_| None).collect()).collect();
        let mut receivers: Vec<Vec<(u16, Receiver<BusMsg>)>> = (0..cores).map(|_| Vec::new()).collect();
        for (src, row) in senders.iter_mut().enumerate() {
            for (dst, slot) in row.iter_mut().enumerate() {
                if src != dst {
                    let (tx, rx) = crossbeam_channel::bounded(QUEUE_CAPACITY);
                    *slot = Some(tx);
                    receivers[dst].push((src as u16, rx));
                }
            }
        }
        let endpoints = senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(me, (tx, rx))| Endpoint {
                me,
                spill: (0..cores).map(|_| VecDeque::new()).collect(),
                senders: tx,
                receivers: rx,
                doorbells: doorbells.clone(),
                next_rx: 0,
            })
            .collect();
        Bus { doorbells, endpoints }
    }

    /// Takes the endpoints out, index = core.
    pub fn into_endpoints(self) -> Vec<Endpoint> {
        self.endpoints
    }
}

/// One core's side of the bus.
pub struct Endpoint {
    me: usize,
    senders: Vec<Option<Sender<BusMsg>>>,
    receivers: Vec<(u16, Receiver<BusMsg>)>,
    spill: Vec<VecDeque<BusMsg>>,
    doorbells: Arc<[Doorbell]>,
    next_rx: usize,
}

impl Endpoint {
    /// Sends `msg` to core `dst` (not this core), spilling locally when its queue is full.
    pub fn send(&mut self, dst: usize, msg: BusMsg) -> SpillDelta {
        debug_assert_ne!(dst, self.me);
        let mut delta = 0;
        if self.spill[dst].is_empty() {
            match self.senders[dst].as_ref().map(|s| s.try_send(msg)) {
                Some(Ok(())) | Some(Err(TrySendError::Disconnected(_))) | None => {}
                Some(Err(TrySendError::Full(m))) => {
                    self.spill[dst].push_back(m);
                    delta = 1;
                }
            }
        } else {
            self.spill[dst].push_back(msg);
            delta = 1;
        }
        self.doorbells[dst].ring();
        delta
    }

    /// Gives back the capacity of the spill lists that are empty and hold at least
    /// [`SPARE_MIN`](crate::server::reclaim::SPARE_MIN) slots (one burst of overload grows a
    /// list, which would keep that peak for good). Returns whether one was shrunk.
    pub fn shrink_if_spare(&mut self) -> bool {
        let mut shrank = false;
        for q in &mut self.spill {
            if crate::server::reclaim::spare(q.len(), q.capacity()) {
                q.shrink_to_fit();
                shrank = true;
            }
        }
        shrank
    }

    /// Retries spilled messages in order; returns how many went out.
    pub fn retry_spill(&mut self) -> i64 {
        let mut sent = 0;
        for dst in 0..self.spill.len() {
            let Some(tx) = self.senders[dst].as_ref() else { continue };
            while let Some(m) = self.spill[dst].pop_front() {
                match tx.try_send(m) {
                    Ok(()) => sent += 1,
                    Err(TrySendError::Full(m)) => {
                        self.spill[dst].push_front(m);
                        break;
                    }
                    Err(TrySendError::Disconnected(_)) => sent += 1,
                }
            }
            if sent > 0 {
                self.doorbells[dst].ring();
            }
        }
        sent
    }

    /// Whether any message waits in a spill list.
    pub fn has_spill(&self) -> bool {
        self.spill.iter().any(|q| !q.is_empty())
    }

    /// Takes one received message, round-robin over the source cores, or `None`.
    pub fn try_recv(&mut self) -> Option<BusMsg> {
        let n = self.receivers.len();
        for k in 0..n {
            let i = (self.next_rx + k) % n;
            if let Ok(m) = self.receivers[i].1.try_recv() {
                self.next_rx = (i + 1) % n;
                return Some(m);
            }
        }
        None
    }
}

/// A core's way out: the bus to other cores, and an in-order queue to itself (so same-core
/// work is ordered exactly like cross-core work).
pub struct Router {
    me: usize,
    endpoint: Endpoint,
    local: VecDeque<BusMsg>,
    shared: Arc<Shared>,
}

impl Router {
    /// Core `me`'s router over its bus endpoint.
    pub fn new(me: usize, endpoint: Endpoint, shared: Arc<Shared>) -> Router {
        Router { me, endpoint, local: VecDeque::new(), shared }
    }

    /// The core this router belongs to.
    pub fn me(&self) -> usize {
        self.me
    }

    /// Sends `msg` to core `dst` (this core included), in order per destination; never blocks
    /// (a full queue spills, counted in `tether_bus_spilled`).
    pub fn send(&mut self, dst: usize, msg: BusMsg) {
        if dst == self.me {
            self.local.push_back(msg);
            self.shared.doorbells[self.me].ring();
        } else {
            let d = self.endpoint.send(dst, msg);
            if d > 0 {
                self.shared.metrics[self.me].bus_spilled.fetch_add(d, Ordering::Relaxed);
            }
        }
    }

    /// Sends a [`CoreMsg`] to core `dst`.
    pub fn to_core(&mut self, dst: usize, msg: CoreMsg) {
        self.send(dst, BusMsg::Core(msg));
    }

    /// Gives back the spare capacity of this core's own queue and of its spill lists
    /// ([`crate::server::reclaim::spare`]): a burst of same-core work (thousands of `sub`s read
    /// in one turn, say) grows the queue to the burst's size, and a `VecDeque` never shrinks by
    /// itself. Returns whether anything was shrunk.
    pub fn shrink_if_spare(&mut self) -> bool {
        let mut shrank = self.endpoint.shrink_if_spare();
        if crate::server::reclaim::spare(self.local.len(), self.local.capacity()) {
            self.local.shrink_to_fit();
            shrank = true;
        }
        shrank
    }

    /// The next message for this core: its own queue first, then the bus.
    pub fn recv(&mut self) -> Option<BusMsg> {
        self.local.pop_front().or_else(|| self.endpoint.try_recv())
    }

    /// Whether messages wait in spill lists.
    pub fn has_spill(&self) -> bool {
        self.endpoint.has_spill()
    }

    /// Retries the spill lists (see [`Endpoint::retry_spill`]).
    pub fn retry_spill(&mut self) {
        let sent = self.endpoint.retry_spill();
        if sent > 0 {
            self.shared.metrics[self.me].bus_spilled.fetch_sub(sent, Ordering::Relaxed);
        }
    }

    /// Whether publishers should pause: some core-to-core queue is full (its sender spills)
    /// or this core's own queue holds more than a bus queue's worth. Publishers that keep
    /// writing then stop being read until it clears, so an offered load above capacity turns
    /// into backpressure on the publishers instead of a growing backlog.
    pub fn overloaded(&self) -> bool {
        self.local.len() > QUEUE_CAPACITY
            || self.shared.metrics.iter().any(|m| m.bus_spilled.load(Ordering::Relaxed) > 0)
    }
}

impl Outbox for Router {
    fn me(&self) -> usize {
        self.me
    }

    fn to_home(&mut self, home: usize, req: Request) {
        self.send(home, BusMsg::Broker(req));
    }

    fn to_core(&mut self, core: usize, msg: CoreMsg) {
        self.send(core, BusMsg::Core(msg));
    }
}

/// How many messages a send added to the spill lists (0 or 1).
pub type SpillDelta = i64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_per_pair_and_spill_when_full() {
        let mut eps = Bus::new(2).into_endpoints();
        let (mut a, mut b) = {
            let b = eps.pop().unwrap();
            (eps.pop().unwrap(), b)
        };
        let n = QUEUE_CAPACITY + 10;
        let mut spilled = 0;
        for seq in 0..n as u64 {
            spilled += a.send(1, BusMsg::Core(CoreMsg::Deliver { ch: "c".into(), seq, frame: Bytes::new() }));
        }
        assert_eq!(spilled, 10);
        assert!(a.has_spill());
        let mut got = Vec::new();
        while let Some(BusMsg::Core(CoreMsg::Deliver { seq, .. })) = b.try_recv() {
            got.push(seq);
        }
        assert_eq!(a.retry_spill(), 10);
        while let Some(BusMsg::Core(CoreMsg::Deliver { seq, .. })) = b.try_recv() {
            got.push(seq);
        }
        assert_eq!(got, (0..n as u64).collect::<Vec<_>>());
        assert!(!a.has_spill());
    }
}
