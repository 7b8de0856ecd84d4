//! The per-core clock task: advances the timer wheel every tick and hands each deadline that
//! came to its session (handshake, heartbeat, close-handshake and drain deadlines), sweeps idle
//! channels, releases publishers held back by an overload, and runs the staggered drain.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;
use std::time::Duration;

use super::core::CoreState;
use super::session::{ticks, ConnId, Flags, State, Tick};
use super::timer::TICK_MS;

/// How often idle channels are swept, in milliseconds.
pub const SWEEP_MS: u64 = 5_000;
/// [`SWEEP_MS`] in ticks.
const SWEEP_TICKS: Tick = (SWEEP_MS / TICK_MS) as Tick;

/// Longest wait for close answers after the drain window, in milliseconds.
pub const DRAIN_CLOSE_WAIT_MS: u64 = 2000;

/// Runs the clock of one core; returns when the core has finished draining.
///
/// monoio fires timers only when its run queue is empty, so under a sustained backlog this
/// task may not be woken for a while: the processor then advances the clock itself
/// ([`catch_up`]) and wakes this task when the drain is over.
pub async fn run(core: Rc<RefCell<CoreState>>) {
    loop {
        let mut sleep = pin!(monoio::time::sleep(Duration::from_millis(TICK_MS)));
        poll_fn(|cx| {
            let mut st = core.borrow_mut();
            if st.drain.done || sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            st.drain.tick_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        let mut st = core.borrow_mut();
        catch_up(&mut st);
        // Pings and closes queued by the deadlines go out now; when the processor runs the
        // clock instead, they leave with its next flush, batched with the fan-out.
        st.flush_dirty();
        if st.drain.done {
            return;
        }
    }
}

/// Advances the clock to now if it is behind: hands every deadline that came to its session,
/// starts the drain once it is signalled, wakes publishers held back by an overload that has
/// cleared, and notes when the drain is over (`drain.done`, waking [`run`]). Cheap when nothing
/// is due.
pub fn catch_up(st: &mut CoreState) {
    let now = st.clock.now();
    if now == st.clock.wheel.now() {
        return;
    }
    super::events::flush_suppressed(st.me);
    if !st.drain.started && st.shared.draining() {
        start_drain(st);
    }
    let mut fired = std::mem::take(&mut st.clock.fired);
    st.clock.wheel.advance(now, &mut fired);
    for &(id, due) in &fired {
        st.on_timer(id, due);
    }
    fired.clear();
    st.clock.fired = fired;
    if now.wrapping_sub(st.clock.last_sweep) >= SWEEP_TICKS {
        st.clock.last_sweep = now;
        let now_ms = st.clock.now_ms();
        st.broker.sweep(now_ms);
    }
    if !st.conns.held.is_empty() && !st.router.overloaded() {
        for id in std::mem::take(&mut st.conns.held) {
            if let Some(s) = st.conn(id) {
                s.flags.clear(Flags::HELD);
                s.wake();
            }
        }
    }
    if st.drain.started && !st.drain.done {
        let cfg = &st.shared.config;
        // Peers get at most DRAIN_CLOSE_WAIT_MS after the window to answer their close, so
        // a drain ends within window + 2 s even when peers never answer.
        let wait = cfg.limits.close_timeout_ms.min(DRAIN_CLOSE_WAIT_MS);
        let deadline = *st.drain.deadline.get_or_insert(now + ticks(cfg.drain.window_ms + wait) + 1);
        let (to_close, open) = (st.metrics().drain_remaining.load(Relaxed), st.metrics().connections.load(Relaxed));
        super::events::drain_progress(st.me, to_close, open);
        if open <= 0 || (now.wrapping_sub(deadline) as i32) >= 0 {
            st.drain.done = true;
            super::events::drain_done(st.me, open);
            if let Some(w) = st.drain.tick_waker.take() {
                w.wake();
            }
        }
    }
}

/// Called when this core notices the drain: closes the accept loop and spreads the closes of
/// its connections evenly over `drain.window_ms` (so clients do not all come back at once).
/// Plain HTTP connections keep being served (a probe sees `/readyz` answer 503) until the
/// last WebSocket connection is gone.
pub fn start_drain(st: &mut CoreState) {
    st.drain.started = true;
    if let Some(w) = st.drain.accept_waker.take() {
        w.wake();
    }
    let now = st.clock.now();
    let window = ticks(st.shared.config.drain.window_ms).max(1) as u64;
    let open: Vec<ConnId> = st
        .conns
        .slab
        .iter()
        .filter(|(_, s)| s.state() == State::Open)
        .map(|(k, s)| ConnId { key: k as u32, gen: s.gen })
        .collect();
    let n = open.len() as u64;
    st.metrics().drain_remaining.fetch_add(n as i64, Relaxed);
    super::events::drain_started(st.me, n, st.shared.config.drain.window_ms);
    for (i, id) in open.into_iter().enumerate() {
        // Evenly spaced from the first tick to the end of the window.
        let due = now + 1 + ((i as u64 * window) / n.max(1)) as Tick;
        st.with_session(id, |s, _| s.start_drain(due));
    }
}
