//! `tether load idle --latency-from-data`: broadcast latency measured by the idle subscribers
//! themselves (the one-million-connections bench, docs/operations.md).
//!
//! The publisher puts its send time in the message: `data` = `{"t": UNIX_NS}` (the shape
//! `tether load fanout` stamps with). Every held connection that receives a `msg` records
//! `receive time − t` into its thread's histogram for that message's `seq`; one histogram per
//! seq per thread, so an idle connection pays nothing but a pointer. Publisher and
//! subscribers share one clock (same host), so there is no skew to correct.
//!
//! Report fields (added to the idle report when the option is on):
//! - `broadcast_received`: receptions counted over all seqs;
//! - `broadcasts`: `{"SEQ": {"received": N, "p50_ms", "p99_ms", "max_ms"}, …}` per seq;
//! - `broadcast_hist`: `{"SEQ": [[latency_us, count], …]}`, the lossless histograms from which
//!   a `--procs` parent (or a bench holding several load processes) merges the figures of its
//!   children exactly: percentiles cannot be averaged, histograms can be added.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::report::{Latency, Report};
use super::wire::{scan_str, scan_u64};

/// Latency histograms by broadcast seq.
#[derive(Default)]
pub struct Broadcasts(pub BTreeMap<u64, Latency>);

impl Broadcasts {
    /// Records one received frame if it is a `msg` whose `data` carries `"t"` (publish time,
    /// Unix ns); `now_ns` is the receive time (Unix ns). Anything else is ignored.
    pub fn record(&mut self, message: &[u8], now_ns: u64) {
        if scan_str(message, "op") != Some(&b"msg"[..]) {
            return;
        }
        let (Some(seq), Some(sent_ns)) = (scan_u64(message, "seq"), scan_u64(message, "t")) else { return };
        self.0.entry(seq).or_default().record_us(now_ns.saturating_sub(sent_ns) / 1000);
    }

    /// Adds every sample of `other`, seq by seq.
    pub fn merge(&mut self, other: &Broadcasts) {
        for (seq, latency) in &other.0 {
            self.0.entry(*seq).or_default().merge(latency);
        }
    }

    /// Receptions over all seqs.
    pub fn received(&self) -> u64 {
        self.0.values().map(Latency::count).sum()
    }

    /// Sets `broadcast_received`, `broadcasts` and `broadcast_hist` on `report`.
    pub fn fill(&self, report: &mut Report) {
        let mut summary = Map::new();
        let mut hist = Map::new();
        for (seq, latency) in &self.0 {
            summary.insert(
                seq.to_string(),
                json!({
                    "received": latency.count(),
                    "p50_ms": latency.quantile_ms(0.5),
                    "p99_ms": latency.quantile_ms(0.99),
                    "max_ms": latency.max_ms(),
                }),
            );
            hist.insert(seq.to_string(), latency.to_pairs());
        }
        report
            .set("broadcast_received", self.received())
            .set("broadcasts", Value::Object(summary))
            .set("broadcast_hist", Value::Object(hist));
    }

    /// Reads the `broadcast_hist` field of a report (a child's, or a whole load process's).
    /// A report without the field holds no broadcasts. Errors name the bad seq.
    pub fn from_report(report: &Value) -> Result<Broadcasts, String> {
        let mut out = Broadcasts::default();
        let Some(hist) = report.get("broadcast_hist") else { return Ok(out) };
        let hist = hist.as_object().ok_or("broadcast_hist: expected an object of seq → pairs")?;
        for (seq, pairs) in hist {
            let seq: u64 = seq.parse().map_err(|_| format!("broadcast_hist: seq {seq:?} is not an integer"))?;
            let latency = Latency::from_pairs(pairs).map_err(|e| format!("broadcast_hist seq {seq}: {e}"))?;
            out.0.entry(seq).or_default().merge(&latency);
        }
        Ok(out)
    }
}
