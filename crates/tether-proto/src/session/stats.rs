//! What a session counts as it decides: close codes sent and received, handshakes that timed
//! out, overflows under each policy, refusals by each per-connection limit, heartbeat pings and
//! the drain's remaining closes. One [`SessionStats`] per core (relaxed atomics, written by
//! that core only), lent to every session call through `Ctx`; the server renders them in the
//! Prometheus text format (`tether_closes_total`, `tether_overflow_total`, …). Counting is not
//! I/O: the session stays sans-IO.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use crate::protocol::close::CloseCode;

/// Close codes counted individually in `tether_closes_total{code}`; anything else is `other`.
pub const CLOSE_CODES: [u16; 14] = [1000, 1001, 1002, 1003, 1006, 1007, 1008, 1009, 1011, 1012, 1013, 1014, 4001, 4003];

/// Why a request failed before (or instead of) becoming a WebSocket connection:
/// the `reason` label of `tether_handshake_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum HandshakeFailure {
    /// Malformed request or failed RFC 6455 §4.2.1 check (HTTP 400).
    BadRequest = 0,
    /// `Sec-WebSocket-Version` other than 13 (HTTP 426).
    Version,
    /// Request head larger than `limits.max_header_bytes` (HTTP 431).
    HeadTooLarge,
    /// No complete request head within `limits.handshake_timeout_ms`.
    Timeout,
    /// `max_connections` reached (HTTP 503 + Retry-After).
    OverCapacity,
    /// `accept_rate` exceeded (HTTP 503 + Retry-After).
    RateLimited,
    /// `Origin` not in `allowed_origins` (HTTP 403).
    Origin,
    /// The server is draining (HTTP 503).
    Draining,
    /// The peer went away mid-handshake.
    Aborted,
    /// `[auth]` is on and the upgrade carried no valid token (HTTP 401, docs/security.md).
    Unauthorized,
}

/// The `reason` labels of `tether_handshake_failures_total`, in [`HandshakeFailure`] order.
pub const FAILURE_NAMES: [&str; 10] = [
    "bad_request",
    "version",
    "head_too_large",
    "timeout",
    "over_capacity",
    "rate_limited",
    "origin",
    "draining",
    "aborted",
    "unauthorized",
];

impl HandshakeFailure {
    /// The metric label (also used in log lines).
    pub fn label(self) -> &'static str {
        FAILURE_NAMES[self as usize]
    }
}

/// The limit that refused a request or a frame: the `limit` label of
/// `tether_limit_refusals_total` (docs/security.md, "Per-connection limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Limit {
    /// `limits.per_connection.max_subscriptions`: a `sub` beyond it.
    MaxSubscriptions = 0,
    /// `limits.per_connection.publish_rate`: a `pub` with the message bucket empty.
    PublishRate,
    /// `limits.per_connection.publish_bytes_rate`: a `pub` with too few bytes in its bucket.
    PublishBytesRate,
    /// `limits.per_connection.control_frames_rate`: a ping left unanswered, or an unsolicited
    /// pong, beyond the rate.
    ControlFrames,
    /// `limits.max_channels`: a `sub` or publish that would create one channel too many.
    MaxChannels,
    /// `limits.per_connection.subscribe_rate`: a `sub` or `unsub` beyond it.
    SubscribeRate,
    /// `limits.per_connection.refresh_rate`: a `refresh` beyond it.
    RefreshRate,
    /// `limits.per_connection.bad_request_rate`: a malformed or unknown request beyond it.
    BadRequestRate,
    /// More requests held behind unanswered ones than `server::requests::MAX_HELD` (closes
    /// the connection with 1008).
    HeldRequests,
    /// `limits.per_connection.presence_rate`: a `presence` or `presence_stats` beyond it.
    PresenceRate,
}

/// The `limit` labels of `tether_limit_refusals_total`, in [`Limit`] order.
pub const LIMIT_NAMES: [&str; 10] = [
    "max_subscriptions",
    "publish_rate",
    "publish_bytes_rate",
    "control_frames",
    "max_channels",
    "subscribe_rate",
    "refresh_rate",
    "bad_request_rate",
    "held_requests",
    "presence_rate",
];

impl Limit {
    /// The metric label.
    pub fn label(self) -> &'static str {
        LIMIT_NAMES[self as usize]
    }

    /// The configuration key (without its table), as named in `error` reasons and in the
    /// JSON reason of a 1008 close.
    pub fn key(self) -> &'static str {
        match self {
            Limit::ControlFrames => "control_frames_rate",
            other => other.label(),
        }
    }
}

/// Overflow policies, the `policy` label of `tether_overflow_total`.
pub const OVERFLOW_POLICIES: [&str; 3] = ["disconnect", "drop-oldest", "conflate"];

/// Upper bounds (bytes) of the `tether_overflow_queue_bytes` histogram buckets.
pub const QUEUE_BUCKETS: [u64; 8] = [4096, 16384, 65536, 262_144, 1_048_576, 4_194_304, 16_777_216, u64::MAX];

/// The counters of one core's sessions (see the module docs). Each array is indexed like the
/// label list beside it ([`CLOSE_CODES`] plus `other`, [`FAILURE_NAMES`],
/// [`OVERFLOW_POLICIES`], [`QUEUE_BUCKETS`], [`LIMIT_NAMES`]).
#[derive(Default)]
pub struct SessionStats {
    /// Close frames sent or received, by code ([`CLOSE_CODES`], then `other`).
    pub closes: [AtomicU64; CLOSE_CODES.len() + 1],
    /// Requests refused before (or instead of) an upgrade, by [`HandshakeFailure`].
    pub handshake_failures: [AtomicU64; FAILURE_NAMES.len()],
    /// Outbound queue overflows, by policy ([`OVERFLOW_POLICIES`]).
    pub overflow: [AtomicU64; OVERFLOW_POLICIES.len()],
    /// Overflows by the queue's size at that moment ([`QUEUE_BUCKETS`], not cumulative).
    pub overflow_queue_bytes: [AtomicU64; QUEUE_BUCKETS.len()],
    /// The queue sizes of every overflow, summed (bytes).
    pub overflow_queue_bytes_sum: AtomicU64,
    /// Requests and control frames refused, by [`Limit`].
    pub limit_refusals: [AtomicU64; LIMIT_NAMES.len()],
    /// Heartbeat pings sent.
    pub pings_sent: AtomicU64,
    /// Connections still to be closed by the drain on this core (gauge): the core adds those it
    /// schedules, each drain close (or teardown of a scheduled one) takes one away.
    pub drain_remaining: AtomicI64,
    /// Open WebSocket connections that negotiated permessage-deflate (gauge): the upgrade adds
    /// one, the server's teardown takes it away.
    pub deflate_connections: AtomicI64,
    /// permessage-deflate (RFC 7692) outbound, counted where a message is compressed (once
    /// for the whole process per message, or per `/echo` frame).
    pub deflate: DeflateStats,
}

/// What compressing outbound messages did (each message counted once, on the core that
/// compressed it for every core).
#[derive(Debug, Default)]
pub struct DeflateStats {
    /// Messages sent compressed.
    pub compressed: AtomicU64,
    /// Messages some subscriber took compressed that went plain instead (under
    /// `compression.min_bytes`, or not smaller compressed).
    pub skipped: AtomicU64,
    /// Frame bytes of the compressed messages as they would have gone plain.
    pub plain_bytes: AtomicU64,
    /// Frame bytes of the compressed messages as they went (header included).
    pub deflated_bytes: AtomicU64,
}

impl DeflateStats {
    /// Counts one message that some subscriber takes compressed: `deflated` is its
    /// compressed frame's length, `None` when it went plain.
    pub fn count(&self, plain: usize, deflated: Option<usize>) {
        match deflated {
            Some(n) => {
                self.compressed.fetch_add(1, Relaxed);
                self.plain_bytes.fetch_add(plain as u64, Relaxed);
                self.deflated_bytes.fetch_add(n as u64, Relaxed);
            }
            None => {
                self.skipped.fetch_add(1, Relaxed);
            }
        }
    }
}

impl SessionStats {
    /// Counts one close frame sent or received with `code` (1006 for an abnormal end).
    pub fn close(&self, code: CloseCode) {
        let code = u16::from(code);
        let i = CLOSE_CODES.iter().position(|&c| c == code).unwrap_or(CLOSE_CODES.len());
        self.closes[i].fetch_add(1, Relaxed);
    }

    /// Counts one handshake failure.
    pub fn handshake_failure(&self, why: HandshakeFailure) {
        self.handshake_failures[why as usize].fetch_add(1, Relaxed);
    }

    /// Counts one refusal by `limit`.
    pub fn limit_refused(&self, limit: Limit) {
        self.limit_refusals[limit as usize].fetch_add(1, Relaxed);
    }

    /// Overflows so far under each policy, in [`OVERFLOW_POLICIES`] order
    /// (`tether_overflow_total{policy}` of this core).
    pub fn overflows(&self) -> [u64; OVERFLOW_POLICIES.len()] {
        std::array::from_fn(|i| self.overflow[i].load(Relaxed))
    }

    /// Counts one overflow under `policy` (index into [`OVERFLOW_POLICIES`]) with the queue
    /// size in bytes at that moment.
    pub fn overflow(&self, policy: usize, queued_bytes: u64) {
        self.overflow[policy].fetch_add(1, Relaxed);
        let b = QUEUE_BUCKETS.iter().position(|&ub| queued_bytes <= ub).unwrap_or(QUEUE_BUCKETS.len() - 1);
        self.overflow_queue_bytes[b].fetch_add(1, Relaxed);
        self.overflow_queue_bytes_sum.fetch_add(queued_bytes, Relaxed);
    }
}
