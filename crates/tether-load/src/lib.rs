//! `tether load`: the load generator (docs/benchmarks.md, "The load generator").
//!
//! Scenarios, one subcommand each; every one prints a table on stderr and ONE final JSON line
//! on stdout:
//! - `idle URL... --conns N [--procs P] [--rate R] [--channels K] [--hold 30s] [--sources A-B]
//!   [--latency-from-data] [--deflate]` → `{"scenario":"idle","connections":N,"errors":E,…}` (+
//!   `broadcasts`, per seq `p50_ms`, `p99_ms`, `max_ms`, with `--latency-from-data`)
//! - `fanout URL... --subs N --rate M --size S --duration D [--channels K] [--publish ws|http]
//!   [--publish-url URL] [--raw TEXT] [--non-readers N] [--sse] [--deflate] [--payload
//!   pad|book|tick]` → `{"deliveries_per_s","p50_ms",
//!   "p90_ms","p99_ms","p999_ms","max_ms","lost","reordered",…}` (+ `non_readers_closed`, …
//!   with `--non-readers`)
//! - `publish URL [--publishers P] [--window W] [--duration D] [--channels K]` →
//!   `{"publishes_per_s","p50_ms","p99_ms","acked","errors",…}`
//! - `connect URL --conns N` → `{"handshakes_per_s","p50_ms","p99_ms","errors",…}`
//! - `storm URL --conns N [--trigger drain|cut]` → `{"recovered","recovery_s","attempts",
//!   "peak_reconnects_per_100ms","errors",…}`
//!
//! The generator runs on tokio: `--threads` OS threads, each with a single-threaded runtime
//! owning its share of the connections and its own counters and histogram (no locks on the
//! receive path). Connections speak raw TCP (or TLS over it, [`tls`]) with a hand-written
//! client handshake and the project's frame codec ([`wire`]); an idle one owns no buffer. `--procs P` re-executes this
//! binary P times to get past the per-process open-file limit ([`procs`]).
//!
//! Exit code: 0 when the run completed without errors, 1 when it completed with errors
//! (failed or dropped connections, clients that did not recover, publishes refused), 2 when it
//! could not run (bad arguments, server unreachable for the publisher).
//!
//! # Layout
//! - [`args`]: the flags and their value parsers.
//! - [`wire`]: TCP connect with a source address, client handshake, frame reading.
//! - [`tls`]: `wss://` / `https://` (rustls on ring, `--ca FILE`) under the same client.
//! - [`seq`]: loss / reordering / duplicate accounting per subscriber.
//! - [`report`]: report fields, table and JSON line, latency histogram, error tallies.
//! - [`broadcast`]: per-seq latency of stamped broadcasts, for `idle --latency-from-data`.
//! - [`idle`], [`fanout`] (+ [`publish`], [`nonreader`]), [`throughput`] (`publish`),
//!   [`connect`], [`storm`]: the scenarios.
//! - [`procs`]: `--procs` child processes and the aggregation of their reports.

pub mod args;
pub mod broadcast;
pub mod connect;
pub mod fanout;
pub mod idle;
pub mod nonreader;
pub mod procs;
pub mod publish;
pub mod report;
pub mod seq;
pub mod sse;
pub mod storm;
pub mod throughput;
pub mod tls;
pub mod wire;

use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use args::{CommonArgs, ConnectArgs, FanoutArgs, IdleArgs, Payload, PublishArgs, PublishVia, StormArgs, Trigger};
pub use report::Report;

/// `tether load` subcommands; the binary's clap tree embeds this enum.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum LoadCmd {
    /// Open N connections, subscribe each to one of K channels, hold them.
    Idle(IdleArgs),
    /// N subscribers, publishers sending M stamped messages/s of S bytes: throughput, latency,
    /// loss and reordering.
    Fanout(FanoutArgs),
    /// P publisher connections with W `pub`s in flight each: acknowledged publishes per second
    /// and publish-to-ack time.
    Publish(PublishArgs),
    /// Full WebSocket handshakes per second.
    Connect(ConnectArgs),
    /// Drop N subscribers at once (server drain or socket cut); time until all have resumed.
    Storm(StormArgs),
}

/// Runs one `tether load` scenario: raises `RLIMIT_NOFILE` to the hard limit, runs, prints
/// the table (stderr) and the JSON line (stdout). Returns the exit code: 0 success, 1 the run
/// completed with errors, 2 the run could not be done (the reason is printed on stderr).
pub fn run(cmd: LoadCmd) -> i32 {
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        eprintln!("tether load: cannot raise the open-file limit: {e}");
    }
    let child = match &cmd {
        LoadCmd::Idle(a) => a.common.child_of.is_some(),
        LoadCmd::Fanout(a) => a.common.child_of.is_some(),
        LoadCmd::Publish(a) => a.common.child_of.is_some(),
        LoadCmd::Connect(a) => a.common.child_of.is_some(),
        LoadCmd::Storm(a) => a.common.child_of.is_some(),
    };
    let result = match cmd {
        LoadCmd::Idle(a) => idle::run(a),
        LoadCmd::Fanout(a) => fanout::run(a),
        LoadCmd::Publish(a) => throughput::run(a),
        LoadCmd::Connect(a) => connect::run(a),
        LoadCmd::Storm(a) => storm::run(a),
    };
    match result {
        Ok(report) => {
            // A `--procs` child's table would interleave with its siblings'; the parent prints
            // the aggregate.
            report.emit(child);
            if report.ok {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("tether load: {e}");
            2
        }
    }
}

/// Worker threads to use: `requested`, or one per available CPU when 0.
pub(crate) fn thread_count(requested: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A single-threaded tokio runtime with I/O and timers.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a tokio runtime: {e}"))
}

/// Runs `worker(t)` for t in 0..threads, each on its own OS thread with its own
/// single-threaded runtime and `LocalSet` (so per-thread state can be `Rc`), while
/// `controller` runs on the calling thread. Returns the workers' results in thread order and
/// the controller's.
pub(crate) fn run_split<W, WF, WR, C, CF, CR>(threads: usize, worker: W, controller: C) -> Result<(Vec<WR>, CR), String>
where
    W: Fn(usize) -> WF + Sync,
    WF: Future<Output = WR>,
    WR: Send,
    C: FnOnce() -> CF,
    CF: Future<Output = CR>,
{
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let worker = &worker;
                scope.spawn(move || -> Result<WR, String> {
                    let rt = runtime()?;
                    let local = tokio::task::LocalSet::new();
                    Ok(local.block_on(&rt, worker(t)))
                })
            })
            .collect();
        let rt = runtime()?;
        let controlled = rt.block_on(controller());
        let mut results = Vec::with_capacity(threads);
        for h in handles {
            match h.join() {
                Ok(r) => results.push(r?),
                Err(_) => return Err("a worker thread panicked".to_string()),
            }
        }
        Ok((results, controlled))
    })
}

/// Nanoseconds since the UNIX epoch (the clock the fan-out stamps use: publisher and
/// subscribers run on the same host).
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A random 8-hex-digit run id: channel names of one run never collide with an earlier
/// run's history on the same server.
pub(crate) fn run_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// Full-jitter backoff (docs/protocol.md, the reference client): uniform in `[0, min(cap,
/// base·2^attempt)]`.
pub fn full_jitter(base: Duration, cap: Duration, attempt: u32) -> Duration {
    let ceiling = base.saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX)).min(cap);
    ceiling.mul_f64(rand::random::<f64>())
}

/// Polls `done` every 10 ms until it holds or `limit` passes (`Duration::MAX`: no limit);
/// true when it held.
pub(crate) async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now().checked_add(limit);
    loop {
        if done() {
            return true;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// This process's place in a `--procs` run: (index, count); (0, 1) when not a child.
pub(crate) fn proc_slot(common: &CommonArgs) -> (usize, usize) {
    match (common.child_index, common.child_of) {
        (Some(i), Some(n)) if n > 0 && i < n => (i, n),
        _ => (0, 1),
    }
}

/// The global connection indices `0..total` that thread `thread` of `threads` in process
/// `proc_index` of `procs` owns (round-robin at both levels, so every index has one owner).
pub(crate) fn share(
    total: usize,
    proc_index: usize,
    procs: usize,
    thread: usize,
    threads: usize,
) -> impl Iterator<Item = usize> {
    (proc_index..total).step_by(procs.max(1)).skip(thread).step_by(threads.max(1))
}

#[cfg(test)]
mod tests;
