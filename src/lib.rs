//! tether — a WebSocket pub/sub server for connections that stay open for hours, built for
//! C1M density on one tuned Linux box.
//!
//! # Layout
//!
//! Bottom first: a module names only modules above it in this list (tests/layers.rs checks
//! every `crate::` path; CONTRIBUTING.md, "Layout").
//!
//! - [`http`], [`ws`], [`protocol`], [`tick`], [`session`]: the sans-IO core, re-exported
//!   from the `tether-proto` crate (crates/tether-proto): HTTP/1.1 requests, bodies and
//!   responses; the RFC 6455 codec and upgrade check; the pub/sub wire protocol v1
//!   (docs/protocol.md), its close-code contract and the reconnect backoff; the time base; and
//!   one connection's decisions, the session (frames, closes, heartbeats, the outbound queue
//!   and its overflow policies, replay, per-connection limits). No IO crate can reach them
//!   (their Cargo.toml has none; tests/layers.rs checks it).
//! - [`log_limit`]: a sans-IO rate limiter for log lines a flood can produce; [`logging`]: the
//!   `TETHER_LOG` filter, checked before use.
//! - [`config`]: the TOML configuration (docs/configuration.md), its defaults, its validation,
//!   and the feed definitions it carries.
//! - [`auth`]: JWT connection auth (docs/security.md): token verification, the per-core
//!   table of interned grants, and `tether token`.
//! - [`limits`]: `tether check-limits`: reads the OS limits and predicts connection capacity.
//! - [`client`]: the tokio client, the `sub`/`pub` command-line tools and `tether feeds` (the
//!   feeds admin API's command line), re-exported from the `tether-client` crate
//!   (crates/tether-client), which stands on `tether-proto` alone.
//! - [`redis`]: the Redis link shared by the broker and the lease store (one Redis or a
//!   Cluster), Redis's clock as this node sees it, and the reply grace of scripted writes.
//! - [`feeds`]: upstream feeds owned by leases (docs/feeds.md): the feed record, the lease
//!   store (memory, Redis, and DynamoDB with the `dynamodb` feature), and the feeds thread of
//!   each process (reconcile, renew, the owner task that republishes an upstream, release on
//!   drain, the `/feeds` admin requests). It reaches the server only through
//!   [`feeds::FeedHost`], which the server implements.
//! - [`server`]: the thread-per-core engine: one monoio runtime per core, its listener(s), its
//!   slab of connections, its side of the subscription index, the channels whose home it is,
//!   the bounded queues between cores, and TLS between the socket calls and the sessions
//!   (`server::tls`).
//!
//! The fuzz targets (parsers and session) are the `tether-fuzz` crate (crates/tether-fuzz): they
//! need the sans-IO crate alone.

#![warn(missing_docs, unreachable_pub)]

pub use tether_client as client;
pub use tether_proto::{http, protocol, published, session, sse, tick, ws};

pub mod auth;
pub mod config;
pub mod feeds;
pub mod limits;
pub mod log_limit;
pub mod logging;
pub mod redis;
pub mod server;
