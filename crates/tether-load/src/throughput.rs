//! `tether load publish`: publish throughput. P publisher connections each keep W `pub`s (each
//! with its own id) unacknowledged at all times for D: W = 1 sends one publish and waits for
//! its ack before the next; a larger W pipelines, sending the next publish as each ack comes
//! back. Nobody subscribes: this measures the store path (seq, history, dedup, and with Redis
//! the script and its `PUBLISH`), not fan-out.
//!
//! All publishers start together once every connection is open. Only acks that arrive within
//! D count towards `publishes_per_s`; after D nothing new is sent and the acks still
//! outstanding are awaited for up to `--grace`.
//!
//! Report: `scenario`, `publishers`, `connected`, `window`, `channels`, `size`, `duration_s`,
//! `sent`, `acked`, `publishes_per_s`, `p50_ms`, `p90_ms`, `p99_ms`, `max_ms` (publish to ack),
//! `refused` (`error` answers), `unacked` (no answer within the grace), `errors`,
//! `error_kinds`, `start_ns`, `end_ns` (the counted interval, ns since the UNIX epoch, so a
//! caller can line up CPU samples with it).

use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};

use super::args::{PublishArgs, WsUrl};
use super::idle::STEP_TIMEOUT;
use super::publish::stamp;
use super::report::{round3, Errors, Latency, Report};
use super::wire::{scan_str, WsConn};
use super::{now_ns, run_id, run_split, share, thread_count, wait_until};
use tether_proto::ws::codec::encode_client_frame;

/// State shared by the controller and the worker threads.
struct Shared {
    ready: AtomicUsize,
    failed: AtomicUsize,
    /// When publishing starts (`None` until every publisher is connected).
    start: watch::Sender<Option<Instant>>,
}

/// One worker thread's results.
#[derive(Default)]
struct Tally {
    latency: Latency,
    sent: u64,
    /// Acks that arrived within the counted interval.
    acked_in_time: u64,
    acked: u64,
    refused: u64,
    unacked: u64,
    disconnected: u64,
    errors: Errors,
}

/// Runs the scenario; see the module docs for the report.
pub fn run(args: PublishArgs) -> Result<Report, String> {
    if args.publishers == 0 || args.window == 0 {
        return Err("--publishers and --window must be at least 1".into());
    }
    let url = args.common.url(&args.url)?;
    let threads = thread_count(args.common.threads);
    let run = run_id();
    let k = args.channels.max(1);
    let permits = (args.common.concurrency / threads).max(1);
    let (start, _) = watch::channel(None);
    let shared = Arc::new(Shared { ready: AtomicUsize::new(0), failed: AtomicUsize::new(0), start });

    let worker = |t: usize| {
        let (shared, url, run) = (shared.clone(), url.clone(), run.clone());
        let (sources, args) = (args.common.sources.clone(), args.clone());
        async move {
            let tally = Rc::new(RefCell::new(Tally::default()));
            let gate = Arc::new(Semaphore::new(permits));
            let mut tasks = Vec::new();
            for j in share(args.publishers, 0, 1, t, threads) {
                let Ok(permit) = gate.clone().acquire_owned().await else { break };
                let p = Publisher {
                    url: url.clone(),
                    source: sources.as_ref().map(|s| s.pick(j)),
                    ch: format!("load.publish.{run}.{}", j % k),
                    id_prefix: format!("{run}-{j}-"),
                    window: args.window,
                    size: args.size,
                    duration: args.duration,
                    grace: args.grace,
                };
                tasks.push(tokio::task::spawn_local(p.run(permit, tally.clone(), shared.clone())));
            }
            for task in tasks {
                // A panicking task is a bug in this module; its publishes are simply not counted.
                let _ = task.await;
            }
            Rc::try_unwrap(tally).map(RefCell::into_inner).unwrap_or_default()
        }
    };

    let controller = || {
        let shared = shared.clone();
        let n = args.publishers;
        async move {
            // Every attempt ends by itself within STEP_TIMEOUT.
            let all_in = || shared.ready.load(Ordering::Relaxed) + shared.failed.load(Ordering::Relaxed) >= n;
            wait_until(Duration::MAX, all_in).await;
            let start_ns = now_ns();
            // Nobody listening only means every publisher already failed.
            let _ = shared.start.send(Some(Instant::now()));
            start_ns
        }
    };

    let (tallies, start_ns) = run_split(threads, worker, controller)?;
    let mut total = Tally::default();
    for t in &tallies {
        total.latency.merge(&t.latency);
        total.sent += t.sent;
        total.acked_in_time += t.acked_in_time;
        total.acked += t.acked;
        total.refused += t.refused;
        total.unacked += t.unacked;
        total.disconnected += t.disconnected;
        total.errors.merge(&t.errors);
    }
    let connected = shared.ready.load(Ordering::Relaxed);
    if connected == 0 {
        return Err(format!("no publisher could connect to {} ({:?})", args.url, total.errors.0));
    }
    let failed = shared.failed.load(Ordering::Relaxed) as u64;
    let errors = failed + total.disconnected + total.refused + total.unacked;
    let secs = args.duration.as_secs_f64();
    let mut r = Report::new("publish");
    r.set("publishers", args.publishers)
        .set("connected", connected)
        .set("window", args.window)
        .set("channels", k)
        .set("size", args.size)
        .set("duration_s", round3(secs))
        .set("sent", total.sent)
        .set("acked", total.acked)
        .set("publishes_per_s", (total.acked_in_time as f64 / secs.max(1e-9)).round() as u64)
        .set("p50_ms", total.latency.quantile_ms(0.5))
        .set("p90_ms", total.latency.quantile_ms(0.9))
        .set("p99_ms", total.latency.quantile_ms(0.99))
        .set("max_ms", total.latency.max_ms())
        .set("refused", total.refused)
        .set("unacked", total.unacked)
        .set("errors", errors)
        .set("error_kinds", total.errors.to_json())
        .set("start_ns", start_ns)
        .set("end_ns", start_ns + args.duration.as_nanos() as u64);
    r.ok = errors == 0;
    Ok(r)
}

/// One publisher connection.
struct Publisher {
    url: WsUrl,
    source: Option<IpAddr>,
    ch: String,
    /// Publish ids are `{id_prefix}{k}`, k = 1, 2, … on this connection.
    id_prefix: String,
    window: usize,
    size: usize,
    duration: Duration,
    grace: Duration,
}

impl Publisher {
    async fn run(self, permit: tokio::sync::OwnedSemaphorePermit, tally: Rc<RefCell<Tally>>, shared: Arc<Shared>) {
        let opened = WsConn::connect_within(&self.url, self.source, STEP_TIMEOUT).await;
        drop(permit);
        let mut conn = match opened {
            Ok(c) => c,
            Err(e) => {
                shared.failed.fetch_add(1, Ordering::Relaxed);
                tally.borrow_mut().errors.add(e.kind());
                return;
            }
        };
        shared.ready.fetch_add(1, Ordering::Relaxed);
        let mut start = shared.start.subscribe();
        let Ok(at) = start.wait_for(Option::is_some).await.map(|s| *s) else { return };
        let Some(begin) = at else { return };
        let end = begin + self.duration;
        let give_up = end + self.grace;
        // Send time of publish k in slot k % window: at most `window` are unacknowledged, so
        // the slots of those in flight never collide.
        let mut sent_at = vec![Instant::now(); self.window];
        let (mut next, mut in_flight) = (1u64, 0usize);
        let mut batch = Vec::new();
        let failure = loop {
            let now = Instant::now();
            if now < end && in_flight < self.window {
                batch.clear();
                while in_flight < self.window {
                    let text = format!(
                        "{{\"op\":\"pub\",\"ch\":\"{}\",\"id\":\"{}{next}\",\"data\":{}}}",
                        self.ch,
                        self.id_prefix,
                        stamp(next, self.size)
                    );
                    batch.extend_from_slice(&encode_client_frame(0x1, true, text.as_bytes(), rand::random()));
                    sent_at[next as usize % self.window] = now;
                    next += 1;
                    in_flight += 1;
                }
                if let Err(e) = conn.send_raw(&batch).await {
                    break Some(e);
                }
            } else if now >= end && in_flight == 0 {
                break None;
            }
            let limit = if now < end { end } else { give_up };
            // Counted here and added to the thread's tally after the await: a `RefCell` borrow
            // must not be held across it (the thread's other publishers use the tally too).
            let (mut acked, mut in_time, mut refused) = (0u64, 0u64, 0u64);
            let mut took_us = Vec::new();
            let received = tokio::time::timeout_at(
                limit.into(),
                conn.recv(|m| {
                    match scan_str(m, "op") {
                        Some(b"ack") => {
                            let at = Instant::now();
                            acked += 1;
                            in_time += u64::from(at <= end);
                            if let Some(k) = scan_str(m, "id").and_then(|id| counter(id, &self.id_prefix)) {
                                let took = at.saturating_duration_since(sent_at[k as usize % self.window]);
                                took_us.push(took.as_micros() as u64);
                            }
                        }
                        Some(b"error") => refused += 1,
                        _ => return,
                    }
                    in_flight = in_flight.saturating_sub(1);
                }),
            )
            .await;
            {
                let mut t = tally.borrow_mut();
                t.acked += acked;
                t.acked_in_time += in_time;
                t.refused += refused;
                for us in took_us {
                    t.latency.record_us(us);
                }
            }
            match received {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => break Some(e),
                Err(_) if Instant::now() >= give_up => break None,
                Err(_) => {} // the counted interval ended: stop sending, await the rest
            }
        };
        let mut t = tally.borrow_mut();
        t.sent += next - 1;
        match failure {
            Some(e) => {
                t.disconnected += 1;
                t.errors.add(e.kind());
            }
            None => {
                t.unacked += in_flight as u64;
                conn.reset();
            }
        }
    }
}

/// The counter k of a publish id `{prefix}{k}` of ours.
fn counter(id: &[u8], prefix: &str) -> Option<u64> {
    std::str::from_utf8(id.strip_prefix(prefix.as_bytes())?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::counter;

    #[test]
    fn counter_reads_our_ids_only() {
        assert_eq!(counter(b"0a1b2c3d-7-42", "0a1b2c3d-7-"), Some(42));
        assert_eq!(counter(b"0a1b2c3d-17-42", "0a1b2c3d-7-"), None);
        assert_eq!(counter(b"0a1b2c3d-7-x", "0a1b2c3d-7-"), None);
    }
}
