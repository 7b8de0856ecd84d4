//! The per-core clock task: sleeps until the next thing due, then hands each deadline that
//! came to its session (handshake, heartbeat, close-handshake, token and drain deadlines),
//! sweeps idle channels, releases publishers held back by an overload, flushes log-suppression
//! summaries and runs the staggered drain.
//!
//! The clock is tickless: it does not wake every [`TICK_MS`] but sleeps until the earliest of
//! the timer wheel's next due tick ([`TimerWheel::next_due`](super::timer::TimerWheel::next_due)),
//! the next idle-channel sweep (only while the broker has something to sweep), the next
//! suppressed-log summary, and the next tick while a drain runs or publishers are held. A
//! deadline filed earlier than the sleep while the clock sleeps (by the processor or the
//! reactor, on this thread) shortens it through the core's [`Alarm`]; the drain's
//! start reaches every core through its doorbell (the processor starts the drain and nudges
//! the clock).

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Poll, Waker};

use super::conn::{ConnId, IoFlags};
use super::core::CoreState;
use crate::session::State;
use crate::tick::TICK_MS;
use crate::tick::{ticks, Tick};

/// How often idle channels are swept, in milliseconds.
pub const SWEEP_MS: u64 = 5_000;
/// [`SWEEP_MS`] in ticks.
const SWEEP_TICKS: Tick = (SWEEP_MS / TICK_MS) as Tick;

pub use crate::config::DRAIN_CLOSE_WAIT_MS;

/// Whether tick `a` comes before tick `b` (wrap-aware).
fn before(a: Tick, b: Tick) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// The earlier of two optional ticks.
fn earliest(a: Option<Tick>, b: Option<Tick>) -> Option<Tick> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if before(y, x) { y } else { x }),
        (x, None) => x,
        (None, y) => y,
    }
}

/// How the rest of a core's thread wakes its sleeping clock task: the tick the clock sleeps
/// until and its waker. One per core thread; everything that touches it runs on that thread.
pub struct Alarm {
    /// The clock task is asleep (between computing its wake-up and waking).
    sleeping: Cell<bool>,
    /// The tick it sleeps until (`None`: nothing due, it sleeps until nudged).
    until: Cell<Option<Tick>>,
    /// Set by [`due_at`] and [`nudge`]: the clock must recompute its wake-up.
    rung: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

thread_local! {
    static ALARM: Alarm = const {
        Alarm { sleeping: Cell::new(false), until: Cell::new(None), rung: Cell::new(false), waker: RefCell::new(None) }
    };
}

impl Alarm {
    fn ring(&self) {
        self.rung.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

/// A deadline was filed at tick `due` on this core: wakes the clock when it sleeps past it,
/// so the sleep shortens to the new deadline. Free when the clock is awake or sleeps until
/// earlier.
pub fn due_at(due: Tick) {
    ALARM.with(|a| {
        if a.sleeping.get() && a.until.get().is_none_or(|u| before(due, u)) {
            a.until.set(Some(due));
            a.ring();
        }
    })
}

/// Something the clock watches changed (the drain started or ended, a publisher was held,
/// a log summary became pending): wakes this core's clock to recompute its wake-up.
pub fn nudge() {
    ALARM.with(|a| {
        if a.sleeping.get() {
            a.ring();
        }
    })
}

/// The tick the clock must next wake at, `None` when nothing is due until something is filed
/// or nudged: the wheel's next deadline; the next tick while the drain runs (its progress and
/// deadline) or publishers are held (the overload may clear on another core, which does not
/// say so); the next idle-channel sweep while the broker holds channels; the broker's next
/// timed work (a presence window closing); the next pending log-suppression summary.
pub fn next_wake(st: &CoreState) -> Option<Tick> {
    let now = st.clock.wheel.now();
    let mut at = st.clock.wheel.next_due();
    if (st.drain.started && !st.drain.done) || !st.conns.held.is_empty() {
        at = earliest(at, Some(now.wrapping_add(1)));
    }
    if st.broker.wants_sweep() {
        at = earliest(at, Some(st.clock.last_sweep.wrapping_add(SWEEP_TICKS)));
    }
    if let Some(ms) = st.broker.next_due_ms() {
        // The broker's timed work (presence windows), at the first tick at or after it.
        at = earliest(at, Some(ms.div_ceil(TICK_MS) as Tick));
    }
    if let Some(ms) = super::events::next_summary_in_ms() {
        at = earliest(at, Some(now.wrapping_add(ticks(ms).max(1))));
    }
    at
}

/// Runs the clock of one core; returns when the core has finished draining.
///
/// monoio fires timers only when its run queue is empty, so under a sustained backlog this
/// task may not be woken for a while: the processor then advances the clock itself
/// ([`catch_up`]) and nudges this task when the drain is over.
pub async fn run(core: Rc<RefCell<CoreState>>) {
    loop {
        let (at, instant) = {
            let st = core.borrow();
            let at = next_wake(&st);
            (at, at.map(|t| st.clock.instant_of(t)))
        };
        let mut sleep = pin!(instant.map(|i| monoio::time::sleep_until(i.into())));
        ALARM.with(|a| {
            a.sleeping.set(true);
            a.until.set(at);
            a.rung.set(false);
        });
        poll_fn(|cx| {
            let done = core.borrow().drain.done;
            let slept = sleep.as_mut().as_pin_mut().is_some_and(|s| s.poll(cx).is_ready());
            ALARM.with(|a| {
                if done || slept || a.rung.get() {
                    a.sleeping.set(false);
                    return Poll::Ready(());
                }
                let mut w = a.waker.borrow_mut();
                if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *w = Some(cx.waker().clone());
                }
                Poll::Pending
            })
        })
        .await;
        let mut st = core.borrow_mut();
        catch_up(&mut st);
        // Pings and closes queued by the deadlines go out now; when the processor runs the
        // clock instead, or is writing the dirty list, they leave with its next chunks,
        // batched with the fan-out.
        if !st.conns.writing {
            st.flush_dirty();
        }
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
    let now_ms = st.clock.now_ms();
    if st.broker.next_due_ms().is_some_and(|due| due <= now_ms) {
        st.broker.on_due(&mut st.router, now_ms);
    }
    if now.wrapping_sub(st.clock.last_sweep) >= SWEEP_TICKS {
        st.clock.last_sweep = now;
        let now_ms = st.clock.now_ms();
        st.broker.sweep(now_ms);
        st.reclaim_if_spare();
    }
    release_held(st);
    if st.drain.started && !st.drain.done {
        let cfg = &st.shared.config;
        // Peers get at most DRAIN_CLOSE_WAIT_MS after the window to answer their close, so
        // a drain ends within window + 2 s even when peers never answer.
        let wait = cfg.limits.close_timeout_ms.min(DRAIN_CLOSE_WAIT_MS);
        let deadline = *st.drain.deadline.get_or_insert(now + ticks(cfg.drain.window_ms + wait) + 1);
        let (to_close, open) =
            (st.metrics().session.drain_remaining.load(Relaxed), st.metrics().connections.load(Relaxed));
        super::events::drain_progress(st.me, to_close, open);
        if open <= 0 || (now.wrapping_sub(deadline) as i32) >= 0 {
            st.drain.done = true;
            super::events::drain_done(st.me, open);
            nudge();
        }
    }
}

/// Wakes the publishers held back by an overload once it has cleared.
pub fn release_held(st: &mut CoreState) {
    if !st.conns.held.is_empty() && !st.router.overloaded() {
        for id in std::mem::take(&mut st.conns.held) {
            if let Some(c) = st.conns.get(id) {
                c.io.clear(IoFlags::HELD);
                // Input may have come while held: the reactor reads it now.
                st.reactor.schedule(id, c);
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
    // The clock now wakes every tick until the drain is over (progress, deadline).
    nudge();
    if let Some(w) = st.drain.accept_waker.take() {
        w.wake();
    }
    let now = st.clock.now();
    let window = ticks(st.shared.config.drain.window_ms).max(1) as u64;
    let open: Vec<ConnId> = st
        .conns
        .slab
        .iter()
        .filter(|(_, c)| c.session.state() == State::Open)
        .map(|(k, c)| ConnId { key: k as u32, gen: c.gen })
        .collect();
    let n = open.len() as u64;
    st.metrics().session.drain_remaining.fetch_add(n as i64, Relaxed);
    super::events::drain_started(st.me, n, st.shared.config.drain.window_ms);
    for (i, id) in open.into_iter().enumerate() {
        // Evenly spaced from the first tick to the end of the window.
        let due = now + 1 + ((i as u64 * window) / n.max(1)) as Tick;
        st.with_session(id, |s, _| s.start_drain(due));
    }
}
