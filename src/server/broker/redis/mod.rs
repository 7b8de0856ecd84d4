//! The Redis broker (`[broker] kind = "redis"`, docs/redis.md): a channel's seq, epoch,
//! history and publish dedup live in Redis, and nodes fan messages out to each other through
//! Redis pub/sub, so several tether nodes serve the same channels and a client resumes on any
//! of them.
//!
//! The cores do not speak Redis. One broker thread per process ([`thread`]) runs a small
//! tokio runtime with the `redis` crate; each core hands it [`Request`]s over its own bounded
//! queue and rings it awake, and the thread answers with [`CoreMsg`]s on a bounded queue per
//! core, ringing the core's doorbell. A core never waits for Redis.
//!
//! # Layout
//! - this file: the core's side ([`RedisBroker`], the [`Broker`] implementation) and
//!   [`start`], which starts the thread;
//! - [`thread`]: the broker thread: its serve loop, the command link's requests, history
//!   reads;
//! - [`publish`]: storing a batch of publishes with one script call, answering publishers;
//! - [`channel`]: one task per channel with subscribers on this node: seq continuity, gap
//!   repair, epoch changes, the subscribe seam;
//! - [`links`]: the tasks that keep the command and pub/sub links up;
//! - [`crate::redis::link`]: a connection to one Redis or a Redis Cluster;
//! - [`keys`]: key names, payloads and the server-side scripts;
//! - [`presence`]: presence's keys, scripts, topic payload and per-node window;
//!   [`members`]: the task that writes this node's members and answers presence queries;
//! - [`clock`]: Redis's clock against this node's, for the scripts' deadlines;
//! - [`api`]: the server API's requests: history pages, the control topic that carries
//!   disconnects, unsubscribes and revocations to the other nodes, and the revocations kept
//!   in Redis.

pub mod api;
pub mod channel;
pub mod clock;
pub mod keys;
pub mod links;
pub mod members;
pub mod presence;
pub mod publish;
pub mod thread;

use std::collections::VecDeque;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use tokio::sync::Notify;

use super::{Broker, Outbox, Request};
use crate::server::bus::CoreMsg;
use crate::server::Shared;

/// Capacity of each queue between a core and the broker thread, in messages.
pub const QUEUE_CAPACITY: usize = 16_384;

/// One core's side of the Redis broker: a queue to the broker thread and one back.
pub struct RedisBroker {
    to: Sender<Request>,
    from: Receiver<CoreMsg>,
    wake: Arc<Notify>,
    /// Requests waiting for room in a full queue, in order.
    spill: VecDeque<Request>,
}

impl RedisBroker {
    fn push(&mut self, req: Request) {
        if self.spill.is_empty() {
            match self.to.try_send(req) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => {}
                Err(TrySendError::Full(r)) => self.spill.push_back(r),
            }
        } else {
            self.spill.push_back(req);
        }
        self.wake.notify_one();
    }

    fn retry_spill(&mut self) {
        let before = self.spill.len();
        while let Some(r) = self.spill.pop_front() {
            if let Err(TrySendError::Full(r)) = self.to.try_send(r) {
                self.spill.push_front(r);
                break;
            }
        }
        if self.spill.len() != before {
            self.wake.notify_one();
        }
    }
}

impl Broker for RedisBroker {
    fn request(&mut self, _out: &mut dyn Outbox, req: Request) {
        self.push(req);
    }

    fn serve(&mut self, _out: &mut dyn Outbox, _now_ms: u64, req: Request) {
        // Requests never travel to a core with this broker; one that did goes to Redis.
        self.push(req);
    }

    fn wants_sweep(&self) -> bool {
        // Its sweep only retries the spill, which the processor already retries every 1 ms
        // while there is one (`has_backlog`).
        !self.spill.is_empty()
    }

    fn sweep(&mut self, _now_ms: u64) {
        self.retry_spill();
    }

    fn recv(&mut self) -> Option<CoreMsg> {
        if !self.spill.is_empty() {
            self.retry_spill();
        }
        self.from.try_recv().ok()
    }

    fn has_backlog(&self) -> bool {
        !self.spill.is_empty()
    }
}

/// Starts the broker thread for `shared.config.broker`; returns each core's side, index =
/// core. The thread connects in the background (retrying with backoff): until it is
/// connected, publishes are answered `unavailable` and `/readyz` is 503. Errors: the thread
/// could not be spawned.
pub fn start(shared: Arc<Shared>) -> std::io::Result<Vec<RedisBroker>> {
    let wake = Arc::new(Notify::new());
    let mut cores = Vec::with_capacity(shared.cores);
    let mut inboxes = Vec::with_capacity(shared.cores);
    let mut outboxes = Vec::with_capacity(shared.cores);
    for _ in 0..shared.cores {
        let (to, inbox) = crossbeam_channel::bounded(QUEUE_CAPACITY);
        let (outbox, from) = crossbeam_channel::bounded(QUEUE_CAPACITY);
        inboxes.push(inbox);
        outboxes.push(outbox);
        cores.push(RedisBroker { to, from, wake: wake.clone(), spill: VecDeque::new() });
    }
    let w = wake.clone();
    std::thread::Builder::new()
        .name("tether-broker".into())
        .spawn(move || thread::run(shared, inboxes, outboxes, w))?;
    Ok(cores)
}
