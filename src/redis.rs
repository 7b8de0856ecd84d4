//! Redis, as the broker and the lease store both reach it: one connection type for a single
//! Redis or a Redis Cluster ([`link::Link`]), Redis's clock as this node sees it ([`clock`]),
//! and how long a reply is awaited past a request's deadline ([`REPLY_GRACE`]).
//!
//! Below `feeds` and `server` in the layering (tests/layers.rs): it knows the broker's
//! configuration block and nothing of who uses the link.

pub mod clock;
pub mod link;

use std::time::Duration;

/// How much longer than `request_timeout_ms` a scripted write (a broker publish, a lease
/// write) waits for its reply. The scripts store nothing past the request's deadline (checked
/// against Redis `TIME`), so a reply within this grace is a definite answer: stored, or
/// `LATE` (not stored). Only without any reply by then is the outcome unknown (a publish
/// answers HTTP 504, `unknown_outcome`); the answer still comes within `request_timeout_ms`
/// + 1 s.
pub const REPLY_GRACE: Duration = Duration::from_millis(500);
