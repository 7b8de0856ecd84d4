//! `tether load idle`: open N connections at rate R, subscribe each to one of K channels,
//! hold them for T (answering the server's pings), report how many stayed up.
//!
//! Report: `scenario`, `connections` (open and subscribed at the end of the hold), `errors`
//! (`failed` + `dropped`), `opened`, `failed` (connect, handshake or subscribe failed),
//! `dropped` (closed by the peer during the hold), `connect_s` (time to attempt all), `held_s`,
//! `procs`, `error_kinds`, `deflate_agreed` (connections that negotiated permessage-deflate:
//! 0 without `--deflate`), `close_errors` and `close_error_kinds` (connections held to the end
//! whose close, after the hold, did not end with the server's close frame: EOF, reset, timeout;
//! not counted in `errors`); with `--latency-from-data`, the broadcast fields of
//! [`super::broadcast`].
//!
//! The end of the hold comes in two steps. At the stop every connection is first counted (held,
//! or dropped if the server's end was already readable), and only once all are counted does
//! the close begin: closing thousands of connections takes this process's CPU, and on a busy
//! box a connection not yet counted could otherwise wait past the server's pong timeout while
//! the others close, be reaped, and be miscounted as dropped during the hold (issue 31 item 6,
//! tests/load_idle_close_phase.rs).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::{watch, Semaphore};

use super::args::{IdleArgs, Sources, WsUrl};
use super::broadcast::Broadcasts;
use super::report::{round3, Errors, Report};
use super::wire::{scan_str, ConnError, SynOpts, WsConn};
use super::{now_ns, proc_slot, procs, run_split, share, thread_count, wait_until};

/// Deadline for TCP connect plus handshake, and separately for the `subscribed` answer.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Report fields in display order (after `scenario`).
const FIELDS: [&str; 12] = [
    "connections",
    "errors",
    "opened",
    "failed",
    "dropped",
    "connect_s",
    "held_s",
    "procs",
    "error_kinds",
    "deflate_agreed",
    "close_errors",
    "close_error_kinds",
];

/// Longest wait, after the stop, for every connection to be counted before the close begins
/// (a starved thread may take long to poll them all; past it, the stragglers close as they come).
const COUNT_TIMEOUT: Duration = Duration::from_secs(30);

/// State shared by the controller and the worker threads.
struct Shared {
    attempted: AtomicUsize,
    /// Connections opened and not yet counted (held to the stop, or dropped).
    uncounted: AtomicUsize,
    /// The end of the hold: each connection is counted.
    stop: watch::Sender<bool>,
    /// Every connection is counted: the closes begin.
    close: watch::Sender<bool>,
}

/// One worker thread's tally.
#[derive(Default)]
struct Tally {
    opened: u64,
    alive: u64,
    failed: u64,
    dropped: u64,
    deflate_agreed: u64,
    errors: Errors,
    /// Held connections whose close did not end with the server's close frame, by kind.
    close_errors: Errors,
    /// With `--latency-from-data`: this thread's broadcast latencies.
    broadcasts: Broadcasts,
}

/// Runs the scenario (or, with `--procs P > 1` in the parent, P children and their aggregate).
pub fn run(args: IdleArgs) -> Result<Report, String> {
    if args.conns == 0 {
        return Err("--conns must be at least 1".into());
    }
    if args.procs > 1 && args.common.child_of.is_none() {
        let (mut report, children) = procs::run_children_raw(args.procs, "idle", &FIELDS, &["connect_s", "held_s"])?;
        if args.latency_from_data {
            let mut all = Broadcasts::default();
            for (i, child) in children.iter().enumerate() {
                all.merge(&Broadcasts::from_report(child).map_err(|e| format!("child {i}: {e}"))?);
            }
            all.fill(&mut report);
        }
        return Ok(report);
    }
    let urls: Vec<WsUrl> = args.urls.iter().map(|u| args.common.url(u)).collect::<Result<_, _>>()?;
    let (proc_index, procs) = proc_slot(&args.common);
    let threads = thread_count(args.common.threads);
    let mine = share(args.conns, proc_index, procs, 0, 1).count();
    let channels = args.channels.max(1);
    let per_thread_rate = args.rate / (procs * threads) as f64;
    let permits = (args.common.concurrency / threads).max(1);
    let (stop, _) = watch::channel(false);
    let (close, _) = watch::channel(false);
    let shared = Arc::new(Shared { attempted: AtomicUsize::new(0), uncounted: AtomicUsize::new(0), stop, close });
    let started = Instant::now();
    let latency_from_data = args.latency_from_data;
    let deflate = args.deflate;

    let worker = |t: usize| {
        let shared = shared.clone();
        let urls = urls.clone();
        let sources = args.common.sources.clone();
        async move {
            let tally = Rc::new(RefCell::new(Tally::default()));
            // One histogram set per thread, shared by its connections (None: not measuring).
            let broadcasts = latency_from_data.then(|| Rc::new(RefCell::new(Broadcasts::default())));
            let gate = Arc::new(Semaphore::new(permits));
            let mut tasks = Vec::new();
            let begin = Instant::now();
            for (j, index) in share(args.conns, proc_index, procs, t, threads).enumerate() {
                if per_thread_rate > 0.0 {
                    tokio::time::sleep_until((begin + Duration::from_secs_f64(j as f64 / per_thread_rate)).into())
                        .await;
                }
                let Ok(permit) = gate.clone().acquire_owned().await else { break };
                let url = urls[index % urls.len()].clone();
                let source = sources.as_ref().map(|s: &Sources| s.pick(index));
                let channel = format!("load.idle.{}", index % channels);
                let (tally, shared, broadcasts) = (tally.clone(), shared.clone(), broadcasts.clone());
                tasks.push(tokio::task::spawn_local(async move {
                    let opened = open_and_subscribe(&url, source, &channel, deflate).await;
                    drop(permit);
                    if opened.is_ok() {
                        // Before `attempted`: the controller counts on it once all are attempted.
                        shared.uncounted.fetch_add(1, Ordering::Relaxed);
                    }
                    shared.attempted.fetch_add(1, Ordering::Relaxed);
                    let mut conn = match opened {
                        Ok(conn) => conn,
                        Err(e) => {
                            let mut t = tally.borrow_mut();
                            t.failed += 1;
                            t.errors.add(e.kind());
                            return;
                        }
                    };
                    {
                        let mut t = tally.borrow_mut();
                        t.opened += 1;
                        t.deflate_agreed += u64::from(conn.deflate());
                    }
                    let (mut stop, mut close) = (shared.stop.subscribe(), shared.close.subscribe());
                    // Biased to the socket: what had arrived when the stop came is still read
                    // (and timed) before the connection counts as held to the end.
                    let ended = tokio::select! {
                        biased;
                        r = hold(&mut conn, broadcasts.as_deref()) => Some(r),
                        _ = stop.wait_for(|s| *s) => None,
                    };
                    {
                        let mut t = tally.borrow_mut();
                        match &ended {
                            Some(e) => {
                                t.dropped += 1;
                                t.errors.add(e.kind());
                            }
                            None => t.alive += 1,
                        }
                    }
                    shared.uncounted.fetch_sub(1, Ordering::Relaxed);
                    if ended.is_some() {
                        return;
                    }
                    // Held to the end. Until every connection is counted, keep answering pings
                    // (and timing broadcasts); then close.
                    let before_close = tokio::select! {
                        biased;
                        r = hold(&mut conn, broadcasts.as_deref()) => Some(r),
                        _ = close.wait_for(|c| *c) => None,
                    };
                    let closed = match (before_close, broadcasts.as_deref()) {
                        (Some(e), _) => Err(e),
                        (None, Some(b)) => close_and_drain(&mut conn, b).await,
                        // Without timing, the close is the socket's (dropped below).
                        (None, None) => Ok(()),
                    };
                    if let Err(e) = closed {
                        tally.borrow_mut().close_errors.add(e.kind());
                    }
                }));
            }
            for task in tasks {
                // A panicking task is a bug in this module; its connection is simply not counted.
                let _ = task.await;
            }
            let mut tally = Rc::try_unwrap(tally).map(RefCell::into_inner).unwrap_or_default();
            if let Some(b) = broadcasts {
                tally.broadcasts.merge(&b.borrow());
            }
            tally
        }
    };

    let hold_for = args.hold;
    let controller = || {
        let shared = shared.clone();
        async move {
            // A SIGTERM while connecting ends the hold as soon as it begins.
            let end = hold_end(hold_for);
            // No deadline: every attempt ends by itself within 2 × STEP_TIMEOUT.
            wait_until(Duration::MAX, || shared.attempted.load(Ordering::Relaxed) >= mine).await;
            let connect_s = started.elapsed().as_secs_f64();
            let held = Instant::now();
            end.await;
            let held_s = held.elapsed().as_secs_f64();
            // Nobody listening only means every task already ended.
            let _ = shared.stop.send(true);
            wait_until(COUNT_TIMEOUT, || shared.uncounted.load(Ordering::Relaxed) == 0).await;
            let _ = shared.close.send(true);
            (connect_s, held_s)
        }
    };

    let (tallies, (connect_s, held_s)) = run_split(threads, worker, controller)?;
    let mut total = Tally::default();
    for t in &tallies {
        total.opened += t.opened;
        total.alive += t.alive;
        total.failed += t.failed;
        total.dropped += t.dropped;
        total.deflate_agreed += t.deflate_agreed;
        total.errors.merge(&t.errors);
        total.close_errors.merge(&t.close_errors);
        total.broadcasts.merge(&t.broadcasts);
    }
    let errors = total.failed + total.dropped;
    let mut report = Report::new("idle");
    report
        .set("connections", total.alive)
        .set("errors", errors)
        .set("opened", total.opened)
        .set("failed", total.failed)
        .set("dropped", total.dropped)
        .set("connect_s", round3(connect_s))
        .set("held_s", round3(held_s))
        .set("procs", procs)
        .set("error_kinds", total.errors.to_json())
        .set("deflate_agreed", total.deflate_agreed)
        .set("close_errors", total.close_errors.total())
        .set("close_error_kinds", total.close_errors.to_json());
    if latency_from_data {
        total.broadcasts.fill(&mut report);
    }
    report.ok = errors == 0;
    Ok(report)
}

/// Sleeps for `hold`, or until SIGTERM / SIGINT arrives.
pub(crate) async fn wait_for_end(hold: Duration) {
    hold_end(hold).await
}

/// [`wait_for_end`] with SIGTERM and SIGINT taken over now (inside a runtime): one that
/// arrives before the returned future is awaited ends it at once, instead of killing the
/// process without a report. `hold` counts from the first poll.
pub(crate) fn hold_end(hold: Duration) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let signals = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    async move {
        let (Ok(mut term), Ok(mut int)) = signals else {
            tokio::time::sleep(hold).await;
            return;
        };
        tokio::select! {
            _ = tokio::time::sleep(hold) => {}
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}

/// After the stop, with `--latency-from-data`: closes with 1000 (RFC 6455 §5.5.1) and keeps
/// timing broadcasts until the server's close frame, within [`STEP_TIMEOUT`]. The server
/// queues its close after what it had queued to the connection, so every broadcast queued
/// before the stop is counted, however far behind this reader was (the connection still counts
/// as held to the end). `Err`: the close did not end with the server's close frame (EOF,
/// reset, [`ConnError::Timeout`]).
async fn close_and_drain(conn: &mut WsConn, broadcasts: &RefCell<Broadcasts>) -> Result<(), ConnError> {
    conn.send_close(1000).await?;
    match tokio::time::timeout(STEP_TIMEOUT, hold(conn, Some(broadcasts))).await {
        Ok(ConnError::Closed(Some(_))) => Ok(()),
        Ok(e) => Err(e),
        Err(_) => Err(ConnError::Timeout),
    }
}

/// Connects, handshakes (offering permessage-deflate when `deflate`) and subscribes to
/// `channel`; returns once `subscribed` arrived.
async fn open_and_subscribe(
    url: &WsUrl,
    source: Option<std::net::IpAddr>,
    channel: &str,
    deflate: bool,
) -> Result<WsConn, ConnError> {
    let mut conn = WsConn::connect_offering_within(url, source, SynOpts::default(), deflate, STEP_TIMEOUT).await?;
    let sub = json!({"op": "sub", "ch": channel}).to_string();
    conn.send_text(sub.as_bytes()).await?;
    await_op(&mut conn, b"subscribed").await?;
    Ok(conn)
}

/// Reads until a message with `"op"` equal to `op` arrives (within [`STEP_TIMEOUT`]); an
/// `error` op fails with `Protocol`.
pub(crate) async fn await_op(conn: &mut WsConn, op: &[u8]) -> Result<(), ConnError> {
    let wait = async {
        loop {
            let mut seen = None;
            conn.recv(|m| {
                if seen.is_none() {
                    match scan_str(m, "op") {
                        Some(o) if o == op => seen = Some(Ok(())),
                        Some(b"error") => seen = Some(Err(ConnError::Protocol("server answered error"))),
                        _ => {}
                    }
                }
            })
            .await?;
            if let Some(r) = seen {
                return r;
            }
        }
    };
    tokio::time::timeout(STEP_TIMEOUT, wait).await.unwrap_or(Err(ConnError::Timeout))
}

/// Keeps an idle connection alive (pongs; messages discarded, or timed into `broadcasts`)
/// until it ends; returns why.
async fn hold(conn: &mut WsConn, broadcasts: Option<&RefCell<Broadcasts>>) -> ConnError {
    loop {
        let got = conn
            .recv(|m| {
                if let Some(b) = broadcasts {
                    b.borrow_mut().record(m, now_ns());
                }
            })
            .await;
        if let Err(e) = got {
            return e;
        }
    }
}
