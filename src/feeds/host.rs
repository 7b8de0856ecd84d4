//! What the feeds thread needs from the process that hosts it (the server, `crate::server`):
//! its configuration, the feeds' counters, the way back to the thread for the drain, and a
//! port into the broker path for fenced publishes. The server implements [`FeedHost`]; the
//! feeds never name the engine, so the arrow points one way (CONTRIBUTING.md, "Layout").

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::metrics::FeedMetrics;
use super::runtime::Command;
use crate::config::Config;
use crate::protocol::RequestError;

/// One fenced feed publish: `data` (compact JSON text, an upstream message) into `ch` with
/// publish id `id` (`feed:<feed>:<upstream seq>`), made under the lease of `feed` whose
/// fencing token is `token` (docs/feeds.md, "Fencing"). The channel's home refuses it with
/// [`crate::protocol::codes::FENCED`] once it has seen a newer token for `feed`.
#[derive(Debug)]
pub struct FeedPublish {
    /// Channel name (already valid).
    pub ch: std::sync::Arc<str>,
    /// The publish id, for dedup across a handover.
    pub id: Box<str>,
    /// The message.
    pub data: Bytes,
    /// The feed's id ([`super::FeedDef::id`]).
    pub feed: Box<str>,
    /// The fencing token of the lease the publisher holds ([`super::Lease::fencing_token`]).
    pub token: u64,
    /// Receives the home's answer: the channel's seq (the original one for a duplicate id), or
    /// the refusal. Dropped unanswered if the process stops first.
    pub done: oneshot::Sender<Result<u64, Box<RequestError>>>,
}

/// The host of the feeds thread. Shared by every task of the thread; `Send + Sync`.
pub trait FeedHost: Send + Sync + 'static {
    /// The process's configuration (`[feeds]`, `[broker]`, `limits.max_publish_bytes`).
    fn config(&self) -> &Config;

    /// This process's node id (`<hostname>-<8 hex digits>`, new at every start,
    /// [`super::runtime::new_node_id`]): the `lease_owner` of the leases it takes.
    fn node_id(&self) -> Arc<str>;

    /// The feeds' process-wide counters and per-feed progress (`tether_feed*`), which the
    /// host renders on `/metrics`.
    fn metrics(&self) -> &FeedMetrics;

    /// The sending end of the feeds thread's command queue (the receiving end is the one
    /// handed to [`super::runtime::FeedRuntime::start`]).
    fn commands(&self) -> &mpsc::UnboundedSender<Command>;

    /// Hands `p` to the broker path, exactly as a WebSocket publish of the channel would go.
    /// Errors: the host's queue is full (backpressure); `p` comes back, to retry after a short
    /// wait.
    fn try_publish(&self, p: FeedPublish) -> Result<(), FeedPublish>;
}
