//! Upstream feeds owned by leases (DESIGN §6 "Upstream feeds", docs/feeds.md): the feed
//! record, the lease store, and the runtime that owns feeds on a node (reconcile, renew,
//! the owner task that republishes an upstream, release on drain, the admin API's side).
//!
//! A feed is an outbound WebSocket to an upstream source whose messages are republished into
//! one channel. Exactly one node may hold it at a time: the holder of the feed's **lease**.
//! The lease rules, enforced by every [`LeaseStore`]:
//! - `acquire` succeeds only when the lease is free (never held, released, or expired:
//!   `lease_expires_at_ms <= now_ms`) and increments the **fencing token** by one;
//! - `renew` (and each lease of a `renew_many`) and `release` succeed only for the current holder: same `lease_owner` and same
//!   fencing token; `renew` also needs the lease unexpired;
//! - `release` sets `lease_expires_at_ms` to 0 (free at once), keeps `last_seq`, and
//!   announces the feed id to [`LeaseStore::released`] subscribers.
//!
//! Times are milliseconds passed in by the caller (Unix epoch ms in production), never read
//! from a clock here: with several nodes, each uses its own clock, so the rules hold only if
//! the nodes' clocks agree within the skew margin a holder keeps before its expiry (DESIGN §7
//! `[feeds] skew_margin_ms`, 2 s by default).
//!
//! # Layout
//! - [`record`]: the [`Feed`] record ([`FeedDef`] + [`Lease`]) and the validation of a
//!   definition;
//! - [`store`] (one folder, `feeds/store/`): the lease store. `store/mod.rs` the
//!   [`LeaseStore`] trait, [`LeaseError`], [`LeaseTerm`] and [`Renewal`]; `store/front.rs`
//!   [`AnyStore`], the front door the runtime calls: the backend `[feeds] store` names, every
//!   argument checked once there, items written counted; the backends, which only store:
//!   `store/memory.rs` [`MemoryLeaseStore`] (one process), `store/redis.rs`
//!   [`RedisLeaseStore`] (the broker's Redis, one Lua script per compare-and-set, per 500
//!   leases for the batched renew), `store/dynamodb/` `DynamoLeaseStore` (cargo feature
//!   `dynamodb`: one conditional `UpdateItem` per compare-and-set, one `TransactWriteItems`
//!   per 100 leases for the batched renew); `store/releases.rs` release notifications on the
//!   broker's Redis pub/sub, shared by the Redis store and (with the Redis broker) the
//!   DynamoDB store. [`memory`], [`redis`], [`releases`] and `dynamodb` are re-exported here
//!   under their old paths;
//! - [`runtime`]: the feeds thread: reconcile, renew, give up in time, release on drain;
//! - [`owner`]: one owned feed's upstream connection and its fenced publishes;
//! - [`host`]: [`host::FeedHost`], what the feeds thread needs from the server that hosts it
//!   (config, counters, a publish port), so the feeds never name the engine;
//! - [`admin`]: the `/feeds` admin requests, served by the feeds thread (their command line,
//!   `tether feeds`, is a client tool: `tether_client::FeedsArgs`);
//! - [`metrics`]: `tether_feed*` counters, the lease store's request counters, and per-feed
//!   progress.

pub mod admin;
pub mod host;
pub mod metrics;
pub mod owner;
pub mod record;
pub mod runtime;
pub mod store;

pub use host::{FeedHost, FeedPublish};
pub use record::{DesiredState, Feed, FeedDef, FeedError, Lease};
#[cfg(feature = "dynamodb")]
pub use store::dynamodb;
#[cfg(feature = "dynamodb")]
pub use store::dynamodb::{DynamoConfig, DynamoCredentials, DynamoLeaseStore};
pub use store::{memory, redis, releases};
pub use store::{AnyStore, LeaseError, LeaseStore, LeaseTerm, MemoryLeaseStore, RedisLeaseStore, Renewal};
