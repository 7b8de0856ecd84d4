//! The feed runtime's metrics (docs/operations.md): process-wide counters and, per feed this
//! node owns or owned, its upstream progress (also the live fields of `GET /feeds/{id}`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

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
}

impl FeedMetrics {
    /// The progress of feed `id`, created on first use (kept while the process lives, so the
    /// reconnect counter only grows; feeds are few).
    pub fn progress(&self, id: &str) -> Arc<FeedProgress> {
        let mut map = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(id.to_owned()).or_default().clone()
    }

    /// The progress of feed `id` if this node ever owned it.
    pub fn find(&self, id: &str) -> Option<Arc<FeedProgress>> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    /// Appends the `tether_feed*` metrics in the Prometheus text format at `now_ms` (Unix ms):
    /// `tether_feeds_owned`, `tether_feed_lease_renew_failures_total`,
    /// `tether_feed_takeovers_total`, `tether_feed_upstream_reconnects_total{feed}` (feeds this
    /// node ever owned) and `tether_feed_lag_seconds{feed}` (feeds it owns now).
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
    }
}
