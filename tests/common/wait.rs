//! Bounded waiting: [`eventually`] (async probe) and [`eventually_sync`] (blocking probe), and
//! their non-panicking forms [`within`] and [`within_sync`] for callers that must clean up
//! (kill a child, say) before failing; [`eventually_reaches`] for a progress counter. A
//! blocking probe inside async code is `|| std::future::ready(probe())`.
//!
//! benches/common includes this file with `#[path]`: it names nothing else of tests/common.
//!
//! A probe returns `Ok(value)` when the condition holds, or `Err(observation)` saying what it
//! saw. The probe is retried with a short backoff (5 ms doubling up to 20 ms) and one last time
//! at the limit; when the limit passes, `eventually*` panics naming `what` and the last
//! observation.

use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(20);

/// Retries the async `probe` until it returns `Ok(T)`; panics after `limit` with `what` and the
/// last `Err` observation.
pub async fn eventually<T, E, F, Fut>(limit: Duration, what: &str, probe: F) -> T
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    within(limit, probe).await.unwrap_or_else(|seen| panic!("{what}: not within {limit:?}; last seen: {seen}"))
}

/// Like [`eventually`] for a blocking probe (sleeps the thread between tries).
pub fn eventually_sync<T, E: Display>(limit: Duration, what: &str, probe: impl FnMut() -> Result<T, E>) -> T {
    within_sync(limit, probe).unwrap_or_else(|seen| panic!("{what}: not within {limit:?}; last seen: {seen}"))
}

/// Retries the async `probe` until it returns `Ok(T)`, for at most `limit`; `Err` is the last
/// observation once the limit passed.
pub async fn within<T, E, F, Fut>(limit: Duration, mut probe: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let end = Instant::now() + limit;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let seen = match probe().await {
            Ok(v) => return Ok(v),
            Err(seen) => seen,
        };
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(seen);
        }
        tokio::time::sleep(backoff.min(left)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Like [`within`] for a blocking probe.
pub fn within_sync<T, E>(limit: Duration, mut probe: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let end = Instant::now() + limit;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let seen = match probe() {
            Ok(v) => return Ok(v),
            Err(seen) => seen,
        };
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(seen);
        }
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Waits until `counter` (a publisher's progress, a tally) reaches `at`; panics after `limit`
/// naming `what` and where the counter stood.
pub async fn eventually_reaches(counter: &AtomicU64, at: u64, limit: Duration, what: &str) {
    eventually(limit, &format!("{what} reaching {at}"), || async {
        let now = counter.load(Ordering::Relaxed);
        check(now >= at, || now)
    })
    .await
}

/// `Ok(())` when `cond` holds, else `Err(seen())`: a probe for a plain condition.
pub fn check<E>(cond: bool, seen: impl FnOnce() -> E) -> Result<(), E> {
    if cond {
        Ok(())
    } else {
        Err(seen())
    }
}

/// Waits up to `limit` for `child` to exit and returns its output; past the limit kills it (by
/// its PID), reaps it and panics naming `what` and whatever it wrote.
pub fn wait_child(mut child: std::process::Child, limit: Duration, what: &str) -> std::process::Output {
    let exited = within_sync(limit, || match child.try_wait().expect("try_wait") {
        Some(_) => Ok(()),
        None => Err(()),
    });
    if exited.is_err() {
        let _ = child.kill();
        let out = child.wait_with_output().expect("output");
        panic!(
            "{what} did not exit within {limit:?}; stdout {:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    child.wait_with_output().expect("output")
}
