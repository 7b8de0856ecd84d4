//! The feed runtime's metrics (docs/operations.md): process-wide counters, the lease store's
//! request counters ([`StoreRequests`]) and, per feed this node owns or owned, its upstream
//! progress (also the live fields of `GET /feeds/{id}`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

/// The [`crate::feeds::LeaseStore`] method a store request was made for: the `op` label of
/// `tether_feed_store_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOp {
    /// `put`.
    Put,
    /// `get`.
    Get,
    /// `delete`.
    Delete,
    /// `acquire`.
    Acquire,
    /// `renew`.
    Renew,
    /// `renew_many`.
    RenewMany,
    /// `release`.
    Release,
    /// `get_many`.
    GetMany,
    /// `list`.
    List,
    /// `released` (opening the release notification subscription).
    Released,
}

impl StoreOp {
    /// Every op, in label order.
    pub const ALL: [StoreOp; 10] = [
        StoreOp::Acquire,
        StoreOp::Delete,
        StoreOp::Get,
        StoreOp::GetMany,
        StoreOp::List,
        StoreOp::Put,
        StoreOp::Release,
        StoreOp::Released,
        StoreOp::Renew,
        StoreOp::RenewMany,
    ];

    /// The label value: the method's name (`renew_many`, `get_many`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Put => "put",
            StoreOp::Get => "get",
            StoreOp::Delete => "delete",
            StoreOp::Acquire => "acquire",
            StoreOp::Renew => "renew",
            StoreOp::RenewMany => "renew_many",
            StoreOp::Release => "release",
            StoreOp::GetMany => "get_many",
            StoreOp::List => "list",
            StoreOp::Released => "released",
        }
    }
}

/// What a lease store asked of its server since it was opened: requests (round trips) per
/// [`StoreOp`], and lease items written. Each backend owns one and counts every round trip it
/// makes, whatever its outcome: one Lua script call or command on Redis (a `renew_many` chunk
/// of up to 500 leases is one), one SDK call on DynamoDB (a `TransactWriteItems` of up to 100
/// leases is one; the `GetItem` that confirms a missing feed is another), one call on the
/// memory store (it has no server: a call is its round trip).
#[derive(Debug, Default)]
pub struct StoreRequests {
    requests: [AtomicU64; StoreOp::ALL.len()],
    written: AtomicU64,
}

impl StoreRequests {
    /// Counts `n` requests made for `op`.
    pub fn add(&self, op: StoreOp, n: u64) {
        self.requests[op as usize].fetch_add(n, Relaxed);
    }

    /// Requests made for `op` so far.
    pub fn get(&self, op: StoreOp) -> u64 {
        self.requests[op as usize].load(Relaxed)
    }

    /// Requests made so far, all ops together.
    pub fn total(&self) -> u64 {
        self.requests.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Counts `n` feed items written (a successful `put`, `acquire`, `renew` or `release`
    /// writes one; `renew_many` one per lease renewed; `delete` one when the feed existed).
    pub fn wrote(&self, n: u64) {
        self.written.fetch_add(n, Relaxed);
    }

    /// Feed items written so far.
    pub fn items_written(&self) -> u64 {
        self.written.load(Relaxed)
    }

    /// Appends `tether_feed_store_requests_total{op}` (every op, 0 included) and
    /// `tether_feed_store_items_written_total` in the Prometheus text format.
    pub fn render_into(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP tether_feed_store_requests_total Requests (round trips) the feed runtime made to the lease store, \
             per lease store operation.\n# TYPE tether_feed_store_requests_total counter"
        );
        for op in StoreOp::ALL {
            let _ = writeln!(out, "tether_feed_store_requests_total{{op=\"{}\"}} {}", op.as_str(), self.get(op));
        }
        let _ = writeln!(
            out,
            "# HELP tether_feed_store_items_written_total Feed items the lease store wrote (leases acquired, renewed, \
             released; definitions put; feeds deleted).\n# TYPE tether_feed_store_items_written_total counter\n\
             tether_feed_store_items_written_total {}",
            self.items_written()
        );
    }
}

/// One feed's upstream progress on this node, written by its owner task.
#[derive(Debug, Default)]
pub struct FeedProgress {
    /// Whether this node holds the feed's lease now.
    pub owned: AtomicBool,
    /// Whether the upstream WebSocket is open now.
    pub connected: AtomicBool,
    /// When the last upstream message was published, Unix ms; at acquire, the acquire time.
    pub last_message_ms: AtomicU64,
    /// Upstream connections opened after the first one of each ownership.
    pub reconnects: AtomicU64,
    /// The upstream seq of the last message stored by the broker (text, as the upstream sent
    /// it), or the stored `last_seq` at acquire.
    pub last_seq: Mutex<Option<String>>,
}

impl FeedProgress {
    /// The last stored upstream seq.
    pub fn last_seq(&self) -> Option<String> {
        self.last_seq.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records `seq` as the last stored upstream seq.
    pub fn set_last_seq(&self, seq: Option<String>) {
        *self.last_seq.lock().unwrap_or_else(|p| p.into_inner()) = seq;
    }

    /// `now_ms` minus the time of the last upstream message (or of the acquire), in ms, while
    /// owned; `None` when not owned.
    pub fn lag_ms(&self, now_ms: u64) -> Option<u64> {
        self.owned.load(Relaxed).then(|| now_ms.saturating_sub(self.last_message_ms.load(Relaxed)))
    }
}

/// Process-wide feed counters (`Shared::feeds`).
#[derive(Debug, Default)]
pub struct FeedMetrics {
    /// Feeds whose lease this node holds (`tether_feeds_owned`).
    pub owned: AtomicU64,
    /// Renews that failed: store errors and lost leases (`tether_feed_lease_renew_failures_total`).
    pub renew_failures: AtomicU64,
    /// Acquires of a feed that had a previous owner (`tether_feed_takeovers_total`).
    pub takeovers: AtomicU64,
    progress: Mutex<BTreeMap<String, Arc<FeedProgress>>>,
    /// The counters of the lease store this node opened (set once, when the feeds thread
    /// opens it; the `tether_feed_store_*` metrics are absent before).
    store: OnceLock<Arc<StoreRequests>>,
}

impl FeedMetrics {
    /// The progress of feed `id`, created on first use (kept while the process lives, so the
    /// reconnect counter only grows; feeds are few).
    pub fn progress(&self, id: &str) -> Arc<FeedProgress> {
        let mut map = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(id.to_owned()).or_default().clone()
    }

    /// Shows `requests`, the counters of the lease store the feeds thread opened, in
    /// [`FeedMetrics::render_into`]; a second call is ignored (the store is opened once).
    pub fn set_store_requests(&self, requests: Arc<StoreRequests>) {
        let _ = self.store.set(requests);
    }

    /// The progress of feed `id` if this node ever owned it.
    pub fn find(&self, id: &str) -> Option<Arc<FeedProgress>> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    /// Appends the `tether_feed*` metrics in the Prometheus text format at `now_ms` (Unix ms):
    /// `tether_feeds_owned`, `tether_feed_lease_renew_failures_total`,
    /// `tether_feed_takeovers_total`, `tether_feed_upstream_reconnects_total{feed}` (feeds this
    /// node ever owned), `tether_feed_lag_seconds{feed}` (feeds it owns now) and, once the
    /// lease store is open, [`StoreRequests::render_into`]'s.
    pub fn render_into(&self, out: &mut String, now_ms: u64) {
        let one = |out: &mut String, name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        one(out, "tether_feeds_owned", "gauge", "Feeds whose lease this node holds.", self.owned.load(Relaxed));
        one(
            out,
            "tether_feed_lease_renew_failures_total",
            "counter",
            "Lease renews that failed (store error or lease lost).",
            self.renew_failures.load(Relaxed),
        );
        one(
            out,
            "tether_feed_takeovers_total",
            "counter",
            "Feed leases acquired from a previous owner.",
            self.takeovers.load(Relaxed),
        );
        let map = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(
            out,
            "# HELP tether_feed_upstream_reconnects_total Upstream connections reopened, per feed.\n\
             # TYPE tether_feed_upstream_reconnects_total counter"
        );
        for (id, p) in map.iter() {
            let _ =
                writeln!(out, "tether_feed_upstream_reconnects_total{{feed=\"{id}\"}} {}", p.reconnects.load(Relaxed));
        }
        let _ = writeln!(
            out,
            "# HELP tether_feed_lag_seconds Seconds since the owned feed's last upstream message was published \
             (since the acquire before the first).\n# TYPE tether_feed_lag_seconds gauge"
        );
        for (id, p) in map.iter() {
            if let Some(lag) = p.lag_ms(now_ms) {
                let _ = writeln!(out, "tether_feed_lag_seconds{{feed=\"{id}\"}} {}", lag as f64 / 1000.0);
            }
        }
        if let Some(store) = self.store.get() {
            store.render_into(out);
        }
    }
}
