//! The entry of a producer that is not a core (the feeds thread, docs/feeds.md) into the
//! broker path: a publish handed to a core here goes through exactly the path of a WebSocket
//! or HTTP publish (`Broker::request` at that core: the channel's home core over the bus with
//! the memory broker, the broker thread's queue with Redis), fence included, and its answer
//! comes back on a oneshot channel.
//!
//! Each core has one bounded queue ([`PORT_CAPACITY`]); a full queue refuses the publish back
//! to the producer ([`FeedPorts::try_publish`]), which waits and retries: backpressure onto the
//! upstream read instead of a growing backlog. The answer is routed with a reserved connection
//! key ([`FEED_KEY`]) whose generation is a ticket in the core's table of waiting publishes.

use std::collections::HashMap;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use tokio::sync::oneshot;

use super::broker::home::home_of;
use super::broker::{Fence, PublishResult, Request};
use super::bus::{ConnRef, Doorbell};
use super::conn::ConnId;
use crate::feeds::FeedPublish;
use crate::protocol::RequestError;

/// Capacity of each core's feed queue, in publishes.
pub const PORT_CAPACITY: usize = 1024;

/// The slab key of a [`ConnRef`] that answers a feed publish instead of a connection (no slab
/// reaches it: a core holds far fewer than 2^32 - 2 connections).
pub const FEED_KEY: u32 = u32::MAX - 1;

/// The producers' side of every core's feed queue, and the way back of the admin API's
/// answers. Shared by the process (`Shared`).
pub struct FeedPorts {
    senders: Vec<Sender<FeedPublish>>,
    receivers: Vec<Receiver<FeedPublish>>,
    /// Admin answers per core. Unbounded, yet bounded by the HTTP connections: each waits for
    /// at most one answer (no further request of it is parsed meanwhile).
    answers: Vec<(Sender<AdminAnswer>, Receiver<AdminAnswer>)>,
    doorbells: Arc<[Doorbell]>,
}

/// An admin answer for the HTTP connection `conn` of the core it is sent to.
pub type AdminAnswer = (ConnId, crate::feeds::admin::AdminReply);

impl FeedPorts {
    /// One queue per core of `doorbells`.
    pub fn new(doorbells: Arc<[Doorbell]>) -> FeedPorts {
        let (senders, receivers) = (0..doorbells.len()).map(|_| crossbeam_channel::bounded(PORT_CAPACITY)).unzip();
        let answers = (0..doorbells.len()).map(|_| crossbeam_channel::unbounded()).collect();
        FeedPorts { senders, receivers, answers, doorbells }
    }

    /// A callback that hands an admin answer to connection `conn` of core `core` and rings it.
    pub fn answerer(&self, core: usize, conn: ConnId) -> Box<dyn FnOnce(crate::feeds::admin::AdminReply) + Send> {
        let tx = self.answers[core].0.clone();
        let doorbells = self.doorbells.clone();
        Box::new(move |reply| {
            if tx.send((conn, reply)).is_ok() {
                doorbells[core].ring();
            }
        })
    }

    /// Hands `p` to the core of its channel's home (any core would do; the home saves the
    /// memory broker a hop) and rings it. Errors: the queue is full; `p` comes back, to retry
    /// after a short wait.
    pub fn try_publish(&self, p: FeedPublish) -> Result<(), FeedPublish> {
        let core = home_of(&p.ch, self.senders.len());
        match self.senders[core].try_send(p) {
            Ok(()) => {
                self.doorbells[core].ring();
                Ok(())
            }
            Err(TrySendError::Full(p)) | Err(TrySendError::Disconnected(p)) => Err(p),
        }
    }
}

/// A core's side: its queue and the publishes waiting for their answer.
pub struct FeedInbox {
    rx: Receiver<FeedPublish>,
    answers: Receiver<AdminAnswer>,
    waiting: HashMap<u32, oneshot::Sender<Result<u64, Box<RequestError>>>>,
    next_ticket: u32,
}

impl FeedInbox {
    /// Core `me`'s side of `ports`.
    pub fn new(ports: &FeedPorts, me: usize) -> FeedInbox {
        FeedInbox {
            rx: ports.receivers[me].clone(),
            answers: ports.answers[me].1.clone(),
            waiting: HashMap::new(),
            next_ticket: 0,
        }
    }

    /// The next admin answer for one of this core's HTTP connections, or `None`.
    pub fn next_answer(&mut self) -> Option<AdminAnswer> {
        self.answers.try_recv().ok()
    }

    /// The next queued publish as a broker [`Request`] whose answer comes back to core `me`
    /// with a ticket, or `None`.
    pub fn next_request(&mut self, me: usize) -> Option<Request> {
        let p = self.rx.try_recv().ok()?;
        let ticket = self.next_ticket;
        self.next_ticket = self.next_ticket.wrapping_add(1);
        self.waiting.insert(ticket, p.done);
        Some(Request::Publish {
            ch: p.ch,
            id: Some(p.id),
            data: p.data,
            reply: Some(ConnRef { core: me as u16, id: ConnId { key: FEED_KEY, gen: ticket } }),
            fence: Some(Fence { feed: p.feed, token: p.token }),
        })
    }

    /// Whether `id` names a feed publish's ticket rather than a connection.
    pub fn is_ticket(id: ConnId) -> bool {
        id.key == FEED_KEY
    }

    /// Hands the answer of ticket `id` to its producer (gone producers are ignored).
    pub fn answer(&mut self, id: ConnId, result: PublishResult) {
        if let Some(done) = self.waiting.remove(&id.gen) {
            let _ = done.send(match result {
                PublishResult::Stored { seq } => Ok(seq),
                PublishResult::Refused(e) => Err(e),
            });
        }
    }
}
