//! `tether load connect`: full WebSocket handshakes per second (TCP connect + upgrade request
//! + `101` with the right accept key), with the time of each handshake in a histogram.
//!
//! At most `--concurrency` handshakes are in flight. Each finished connection sends close 1000
//! and is then reset, so neither side keeps a TIME_WAIT entry and the run is not bounded by the
//! port range or the open-file limit.
//!
//! Report: `scenario`, `conns`, `ok`, `handshakes_per_s`, `p50_ms`, `p90_ms`, `p99_ms`,
//! `max_ms`, `elapsed_s`, `errors`, `error_kinds`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;

use super::args::ConnectArgs;
use super::idle::STEP_TIMEOUT;
use super::report::{round3, Errors, Latency, Report};
use super::wire::WsConn;
use super::{run_split, share, thread_count};

/// One worker thread's results.
#[derive(Default)]
struct Tally {
    latency: Latency,
    ok: u64,
    errors: Errors,
}

/// Runs the scenario; see the module docs for the report.
pub fn run(args: ConnectArgs) -> Result<Report, String> {
    if args.conns == 0 {
        return Err("--conns must be at least 1".into());
    }
    let url = args.common.url(&args.url)?;
    let threads = thread_count(args.common.threads);
    let permits = (args.common.concurrency / threads).max(1);
    let started = Instant::now();
    let worker = |t: usize| {
        let url = url.clone();
        let sources = args.common.sources.clone();
        async move {
            let tally = Rc::new(RefCell::new(Tally::default()));
            let gate = Arc::new(Semaphore::new(permits));
            let mut tasks = Vec::new();
            for index in share(args.conns, 0, 1, t, threads) {
                let Ok(permit) = gate.clone().acquire_owned().await else { break };
                let (url, tally) = (url.clone(), tally.clone());
                let source = sources.as_ref().map(|s| s.pick(index));
                tasks.push(tokio::task::spawn_local(async move {
                    let begin = Instant::now();
                    let result = WsConn::connect_within(&url, source, STEP_TIMEOUT).await;
                    let took = begin.elapsed();
                    drop(permit);
                    match result {
                        Ok(mut conn) => {
                            {
                                let mut t = tally.borrow_mut();
                                t.ok += 1;
                                t.latency.record_us(took.as_micros() as u64);
                            }
                            // The close handshake is not what is measured; the reset spares
                            // both sides a TIME_WAIT entry.
                            let _ = conn.send_close(1000).await;
                            conn.reset();
                        }
                        Err(e) => tally.borrow_mut().errors.add(e.kind()),
                    }
                }));
            }
            for task in tasks {
                let _ = task.await;
            }
            Rc::try_unwrap(tally).map(RefCell::into_inner).unwrap_or_default()
        }
    };
    let (tallies, ()) = run_split(threads, worker, || async {})?;
    let elapsed = started.elapsed().as_secs_f64();
    let mut total = Tally::default();
    for t in &tallies {
        total.latency.merge(&t.latency);
        total.ok += t.ok;
        total.errors.merge(&t.errors);
    }
    let errors = total.errors.total();
    let mut r = Report::new("connect");
    r.set("conns", args.conns)
        .set("ok", total.ok)
        .set("handshakes_per_s", (total.ok as f64 / elapsed.max(1e-9)).round() as u64)
        .set("p50_ms", total.latency.quantile_ms(0.5))
        .set("p90_ms", total.latency.quantile_ms(0.9))
        .set("p99_ms", total.latency.quantile_ms(0.99))
        .set("max_ms", total.latency.max_ms())
        .set("elapsed_s", round3(elapsed))
        .set("errors", errors)
        .set("error_kinds", total.errors.to_json());
    r.ok = errors == 0;
    Ok(r)
}
