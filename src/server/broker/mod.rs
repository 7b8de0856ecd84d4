//! The broker seam: where a channel's home lives — its sequence numbers, epoch, history and
//! publish dedup — and how requests reach it.
//!
//! A core asks a [`Broker`] on behalf of its connections ([`Request`]); the answers and the
//! fan-out come back to the asking core's inbox as [`CoreMsg`]s. The memory broker
//! ([`memory::MemoryBroker`]) keeps each channel at a home core inside this process; a Redis
//! broker (multi-node) keeps it in Redis behind a broker thread, and implements the same trait.
//!
//! # Layout
//! - this file: the [`Broker`] trait and its contract, the [`Outbox`] a broker answers
//!   through, and [`open`], which builds the configured broker for every core;
//! - [`request`]: the seam's vocabulary: [`Request`], [`PublishResult`], [`Fence`],
//!   [`Resume`], [`HistoryPage`] and [`Control`] (the server API's node-wide actions);
//! - [`memory`]: the embedded broker (one process), routing requests to home cores;
//! - [`home`]: the memory broker's per-core channel store (seq, epoch, history, dedup);
//! - [`presence`]: the memory broker's per-core presence store (members, the join/leave
//!   window, pages);
//! - [`redis`]: the Redis broker (several nodes): a broker thread per process;
//! - [`epoch`]: the memory broker's epochs: the process epoch, tombstones of forgotten
//!   channels, and when an epoch changes;
//! - [`cap`]: the process-wide channel count against `limits.max_channels`.

pub mod cap;
pub mod epoch;
pub mod home;
pub mod memory;
pub mod presence;
pub mod redis;
pub mod request;

use std::io;
use std::sync::Arc;

pub use request::{
    within_page_bytes, Control, Fence, HistoryPage, PresenceQuery, PublishResult, Request, Resume,
    HISTORY_PAGE_MAX_BYTES,
};

use super::bus::CoreMsg;
use super::Shared;
use crate::config::BrokerKind;

/// Where a broker's requests and answers go: the asking core's way out to the other cores
/// (the bus's `Router`, for the memory broker, whose homes live on cores). What one core hands
/// to one destination arrives there in the order it was handed, and never blocks (a full
/// queue spills).
pub trait Outbox {
    /// This core's index: `0 ..` [`Shared::cores`].
    fn me(&self) -> usize;

    /// Hands `req` to the broker at core `home` (`0 .. Shared::cores`, this core included),
    /// where it reaches [`Broker::serve`].
    fn to_home(&mut self, home: usize, req: Request);

    /// Sends `msg` (an answer, a delivery) to core `core` (`0 .. Shared::cores`, this core
    /// included) about that core's connections.
    fn to_core(&mut self, core: usize, msg: CoreMsg);
}

/// The home side of channels.
///
/// # Contract
/// Every implementation guarantees, per channel:
/// - **Seq assignment.** A channel's first published message gets seq 1, each next one
///   seq + 1, with no gap and no reuse within an epoch. `epoch` is an opaque string that
///   changes whenever numbering restarts (a memory broker's process restart, say) and only
///   then: a channel the broker forgets and creates again while its numbering goes on keeps
///   its epoch. A resume across epochs is answered with a reset, never a silent gap.
/// - **Order.** Requests about one channel from one core are handled in the order they were
///   made, and everything a home sends to one core about one channel arrives in the order it
///   was sent. In particular a [`CoreMsg::Subscribed`] (with its head `h`) is ordered before
///   every [`CoreMsg::Deliver`] that follows it to that core, and those carry exactly the
///   seqs after `h`: with the history batches of a resume, the subscriber sees no gap and no
///   duplicate at the seam.
/// - **Dedup.** A publish whose `id` was published on the same channel within
///   `dedup.window_ms` is not published again: it is answered with the original seq.
/// - **Fan-out.** Each published message is encoded as one `msg` frame and sent once to each
///   core that has subscribers of the channel (not once per subscriber).
/// - **History.** The last `history` messages of a channel (its `[[channels]]` rule) are kept
///   for resume; a resume point older than that is answered with a reset (`evicted`). A
///   [`Request::History`] reads the same messages a resume replays, with the channel's head,
///   epoch and oldest kept seq.
/// - **Control.** A [`Request::Control`] reaches every other node sharing the broker (none
///   for the memory broker: it answers at once that no other node was told), each of which
///   hands it to all its cores as [`CoreMsg::Control`].
///
/// Calls never block: a request is handed on and answered later through the asking core's
/// inbox. A broker that cannot store a publish now answers [`PublishResult::Refused`].
pub trait Broker {
    /// Hands `req` to the channel's home, through `out` when the home is a core.
    fn request(&mut self, out: &mut dyn Outbox, req: Request);

    /// Serves a request that reached this core because it is the channel's home, answering
    /// through `out`; `now_ms` is the core's clock in milliseconds. Only a broker that
    /// keeps homes on cores (memory) routes requests here; others never receive one.
    fn serve(&mut self, out: &mut dyn Outbox, now_ms: u64, req: Request);

    /// Periodic upkeep at `now_ms` (forgetting idle channels, …), every `tick::SWEEP_MS`
    /// while [`Broker::wants_sweep`] says so.
    fn sweep(&mut self, now_ms: u64);

    /// Gives back the spare capacity of the broker's per-core tables when they are mostly
    /// spare (`server::reclaim`); returns whether it shrank anything. Nothing by default.
    fn shrink_if_spare(&mut self) -> bool {
        false
    }

    /// Whether [`Broker::sweep`] has anything to do: when not, an idle core's clock does not
    /// wake for it (the clock is tickless).
    fn wants_sweep(&self) -> bool {
        true
    }

    /// The next answer or delivery from a broker that runs outside the cores (Redis: its
    /// thread), in order; the memory broker's travel on the bus instead.
    fn recv(&mut self) -> Option<CoreMsg> {
        None
    }

    /// Whether requests wait for room in a full queue (the processor then retries soon).
    fn has_backlog(&self) -> bool {
        false
    }

    /// When the broker next has timed work (a presence window closing), in milliseconds on
    /// the core's clock; `None` when it has none. The core's clock wakes for it and calls
    /// [`Broker::on_due`].
    fn next_due_ms(&self) -> Option<u64> {
        None
    }

    /// Does the timed work due at `now_ms` (closes presence windows, sending their frames
    /// through `out`).
    fn on_due(&mut self, _out: &mut dyn Outbox, _now_ms: u64) {}

    /// Up to `n` of the presence channels homed on this core, those with the most members
    /// first (`GET /status.json`); none for a broker that keeps no presence at the cores (the
    /// Redis broker keeps it in Redis: ask `GET /api/presence_stats/{ch}` there).
    fn presence_top(&self, _n: usize) -> Vec<super::bus::PresenceRow> {
        Vec::new()
    }
}

/// Builds the broker of `shared.config.broker` for every core, index = core
/// (`shared.cores` of them): a [`memory::MemoryBroker`] shard per core, or each core's side
/// of the Redis broker, whose thread this starts ([`redis::start`]: it connects in the
/// background). Errors: the Redis broker's thread could not be spawned.
pub fn open(shared: &Arc<Shared>) -> io::Result<Vec<Box<dyn Broker + Send>>> {
    match shared.config.broker.kind {
        BrokerKind::Memory => Ok((0..shared.cores)
            .map(|_| Box::new(memory::MemoryBroker::new(shared.clone())) as Box<dyn Broker + Send>)
            .collect()),
        BrokerKind::Redis => {
            // rediss:// needs a TLS crypto provider; a second install is harmless.
            let _ = rustls::crypto::ring::default_provider().install_default();
            Ok(redis::start(shared.clone())?.into_iter().map(|b| Box::new(b) as Box<dyn Broker + Send>).collect())
        }
    }
}
