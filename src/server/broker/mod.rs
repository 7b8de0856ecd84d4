//! The broker seam: where a channel's home lives — its sequence numbers, epoch, history and
//! publish dedup — and how requests reach it.
//!
//! A core asks a [`Broker`] on behalf of its connections ([`Request`]); the answers and the
//! fan-out come back to the asking core's inbox as [`CoreMsg`]s. The memory broker
//! ([`memory::MemoryBroker`]) keeps each channel at a home core inside this process; a Redis
//! broker (multi-node) keeps it in Redis behind a broker thread, and implements the same trait.
//!
//! # Layout
//! - this file: the [`Broker`] trait and its contract (its [`Request`]s travel on the bus);
//! - [`memory`]: the embedded broker (one process), routing requests to home cores;
//! - [`home`]: the memory broker's per-core channel store (seq, epoch, history, dedup);
//! - [`redis`]: the Redis broker (several nodes): a broker thread per process;
//! - [`epoch`]: the memory broker's epochs: the process epoch, tombstones of forgotten
//!   channels, and when an epoch changes;
//! - [`cap`]: the process-wide channel count against `limits.max_channels`.

pub mod cap;
pub mod epoch;
pub mod home;
pub mod memory;
pub mod redis;

use super::bus::CoreMsg;
pub use super::bus::Request;
use super::bus::Router;

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
///   for resume; a resume point older than that is answered with a reset (`evicted`).
///
/// Calls never block: a request is handed on and answered later through the asking core's
/// inbox. A broker that cannot store a publish now answers [`super::bus::PublishResult::Refused`].
pub trait Broker {
    /// Hands `req` to the channel's home, through `router` when the home is a core.
    fn request(&mut self, router: &mut Router, req: Request);

    /// Serves a request that reached this core because it is the channel's home, answering
    /// through `router`; `now_ms` is the core's clock in milliseconds. Only a broker that
    /// keeps homes on cores (memory) routes requests here; others never receive one.
    fn serve(&mut self, router: &mut Router, now_ms: u64, req: Request);

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
}
