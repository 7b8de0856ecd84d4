//! Per-core counters, read by `GET /metrics` in the Prometheus text format.
//!
//! Each core writes only its own [`CoreMetrics`] (relaxed atomics on its own cache lines), so
//! counting costs no contention on the hot path; the scrape sums nothing itself and emits one
//! sample per core with a `core` label, which is what Prometheus consumers expect.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use crate::session::stats::{
    DeflateStats, SessionStats, CLOSE_CODES, FAILURE_NAMES, LIMIT_NAMES, OVERFLOW_POLICIES, QUEUE_BUCKETS,
};
use crate::session::ReapReason;

/// One core's counters. Aligned so two cores never share a cache line.
#[repr(align(128))]
#[derive(Default)]
pub struct CoreMetrics {
    /// Long-lived connections open now (gauge): upgraded WebSockets and SSE streams.
    pub connections: AtomicI64,
    /// The SSE streams among [`CoreMetrics::connections`] (gauge); the rest are WebSockets.
    pub sse_connections: AtomicI64,
    /// TCP connections accepted (counter).
    pub accepted: AtomicU64,
    /// WebSocket connections upgraded (counter).
    pub upgraded: AtomicU64,
    reaped: [AtomicU64; ReapReason::ALL.len()],
    /// What the sessions count themselves: closes by code, handshake timeouts, overflows,
    /// limit refusals, pings, the drain's remaining closes.
    pub session: SessionStats,
    /// Messages published on channels whose home is this core (dedup hits excluded).
    pub published: AtomicU64,
    /// Publishes answered from the dedup window instead of being published again.
    pub publish_duplicates: AtomicU64,
    /// Feed publishes refused as `fenced` (a stale fencing token, docs/feeds.md): memory
    /// broker on the channel's home core, Redis broker on the core that asked.
    pub feed_fenced: AtomicU64,
    /// Frames queued to subscribers on this core (one per subscriber per message).
    pub delivered: AtomicU64,
    /// HTTP requests served (non-upgrade).
    pub http_requests: AtomicU64,
    /// HTTP API requests refused with 401, by [`Guarded`](super::http::auth::Guarded).
    pub http_auth_failures: [AtomicU64; super::http::auth::GUARDED_NAMES.len()],
    /// Messages waiting in spill lists because a cross-core queue was full (gauge).
    pub bus_spilled: AtomicI64,
    /// Distinct token grants interned on this core (gauge; docs/security.md): connections
    /// with the same claims share one.
    pub auth_grants: AtomicI64,
    /// Presence members tracked by the channels homed on this core (gauge).
    pub presence_members: AtomicI64,
    /// Subscribers of presence channels not tracked because the channel had
    /// `presence_max_members` members already (counter).
    pub presence_untracked: AtomicU64,
    /// Presence windows announced by the channels homed here: `[diffs, resets]` (counter).
    pub presence_frames: [AtomicU64; 2],
    /// TLS connections, handshakes and their failures (`tether_tls_*`, `server::tls`).
    pub tls: super::tls::TlsMetrics,
}

impl CoreMetrics {
    /// Counts one reaped connection.
    pub fn reaped(&self, why: ReapReason) {
        self.reaped[why as usize].fetch_add(1, Relaxed);
    }

    /// Connections reaped so far for `why` (`tether_reaped_total{reason}` of this core).
    pub fn reaped_count(&self, why: ReapReason) -> u64 {
        self.reaped[why as usize].load(Relaxed)
    }
}

/// Writes a Prometheus histogram (`_bucket{le=…}` cumulative, `_sum`, `_count`): `bounds` are
/// the buckets' upper bounds in the recorded unit (the last `u64::MAX`, written `+Inf`),
/// `counts[i]` the samples in bucket `i` (not cumulative), `sum` their total in the recorded
/// unit; `scale` divides bounds and sum on the way out (1e6 turns microseconds into seconds).
fn histogram(
    out: &mut String,
    name: &str,
    help: &str,
    bounds: &[u64],
    counts: impl Iterator<Item = u64>,
    sum: u64,
    scale: f64,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0u64;
    for (ub, n) in bounds.iter().zip(counts) {
        cumulative += n;
        if *ub == u64::MAX {
            let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        } else {
            let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", *ub as f64 / scale);
        }
    }
    let _ = writeln!(out, "{name}_sum {}\n{name}_count {cumulative}", sum as f64 / scale);
}

fn counter(out: &mut String, name: &str, kind: &str, help: &str, samples: impl Iterator<Item = (String, u64)>) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    }
}

/// Renders every core's counters in the Prometheus text exposition format (version 0.0.4).
pub fn render(cores: &[CoreMetrics], draining: bool) -> String {
    let mut out = String::with_capacity(8192);
    let per_core = |f: &dyn Fn(&CoreMetrics) -> u64| {
        cores.iter().enumerate().map(move |(i, m)| (format!("core=\"{i}\""), f(m))).collect::<Vec<_>>().into_iter()
    };
    counter(
        &mut out,
        "tether_connections",
        "gauge",
        "Open long-lived connections: upgraded WebSockets and SSE streams.",
        per_core(&|m| m.connections.load(Relaxed).max(0) as u64),
    );
    let by_transport = cores.iter().enumerate().flat_map(|(i, m)| {
        let (all, sse) = (m.connections.load(Relaxed).max(0), m.sse_connections.load(Relaxed).max(0));
        [
            (format!("core=\"{i}\",transport=\"websocket\""), (all - sse).max(0) as u64),
            (format!("core=\"{i}\",transport=\"sse\""), sse as u64),
        ]
    });
    counter(
        &mut out,
        "tether_connections_by_transport",
        "gauge",
        "Open long-lived connections by transport (websocket, sse); they sum to tether_connections.",
        by_transport,
    );
    counter(
        &mut out,
        "tether_deflate_connections",
        "gauge",
        "Open WebSocket connections that negotiated permessage-deflate.",
        per_core(&|m| m.session.deflate_connections.load(Relaxed).max(0) as u64),
    );
    let deflate = |label: &str, values: fn(&DeflateStats) -> [(&'static str, u64); 2]| {
        let label = label.to_owned();
        cores.iter().enumerate().flat_map(move |(i, m)| {
            let label = label.clone();
            values(&m.session.deflate).map(move |(k, v)| (format!("core=\"{i}\",{label}=\"{k}\""), v))
        })
    };
    counter(
        &mut out,
        "tether_deflate_messages_total",
        "counter",
        "Messages some subscriber took with permessage-deflate, once each: sent compressed, or plain (under min_bytes or not smaller).",
        deflate("result", |d| [("compressed", d.compressed.load(Relaxed)), ("plain", d.skipped.load(Relaxed))]),
    );
    counter(
        &mut out,
        "tether_deflate_bytes_total",
        "counter",
        "Frame bytes of the compressed messages, once each: as they would have gone plain, and as they went.",
        deflate("form", |d| [("plain", d.plain_bytes.load(Relaxed)), ("deflated", d.deflated_bytes.load(Relaxed))]),
    );
    counter(
        &mut out,
        "tether_accepted_total",
        "counter",
        "TCP connections accepted.",
        per_core(&|m| m.accepted.load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_upgraded_total",
        "counter",
        "WebSocket upgrades completed.",
        per_core(&|m| m.upgraded.load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_messages_published_total",
        "counter",
        "Messages published (sequenced) on channels homed here.",
        per_core(&|m| m.published.load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_publish_duplicates_total",
        "counter",
        "Publishes answered from the dedup window.",
        per_core(&|m| m.publish_duplicates.load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_feed_fenced_total",
        "counter",
        "Feed publishes refused because a higher fencing token was seen for the feed.",
        per_core(&|m| m.feed_fenced.load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_messages_delivered_total",
        "counter",
        "Frames queued to subscribers.",
        per_core(&|m| m.delivered.load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_pings_sent_total",
        "counter",
        "Heartbeat pings sent.",
        per_core(&|m| m.session.pings_sent.load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_http_requests_total",
        "counter",
        "Plain HTTP requests served.",
        per_core(&|m| m.http_requests.load(Relaxed)),
    );
    let auth_failures = cores.iter().enumerate().flat_map(|(c, m)| {
        super::http::auth::GUARDED_NAMES
            .iter()
            .enumerate()
            .map(move |(i, n)| (format!("core=\"{c}\",endpoint=\"{n}\""), m.http_auth_failures[i].load(Relaxed)))
    });
    counter(
        &mut out,
        "tether_http_auth_failures_total",
        "counter",
        "HTTP API requests refused with 401 (publish key or admin token).",
        auth_failures,
    );
    counter(
        &mut out,
        "tether_drain_remaining",
        "gauge",
        "Connections the drain still has to close.",
        per_core(&|m| m.session.drain_remaining.load(Relaxed).max(0) as u64),
    );
    counter(
        &mut out,
        "tether_auth_grants",
        "gauge",
        "Distinct JWT grants (user and channel globs) held by connections.",
        per_core(&|m| m.auth_grants.load(Relaxed).max(0) as u64),
    );
    counter(
        &mut out,
        "tether_presence_members",
        "gauge",
        "Presence members tracked by the channels homed on each core.",
        per_core(&|m| m.presence_members.load(Relaxed).max(0) as u64),
    );
    counter(
        &mut out,
        "tether_presence_untracked_total",
        "counter",
        "Subscribers of presence channels not tracked: the channel had presence_max_members members.",
        per_core(&|m| m.presence_untracked.load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_bus_spilled",
        "gauge",
        "Cross-core messages waiting for queue space.",
        per_core(&|m| m.bus_spilled.load(Relaxed).max(0) as u64),
    );
    let labelled = |names: &[&str], label: &str, pick: &dyn Fn(&CoreMetrics, usize) -> u64| {
        let mut v = Vec::new();
        for (c, m) in cores.iter().enumerate() {
            for (i, n) in names.iter().enumerate() {
                v.push((format!("core=\"{c}\",{label}=\"{n}\""), pick(m, i)));
            }
        }
        v.into_iter()
    };
    let mut codes: Vec<String> = CLOSE_CODES.iter().map(|c| c.to_string()).collect();
    codes.push("other".into());
    let codes: Vec<&str> = codes.iter().map(|s| s.as_str()).collect();
    counter(
        &mut out,
        "tether_closes_total",
        "counter",
        "WebSocket closes by close code (1006: ended without a close frame).",
        labelled(&codes, "code", &|m, i| m.session.closes[i].load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_handshake_failures_total",
        "counter",
        "Requests refused before or instead of an upgrade.",
        labelled(&FAILURE_NAMES, "reason", &|m, i| m.session.handshake_failures[i].load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_reaped_total",
        "counter",
        "Connections reaped, by reason.",
        labelled(&ReapReason::ALL.map(ReapReason::as_str), "reason", &|m, i| m.reaped[i].load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_overflow_total",
        "counter",
        "Outbound queue overflows, by policy.",
        labelled(&OVERFLOW_POLICIES, "policy", &|m, i| m.session.overflow[i].load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_limit_refusals_total",
        "counter",
        "Requests and control frames refused by an abuse limit, by limit.",
        labelled(&LIMIT_NAMES, "limit", &|m, i| m.session.limit_refusals[i].load(Relaxed)),
    );
    counter(
        &mut out,
        "tether_presence_windows_total",
        "counter",
        "Presence windows announced to join_leave subscribers, by kind (diff or reset).",
        labelled(&["diff", "reset"], "kind", &|m, i| m.presence_frames[i].load(Relaxed)),
    );
    histogram(
        &mut out,
        "tether_overflow_queue_bytes",
        "Outbound queue size at overflow.",
        &QUEUE_BUCKETS,
        (0..QUEUE_BUCKETS.len()).map(|b| cores.iter().map(|m| m.session.overflow_queue_bytes[b].load(Relaxed)).sum()),
        cores.iter().map(|m| m.session.overflow_queue_bytes_sum.load(Relaxed)).sum(),
        1.0,
    );
    let _ = writeln!(
        out,
        "# HELP tether_draining 1 while the server drains.\n# TYPE tether_draining gauge\ntether_draining {}",
        draining as u8
    );
    out
}

/// Appends the process-wide channel gauge `tether_channels` (channels held now, against
/// `limits.max_channels`) in the Prometheus text format.
pub fn render_channels(out: &mut String, channels: usize) {
    let _ = writeln!(
        out,
        "# HELP tether_channels Channels held by this process (limits.max_channels bounds it).\n# TYPE tether_channels gauge\ntether_channels {channels}"
    );
}

/// Upper bounds of `tether_broker_request_seconds`, in microseconds (the last is +Inf).
pub const BROKER_BUCKETS_US: [u64; 13] =
    [250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000, 2_500_000, u64::MAX];

/// Kinds of broker errors, the `kind` label of `tether_broker_errors_total`.
pub const BROKER_ERROR_KINDS: [&str; 4] = ["timeout", "connection", "script", "server"];

/// The broker's process-wide counters, written by the Redis broker thread (the memory broker
/// is always up and leaves the rest at zero).
pub struct BrokerMetrics {
    /// Whether publishes can be stored now (the Redis command link is up): `tether_broker_up`.
    pub up: std::sync::atomic::AtomicBool,
    /// Whether published messages reach this node's subscribers now (the Redis pub/sub link
    /// is up and has resubscribed every channel with local subscribers):
    /// `tether_broker_pubsub_up`. While it is down, `sub` is refused with `unavailable`.
    pub pubsub_up: std::sync::atomic::AtomicBool,
    /// Command or pub/sub links re-established after a loss.
    pub reconnects: AtomicU64,
    /// Errors by kind (index into [`BROKER_ERROR_KINDS`]).
    pub errors: [AtomicU64; 4],
    /// Gaps in a channel's pub/sub stream filled from its history.
    pub gap_repairs: AtomicU64,
    /// Publish script calls that Redis ran past their deadline, storing nothing
    /// (`tether_broker_late_calls_total`; their publishes were answered `unavailable`).
    pub late: AtomicU64,
    /// Publishes answered `unknown_outcome` / HTTP 504: sent to Redis, no reply in time
    /// (`tether_broker_unknown_outcomes_total`).
    pub unknown: AtomicU64,
    /// Request latency histogram: counts per bucket of [`BROKER_BUCKETS_US`].
    pub request_buckets: [AtomicU64; 13],
    /// Sum of request latencies, in microseconds.
    pub request_sum_us: AtomicU64,
}

impl BrokerMetrics {
    /// Counters for a broker that is up (`up = true`) or not yet connected.
    pub fn new(up: bool) -> BrokerMetrics {
        BrokerMetrics {
            up: std::sync::atomic::AtomicBool::new(up),
            pubsub_up: std::sync::atomic::AtomicBool::new(up),
            reconnects: AtomicU64::new(0),
            errors: Default::default(),
            gap_repairs: AtomicU64::new(0),
            late: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
            request_buckets: Default::default(),
            request_sum_us: AtomicU64::new(0),
        }
    }

    /// Records one request (a pipeline or a script call) that took `d`.
    pub fn request(&self, d: std::time::Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let b = BROKER_BUCKETS_US.iter().position(|ub| us <= *ub).unwrap_or(BROKER_BUCKETS_US.len() - 1);
        self.request_buckets[b].fetch_add(1, Relaxed);
        self.request_sum_us.fetch_add(us, Relaxed);
    }

    /// Counts one error of `kind` (index into [`BROKER_ERROR_KINDS`]).
    pub fn error(&self, kind: usize) {
        self.errors[kind.min(BROKER_ERROR_KINDS.len() - 1)].fetch_add(1, Relaxed);
    }

    /// Whether the node is ready as far as the broker goes (`/readyz`): it can store publishes
    /// and deliver them to its subscribers.
    pub fn ready(&self) -> bool {
        self.up.load(Relaxed) && self.pubsub_up.load(Relaxed)
    }

    /// Appends the broker metrics in the Prometheus text format; `kind` is `memory` or
    /// `redis` (the `kind` label of `tether_broker_up`).
    pub fn render_into(&self, out: &mut String, kind: &str) {
        let up = self.up.load(Relaxed) as u64;
        counter(
            out,
            "tether_broker_up",
            "gauge",
            "1 while the broker stores publishes.",
            [(format!("kind=\"{kind}\""), up)].into_iter(),
        );
        counter(
            out,
            "tether_broker_pubsub_up",
            "gauge",
            "1 while published messages reach this node's subscribers.",
            [(format!("kind=\"{kind}\""), self.pubsub_up.load(Relaxed) as u64)].into_iter(),
        );
        let one = |out: &mut String, name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        one(
            out,
            "tether_broker_reconnects_total",
            "counter",
            "Broker links re-established after a loss.",
            self.reconnects.load(Relaxed),
        );
        one(
            out,
            "tether_broker_gap_repairs_total",
            "counter",
            "Gaps in a channel's pub/sub stream filled from its history.",
            self.gap_repairs.load(Relaxed),
        );
        one(
            out,
            "tether_broker_late_calls_total",
            "counter",
            "Publish script calls Redis ran past their deadline (nothing stored).",
            self.late.load(Relaxed),
        );
        one(
            out,
            "tether_broker_unknown_outcomes_total",
            "counter",
            "Publishes answered unknown_outcome (HTTP 504): sent to Redis, no reply in time.",
            self.unknown.load(Relaxed),
        );
        counter(
            out,
            "tether_broker_errors_total",
            "counter",
            "Broker request errors, by kind.",
            BROKER_ERROR_KINDS.iter().enumerate().map(|(i, k)| (format!("kind=\"{k}\""), self.errors[i].load(Relaxed))),
        );
        histogram(
            out,
            "tether_broker_request_seconds",
            "Latency of broker requests (pipelines, scripts, reads).",
            &BROKER_BUCKETS_US,
            self.request_buckets.iter().map(|b| b.load(Relaxed)),
            self.request_sum_us.load(Relaxed),
            1e6,
        );
    }
}
