//! The bounded queues between cores (one per ordered pair) and their wake-up.
//!
//! A core never touches another core's state: it sends a [`CoreMsg`]. Each ordered pair of
//! cores has its own bounded single-producer single-consumer queue, so the consumer knows the
//! producer and FIFO order per pair is what the protocol's ordering rests on (a `Subscribed`
//! reply is ordered against the `Deliver`s that the same home core sends to the same core).
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

use super::ConnId;
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

/// What a publish resolved to at the channel's home core.
#[derive(Debug)]
pub enum PublishResult {
    /// Stored as `seq` (also for a duplicate id: the original seq).
    Stored { seq: u64 },
    /// Refused (e.g. the dedup window is full of this id's twins — never in practice).
    Refused(RequestError),
}

/// A message between cores (or from a connection task to its own core's processor).
#[derive(Debug)]
pub enum CoreMsg {
    /// Publish `data` (raw JSON text) on `ch`; sent to the channel's home core.
    Publish { ch: Arc<str>, id: Option<Box<str>>, data: Bytes, reply: Option<ConnRef> },
    /// The home core's answer to a [`CoreMsg::Publish`], sent to the publisher's core.
    Published { reply: ConnRef, ch: Arc<str>, id: Option<Box<str>>, result: PublishResult },
    /// Subscribe `conn` (on core `conn.core`) to `ch`; sent to the home core.
    Subscribe { ch: Arc<str>, conn: ConnRef, from: Option<u64>, epoch: Option<Box<str>> },
    /// The home core registered the subscription: `conn` receives every seq after `head`.
    Subscribed { ch: Arc<str>, conn: ConnId, head: u64, epoch: Arc<str>, resume: Resume },
    /// One subscription of core `core` to `ch` ended; sent to the home core.
    Unsubscribe { ch: Arc<str>, core: u16 },
    /// Deliver the encoded frame of message `seq` of `ch` to local subscribers.
    Deliver { ch: Arc<str>, seq: u64, frame: Bytes },
    /// A resuming subscriber's core wants the next history batch after `after` (≤ `until`).
    ReplayFetch { ch: Arc<str>, conn: ConnRef, after: u64, until: u64 },
    /// The home core's answer: frames after `after`, or `evicted = Some(oldest)` when that part
    /// of history is gone meanwhile.
    ReplayBatch { ch: Arc<str>, conn: ConnId, frames: Vec<Bytes>, evicted: Option<u64> },
    /// `GET /connections`: list this core's `top` connections by queued bytes.
    Inspect { reply: ConnRef, top: usize },
    /// One core's answer to [`CoreMsg::Inspect`].
    Inspected { reply: ConnRef, rows: Vec<ConnRow> },
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

/// What an HTTP connection waits for from other cores.
#[derive(Debug)]
pub enum HttpWait {
    /// The home core's answer to a publish.
    Publish(PublishResult),
    /// `/connections`: rows gathered so far, and how many cores have yet to answer.
    Inspect { missing: usize, top: usize, rows: Vec<ConnRow> },
}

/// How a `sub` with `from` resolved at the home core.
#[derive(Debug)]
pub enum Resume {
    /// No `from` was given: live from `head`.
    Live,
    /// `from` was found: replay seqs `from+1 ..= until` (the head at subscribe) before live
    /// ones. `frames` is the first batch; the rest is fetched as the connection drains.
    Recovered { from: u64, frames: Vec<Bytes>, until: u64 },
    /// The resume point is gone: send `reset` (evicted or epoch) with the oldest kept seq.
    Reset { reason: crate::protocol::ResetReason, oldest: u64 },
    /// `from` is beyond `head`: answer with an `error`.
    Ahead,
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
        let mut senders: Vec<Vec<Option<Sender<CoreMsg>>>> = (0..cores).map(|_| (0..cores).map(|_| None).collect()).collect();
        let mut receivers: Vec<Vec<(u16, Receiver<CoreMsg>)>> = (0..cores).map(|_| Vec::new()).collect();
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
    senders: Vec<Option<Sender<CoreMsg>>>,
    receivers: Vec<(u16, Receiver<CoreMsg>)>,
    spill: Vec<VecDeque<CoreMsg>>,
    doorbells: Arc<[Doorbell]>,
    next_rx: usize,
}

impl Endpoint {
    /// Sends `msg` to core `dst` (not this core), spilling locally when its queue is full.
    pub fn send(&mut self, dst: usize, msg: CoreMsg) -> SpillDelta {
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
    pub fn try_recv(&mut self) -> Option<CoreMsg> {
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
            spilled += a.send(1, CoreMsg::Deliver { ch: "c".into(), seq, frame: Bytes::new() });
        }
        assert_eq!(spilled, 10);
        assert!(a.has_spill());
        let mut got = Vec::new();
        while let Some(CoreMsg::Deliver { seq, .. }) = b.try_recv() {
            got.push(seq);
        }
        assert_eq!(a.retry_spill(), 10);
        while let Some(CoreMsg::Deliver { seq, .. }) = b.try_recv() {
            got.push(seq);
        }
        assert_eq!(got, (0..n as u64).collect::<Vec<_>>());
        assert!(!a.has_spill());
    }
}
