//! Scenario reports: an ordered list of named values, printed as a table on stderr and as one
//! JSON object on one line of stdout; plus the latency histogram and error tallies they hold.

use std::collections::BTreeMap;
use std::io::Write;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// Highest latency the histograms hold, in microseconds (60 s); larger values are clamped.
const MAX_LATENCY_US: u64 = 60_000_000;

/// A latency histogram in microseconds (1 µs … 60 s, 3 significant digits).
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    /// An empty histogram.
    pub fn new() -> Self {
        // Bounds and precision are constants that `new_with_bounds` accepts.
        Latency(Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds"))
    }

    /// Records one latency in microseconds (0 counts as 1 µs; above 60 s as 60 s).
    pub fn record_us(&mut self, us: u64) {
        self.0.saturating_record(us.clamp(1, MAX_LATENCY_US));
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Latency) {
        // Same bounds on both sides, so `add` cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The value at quantile `q` (0..=1) in milliseconds, 0 when empty.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        round3(self.0.value_at_quantile(q) as f64 / 1000.0)
    }

    /// The samples as `[[value_us, count], …]`, one pair per distinct recorded value, in
    /// ascending value order: a lossless form of the histogram that travels in a JSON report
    /// (hdrhistogram's binary serializer is not built here) and that [`Latency::from_pairs`]
    /// reads back.
    pub fn to_pairs(&self) -> Value {
        let pairs: Vec<[u64; 2]> =
            self.0.iter_recorded().map(|v| [v.value_iterated_to(), v.count_at_value()]).collect();
        json!(pairs)
    }

    /// Reads [`Latency::to_pairs`] back. Errors name what is not a `[value_us, count]` pair of
    /// unsigned integers.
    pub fn from_pairs(pairs: &Value) -> Result<Latency, String> {
        let list = pairs.as_array().ok_or_else(|| format!("latency pairs: expected an array, got {pairs}"))?;
        let mut latency = Latency::new();
        for pair in list {
            let (Some(value), Some(count)) = (pair.get(0).and_then(Value::as_u64), pair.get(1).and_then(Value::as_u64))
            else {
                return Err(format!("latency pairs: {pair} is not [value_us, count]"));
            };
            latency.0.saturating_record_n(value.clamp(1, MAX_LATENCY_US), count);
        }
        Ok(latency)
    }

    /// The largest sample in milliseconds, 0 when empty.
    pub fn max_ms(&self) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        round3(self.0.max() as f64 / 1000.0)
    }
}

/// Rounds to 3 decimals (microsecond resolution for millisecond figures).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Error counts by [`super::wire::ConnError::kind`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Errors(pub BTreeMap<String, u64>);

impl Errors {
    /// Counts one error of `kind`.
    pub fn add(&mut self, kind: String) {
        *self.0.entry(kind).or_insert(0) += 1;
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Errors) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_insert(0) += v;
        }
    }

    /// Total over all kinds.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// `{"kind":count,…}`.
    pub fn to_json(&self) -> Value {
        json!(self.0)
    }
}

/// A scenario's result: ordered fields plus whether the run counts as a success (exit code).
#[derive(Debug, Clone)]
pub struct Report {
    /// `(name, value)` in display order; `scenario` first.
    pub fields: Vec<(String, Value)>,
    /// False when the run had errors (exit code 1).
    pub ok: bool,
}

impl Report {
    /// A report for `scenario` with no fields yet.
    pub fn new(scenario: &str) -> Self {
        Report { fields: vec![("scenario".into(), json!(scenario))], ok: true }
    }

    /// Appends (or replaces) field `name`.
    pub fn set(&mut self, name: &str, value: impl Into<Value>) -> &mut Self {
        let value = value.into();
        match self.fields.iter_mut().find(|(k, _)| k == name) {
            Some(slot) => slot.1 = value,
            None => self.fields.push((name.to_string(), value)),
        }
        self
    }

    /// Field `name`, if set.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// The fields as one JSON object on one line, in field order.
    pub fn to_json_line(&self) -> String {
        let mut out = String::from("{");
        for (i, (k, v)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&Value::from(k.as_str()).to_string());
            out.push(':');
            out.push_str(&v.to_string());
        }
        out.push('}');
        out
    }

    /// The table shown on stderr: one `name  value` row per field, except raw histograms
    /// (fields ending in `_hist`, for machines; the JSON line has them).
    pub fn to_table(&self) -> String {
        let shown = || self.fields.iter().filter(|(k, _)| !k.ends_with("_hist"));
        let width = shown().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in shown() {
            let shown = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            out.push_str(&format!("  {k:<width$}  {shown}\n"));
        }
        out
    }

    /// Prints the table to stderr (unless `quiet`) and the JSON line to stdout.
    pub fn emit(&self, quiet: bool) {
        if !quiet {
            eprint!("{}", self.to_table());
        }
        let mut stdout = std::io::stdout().lock();
        // Nothing useful is left to do if stdout is gone.
        let _ = writeln!(stdout, "{}", self.to_json_line());
        let _ = stdout.flush();
    }
}
