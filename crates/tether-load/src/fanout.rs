//! `tether load fanout`: N subscribers on K channels while one publisher sends M stamped
//! messages per second of S bytes; publish-to-receive latency, deliveries/s, loss, reordering.
//!
//! Subscribers are spread round-robin over the given URLs (several nodes of a multi-node
//! broker); the publisher connects to `--publish-url`, by default the first URL.
//!
//! Every message's `data` carries its send time (`"t"`, ns since the UNIX epoch) and a counter
//! (`"k"`); publisher and subscribers share the host clock. A subscriber records
//! `receive − t` in its thread's histogram (µs) and feeds the message's `seq` to a
//! [`SeqTracker`]. After the last publish the controller learns each channel's final seq from
//! the acks, waits (up to `--grace`) until every expected delivery arrived, then stops the
//! subscribers, which count what they never got as lost.
//!
//! Raw mode (`--raw TEXT`) drives any RFC 6455 server: each subscriber sends TEXT (when not
//! empty) as a text frame, then counts every data message; latency comes from a `"t":NS` in the
//! payload, order from `"k":N` (no final seq, so only gaps count as lost). With `--rate` > 0 an
//! extra connection sends the stamped payloads as text frames (a broadcast server relays them).
//!
//! `--non-readers N` adds N slow consumers on the same channels that never read
//! ([`super::nonreader`]); they stay out of every figure above and get fields of their own.
//!
//! Report: `scenario`, `subs`, `subscribed`, `channels`, `rate`, `size`, `duration_s`,
//! `published`, `publish_errors`, `deliveries`, `expected`, `deliveries_per_s`, `p50_ms`,
//! `p90_ms`, `p99_ms`, `p999_ms`, `max_ms`, `lost`, `reordered`, `duplicates`, `disconnected`,
//! `errors`, `error_kinds`, `start_ns` and `end_ns` (the interval `deliveries_per_s` is
//! counted over: first publish to last delivery, ns since the UNIX epoch, so a caller can line
//! up CPU samples with it), `payload`, `deflate` (whether it was offered), `deflate_agreed`
//! (subscribers that negotiated it), `wire_bytes` (what the subscribers received after
//! subscribing: WebSocket frame bytes of data messages, headers included, or the event
//! stream's bytes), `message_bytes` (the messages' JSON, after inflation),
//! `wire_bytes_per_delivery`, then (with `--non-readers`) the non-reader fields.

use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};

use super::args::{FanoutArgs, PublishVia, WsUrl};
use super::idle::STEP_TIMEOUT;
use super::nonreader::{self, NonReaderTally};
use super::publish::{self, Mode};
use super::report::{round3, Errors, Latency, Report};
use super::seq::{SeqTally, SeqTracker};
use super::sse::{SseConn, SubConn};
use super::wire::{scan_str, scan_u64, ConnError, SynOpts, WsConn};
use super::{now_ns, run_id, run_split, thread_count, wait_until};

/// State shared by the controller and the worker threads.
pub(super) struct Shared {
    ready: AtomicUsize,
    failed: AtomicUsize,
    /// Non-readers subscribed / failed to.
    pub(super) nr_ready: AtomicUsize,
    pub(super) nr_failed: AtomicUsize,
    /// Sum of the subscribe-time heads (expected deliveries = Σ final − Σ head).
    head_sum: AtomicU64,
    delivered: AtomicU64,
    /// Final seq per channel index, set once publishing is over (tether mode only).
    pub(super) finals: OnceLock<Vec<u64>>,
    pub(super) stop: watch::Sender<bool>,
}

/// One worker thread's results.
#[derive(Default)]
struct Tally {
    latency: Latency,
    seqs: SeqTally,
    deliveries: u64,
    last_recv_ns: u64,
    disconnected: u64,
    errors: Errors,
    non_readers: NonReaderTally,
    deflate_agreed: u64,
    wire_bytes: u64,
    message_bytes: u64,
}

/// Runs the scenario; see the module docs for the report.
pub fn run(args: FanoutArgs) -> Result<Report, String> {
    if args.subs == 0 || args.rate.is_nan() || args.rate < 0.0 {
        return Err("--subs must be at least 1 and --rate not negative".into());
    }
    if args.raw.is_none() && args.rate <= 0.0 {
        return Err("--rate must be above 0 (except in --raw mode)".into());
    }
    if args.sse && (args.raw.is_some() || args.non_readers > 0) {
        return Err("--sse subscribes to tether's GET /sse: not with --raw or --non-readers".into());
    }
    if args.sse && args.deflate {
        return Err("--deflate is a WebSocket extension: not with --sse".into());
    }
    if args.raw.is_some() && args.non_readers > 0 {
        return Err("--non-readers needs tether mode (not --raw)".into());
    }
    let urls: Vec<WsUrl> = args.urls.iter().map(|u| args.common.url(u)).collect::<Result<_, _>>()?;
    let publish_url = match (&args.publish_url, urls.first()) {
        (Some(u), _) => args.common.url(u)?,
        (None, Some(first)) => first.clone(),
        (None, None) => return Err("no server URL given".into()),
    };
    let raw = args.raw.clone();
    let threads = thread_count(args.common.threads);
    let k = args.channels.max(1);
    let run = run_id();
    let channels: Vec<String> = (0..k).map(|i| format!("load.fanout.{run}.{i}")).collect();
    let permits = (args.common.concurrency / threads).max(1);
    let (stop, _) = watch::channel(false);
    let shared = Arc::new(Shared {
        ready: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        nr_ready: AtomicUsize::new(0),
        nr_failed: AtomicUsize::new(0),
        head_sum: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        finals: OnceLock::new(),
        stop,
    });

    let worker = |t: usize| {
        let (shared, urls, raw, channels) = (shared.clone(), urls.clone(), raw.clone(), channels.clone());
        let sources = args.common.sources.clone();
        async move {
            let tally = Rc::new(RefCell::new(Tally::default()));
            let gate = Arc::new(Semaphore::new(permits));
            let mut tasks = Vec::new();
            for index in super::share(args.subs, 0, 1, t, threads) {
                let Ok(permit) = gate.clone().acquire_owned().await else { break };
                let ch = index % channels.len();
                let hello = match &raw {
                    Some(text) => text.clone().into_bytes(),
                    None => format!("{{\"op\":\"sub\",\"ch\":\"{}\"}}", channels[ch]).into_bytes(),
                };
                let source = sources.as_ref().map(|s| s.pick(index));
                let url = urls[index % urls.len()].clone();
                let sse = args.sse.then(|| channels[ch].clone());
                let (raw, deflate, syn) = (raw.is_some(), args.deflate, SynOpts::default());
                let sub = Subscriber { url, source, hello, ch, raw, sse, deflate, syn };
                let (tally, shared) = (tally.clone(), shared.clone());
                tasks.push(tokio::task::spawn_local(sub.run(permit, tally, shared)));
            }
            let slow = Rc::new(RefCell::new(NonReaderTally::default()));
            for j in super::share(args.non_readers, 0, 1, t, threads) {
                let Ok(permit) = gate.clone().acquire_owned().await else { break };
                let ch = j % channels.len();
                let hello = format!("{{\"op\":\"sub\",\"ch\":\"{}\"}}", channels[ch]).into_bytes();
                // Indices after the readers', so the source addresses keep rotating.
                let source = sources.as_ref().map(|s| s.pick(args.subs + j));
                let syn = SynOpts {
                    rcvbuf: Some(args.non_reader_rcvbuf),
                    mss: (args.non_reader_mss > 0).then_some(args.non_reader_mss),
                };
                let url = urls[j % urls.len()].clone();
                let sub = Subscriber { url, source, hello, ch, raw: false, sse: None, deflate: false, syn };
                tasks.push(tokio::task::spawn_local(nonreader::run(sub, permit, slow.clone(), shared.clone())));
            }
            for task in tasks {
                let _ = task.await;
            }
            let mut out = Rc::try_unwrap(tally).map(RefCell::into_inner).unwrap_or_default();
            out.non_readers = Rc::try_unwrap(slow).map(RefCell::into_inner).unwrap_or_default();
            out
        }
    };

    let controller = || {
        let (shared, channels) = (shared.clone(), channels.clone());
        let (args, url) = (args.clone(), publish_url.clone());
        async move { control(args, url, channels, shared).await }
    };

    let (tallies, controlled) = run_split(threads, worker, controller)?;
    let c = controlled?;
    let mut total = Tally::default();
    for t in &tallies {
        total.latency.merge(&t.latency);
        total.seqs.add(&t.seqs);
        total.deliveries += t.deliveries;
        total.last_recv_ns = total.last_recv_ns.max(t.last_recv_ns);
        total.disconnected += t.disconnected;
        total.errors.merge(&t.errors);
        total.non_readers.merge(&t.non_readers);
        total.deflate_agreed += t.deflate_agreed;
        total.wire_bytes += t.wire_bytes;
        total.message_bytes += t.message_bytes;
    }
    // Deliveries/s are counted from the first publish to the last delivery.
    let end_ns = if args.rate > 0.0 && total.last_recv_ns > c.start_ns {
        total.last_recv_ns
    } else {
        c.start_ns + args.duration.as_nanos() as u64
    };
    let window_s = (end_ns - c.start_ns) as f64 / 1e9;
    // A non-reader that could not even subscribe makes the run measure something else.
    let failed = (shared.failed.load(Ordering::Relaxed) + shared.nr_failed.load(Ordering::Relaxed)) as u64;
    let errors = failed + total.disconnected + c.publish_errors;
    let mut r = Report::new("fanout");
    r.set("subs", args.subs)
        .set("subscribed", shared.ready.load(Ordering::Relaxed))
        .set("channels", k)
        .set("rate", args.rate)
        .set("size", args.size)
        .set("duration_s", round3(args.duration.as_secs_f64()))
        .set("published", c.published)
        .set("publish_errors", c.publish_errors)
        .set("deliveries", total.deliveries)
        .set("expected", c.expected)
        .set("deliveries_per_s", (total.deliveries as f64 / window_s.max(1e-9)).round() as u64)
        .set("p50_ms", total.latency.quantile_ms(0.5))
        .set("p90_ms", total.latency.quantile_ms(0.9))
        .set("p99_ms", total.latency.quantile_ms(0.99))
        .set("p999_ms", total.latency.quantile_ms(0.999))
        .set("max_ms", total.latency.max_ms())
        .set("lost", total.seqs.lost)
        .set("reordered", total.seqs.reordered)
        .set("duplicates", total.seqs.duplicates)
        .set("disconnected", total.disconnected)
        .set("errors", errors)
        .set("error_kinds", total.errors.to_json())
        .set("start_ns", c.start_ns)
        .set("end_ns", end_ns)
        .set("payload", format!("{:?}", args.payload).to_lowercase())
        .set("deflate", args.deflate)
        .set("deflate_agreed", total.deflate_agreed)
        .set("wire_bytes", total.wire_bytes)
        .set("message_bytes", total.message_bytes)
        .set("wire_bytes_per_delivery", round3(total.wire_bytes as f64 / total.deliveries.max(1) as f64));
    if args.non_readers > 0 {
        total.non_readers.report(args.non_readers, &mut r);
    }
    r.ok = errors == 0;
    Ok(r)
}

/// What the controller learned.
struct Controlled {
    published: u64,
    publish_errors: u64,
    expected: u64,
    start_ns: u64,
}

/// Waits for the subscribers, publishes, waits for the deliveries, stops the subscribers.
async fn control(
    args: FanoutArgs,
    url: WsUrl,
    channels: Vec<String>,
    shared: Arc<Shared>,
) -> Result<Controlled, String> {
    let (subs, slow) = (args.subs, args.non_readers);
    let all_in = || {
        shared.ready.load(Ordering::Relaxed) + shared.failed.load(Ordering::Relaxed) >= subs
            && shared.nr_ready.load(Ordering::Relaxed) + shared.nr_failed.load(Ordering::Relaxed) >= slow
    };
    // Every attempt ends within 2 × STEP_TIMEOUT, so this only waits for slow, paced opens.
    wait_until(Duration::MAX, all_in).await;
    let result = publish_phase(&args, &url, &channels, &shared).await;
    // Nobody listening only means every subscriber already ended.
    let _ = shared.stop.send(true);
    result
}

async fn publish_phase(
    args: &FanoutArgs,
    url: &WsUrl,
    channels: &[String],
    shared: &Shared,
) -> Result<Controlled, String> {
    let ready = shared.ready.load(Ordering::Relaxed) as u64;
    let raw = args.raw.is_some();
    if raw && args.rate <= 0.0 {
        // Nothing of ours to publish: just watch what the server sends for the duration.
        let start_ns = now_ns();
        tokio::time::sleep(args.duration).await;
        return Ok(Controlled { published: 0, publish_errors: 0, expected: 0, start_ns });
    }
    let total = (args.rate * args.duration.as_secs_f64()).round().max(1.0) as u64;
    let mode = match (raw, args.publish) {
        (true, _) => Mode::Raw,
        (false, PublishVia::Ws) => Mode::Ws,
        (false, PublishVia::Http) => Mode::Http,
    };
    let shape = (args.payload, args.size);
    let out = publish::publish(url, mode, channels, args.rate, total, shape, args.grace).await?;
    let expected = if raw {
        0
    } else {
        // Subscriber i is on channel i % K, so channel c has ⌈(N − c) / K⌉ subscribers.
        let k = channels.len();
        let per_channel = |c: usize| (args.subs - c.min(args.subs)).div_ceil(k);
        let sum: u64 = out.final_seqs.iter().enumerate().map(|(c, &f)| f * per_channel(c) as u64).sum();
        let live = sum.saturating_sub(shared.head_sum.load(Ordering::Relaxed));
        // Only subscribers that got in can receive anything.
        if ready as usize == args.subs {
            live
        } else {
            live.min(ready * out.acked)
        }
    };
    // Set once, right here; a second set cannot happen.
    let _ = shared.finals.set(out.final_seqs.clone());
    if raw {
        // No final seq: wait until deliveries stop for 1 s (or the grace ends).
        let deadline = Instant::now() + args.grace;
        let mut seen = shared.delivered.load(Ordering::Relaxed);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(1).min(args.grace)).await;
            let now = shared.delivered.load(Ordering::Relaxed);
            if now == seen {
                break;
            }
            seen = now;
        }
    } else {
        wait_until(args.grace, || shared.delivered.load(Ordering::Relaxed) >= expected).await;
    }
    Ok(Controlled { published: out.sent, publish_errors: out.errors, expected, start_ns: out.start_ns })
}

/// One subscriber connection (a reader, or a non-reader driven by [`nonreader::run`]).
pub(super) struct Subscriber {
    url: WsUrl,
    source: Option<IpAddr>,
    /// First text frame: the `sub` op, or the raw TEXT (nothing sent when empty).
    hello: Vec<u8>,
    /// Channel index.
    pub(super) ch: usize,
    raw: bool,
    /// `Some(channel name)`: subscribe over Server-Sent Events (`--sse`).
    sse: Option<String>,
    /// Offer permessage-deflate (`--deflate`).
    deflate: bool,
    /// Socket options set before connect (non-readers: small window and MSS).
    syn: SynOpts,
}

impl Subscriber {
    async fn run(self, permit: tokio::sync::OwnedSemaphorePermit, tally: Rc<RefCell<Tally>>, shared: Arc<Shared>) {
        let opened = self.open().await;
        drop(permit);
        let (mut conn, head) = match opened {
            Ok(v) => v,
            Err(e) => {
                shared.failed.fetch_add(1, Ordering::Relaxed);
                tally.borrow_mut().errors.add(e.kind());
                return;
            }
        };
        shared.head_sum.fetch_add(head, Ordering::Relaxed);
        shared.ready.fetch_add(1, Ordering::Relaxed);
        // What the handshake and the `subscribed` answer brought stays out of the byte counts.
        let (wire_at_start, message_at_start) = conn.counters();
        if matches!(&conn, SubConn::Ws(c) if c.deflate()) {
            tally.borrow_mut().deflate_agreed += 1;
        }
        let mut seqs = SeqTracker::starting_after(head);
        let mut stop = shared.stop.subscribe();
        let raw = self.raw;
        let mut disconnected = None;
        loop {
            let mut count = 0u64;
            tokio::select! {
                r = conn.recv(|m| {
                    if !raw && scan_str(m, "op") != Some(b"msg") {
                        return;
                    }
                    let now = now_ns();
                    count += 1;
                    let mut t = tally.borrow_mut();
                    if let Some(sent) = scan_u64(m, "t") {
                        t.latency.record_us(now.saturating_sub(sent) / 1000);
                    }
                    t.last_recv_ns = t.last_recv_ns.max(now);
                    if let Some(seq) = scan_u64(m, if raw { "k" } else { "seq" }) {
                        seqs.observe(seq);
                    }
                }) => {
                    if let Err(e) = r {
                        disconnected = Some(e);
                    }
                }
                _ = stop.wait_for(|s| *s) => {}
            }
            if count > 0 {
                tally.borrow_mut().deliveries += count;
                shared.delivered.fetch_add(count, Ordering::Relaxed);
            }
            if disconnected.is_some() || *stop.borrow() {
                break;
            }
        }
        let mut t = tally.borrow_mut();
        let (wire, message) = conn.counters();
        t.wire_bytes += wire - wire_at_start;
        t.message_bytes += message - message_at_start;
        let final_seq = match (&disconnected, shared.finals.get()) {
            // A subscriber the server dropped is reported as disconnected, not as loss.
            (None, Some(finals)) if !raw => finals.get(self.ch).copied(),
            _ => None,
        };
        t.seqs.add(&seqs.tally(final_seq));
        if let Some(e) = disconnected {
            t.disconnected += 1;
            t.errors.add(e.kind());
        }
    }

    /// Connects, sends the hello (or, over SSE, asks for the channel) and (tether mode) waits
    /// for `subscribed`; returns the connection and the channel head at subscribe time.
    pub(super) async fn open(&self) -> Result<(SubConn, u64), ConnError> {
        let mut conn = match &self.sse {
            Some(ch) => SubConn::Sse(SseConn::connect(&self.url, self.source, ch, STEP_TIMEOUT).await?),
            None => {
                let mut c =
                    WsConn::connect_offering_within(&self.url, self.source, self.syn, self.deflate, STEP_TIMEOUT)
                        .await?;
                if !self.hello.is_empty() {
                    c.send_text(&self.hello).await?;
                }
                SubConn::Ws(c)
            }
        };
        if self.raw {
            return Ok((conn, 0));
        }
        let wait = async {
            loop {
                let mut head = None;
                let mut refused = false;
                conn.recv(|m| match scan_str(m, "op") {
                    Some(b"subscribed") => head = head.or(Some(scan_u64(m, "seq").unwrap_or(0))),
                    Some(b"error") => refused = true,
                    _ => {}
                })
                .await?;
                if refused {
                    return Err(ConnError::Protocol("server refused the subscription"));
                }
                if let Some(h) = head {
                    return Ok(h);
                }
            }
        };
        let head = tokio::time::timeout(STEP_TIMEOUT, wait).await.unwrap_or(Err(ConnError::Timeout))?;
        Ok((conn, head))
    }
}
