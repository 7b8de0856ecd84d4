//! The per-core clock: advances the timer wheel every tick and acts on what fired —
//! handshake deadlines, heartbeats (ping, pong deadline), close-handshake deadlines and the
//! staggered drain.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::conn_state::*;
use super::core::{CoreState, PING};
use super::metrics::{HandshakeFailure, ReapReason};
use super::timer::TICK_MS;

/// Drain closes carry `retry_after_ms` drawn uniformly from 0 to this, in milliseconds.
pub const DRAIN_RETRY_SPREAD_MS: u64 = 3000;

/// How often idle channels are swept (ticks: 5 s).
const SWEEP_TICKS: u32 = 500;

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
            if st.drain_done || sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            st.tick_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        let mut st = core.borrow_mut();
        catch_up(&mut st);
        // Pings and closes queued by the deadlines go out now; when the processor runs the
        // clock instead, they leave with its next flush, batched with the fan-out.
        st.flush_dirty();
        if st.drain_done {
            return;
        }
    }
}

/// Advances the clock to now if it is behind: acts on every fired deadline, starts the drain
/// once it is signalled, wakes publishers held back by an overload that has cleared, and
/// notes when the drain is over (`drain_done`, waking [`run`]). Cheap when nothing is due.
pub fn catch_up(st: &mut CoreState) {
    let now = st.now_tick();
    if now == st.wheel.now() {
        return;
    }
    super::events::flush_suppressed(st.me);
    if !st.draining && st.shared.drain_code.load(Relaxed) != 0 {
        start_drain(st);
    }
    let mut fired = std::mem::take(&mut st.fired);
    st.wheel.advance(now, &mut fired);
    for &(id, due) in &fired {
        on_timer(st, id, due, now);
    }
    fired.clear();
    st.fired = fired;
    // Channels idle past the dedup window are forgotten (ids remembered for dedup must not
    // outlive their channel's numbering), checked every SWEEP_TICKS.
    if now.wrapping_sub(st.last_sweep) >= SWEEP_TICKS {
        st.last_sweep = now;
        let now_ms = st.now_ms();
        let idle = st.shared.config.dedup.window_ms;
        st.homes.sweep(now_ms, idle);
    }
    if !st.held.is_empty() && !st.overloaded() {
        for id in std::mem::take(&mut st.held) {
            if let Some(c) = st.conn(id) {
                c.flags &= !HELD;
                c.wake();
            }
        }
    }
    if st.draining && !st.drain_done {
        let cfg = &st.shared.config;
        // Peers get at most DRAIN_CLOSE_WAIT_MS after the window to answer their close, so
        // a drain ends within window + 2 s even when peers never answer (docs/operations.md).
        let wait = cfg.limits.close_timeout_ms.min(DRAIN_CLOSE_WAIT_MS);
        let deadline = *st.drain_deadline.get_or_insert(now + CoreState::ticks(cfg.drain.window_ms + wait) + 1);
        super::events::drain_progress(st.me, st.metrics().drain_remaining.load(Relaxed), st.metrics().connections.load(Relaxed));
        if st.metrics().connections.load(Relaxed) <= 0 || (now.wrapping_sub(deadline) as i32) >= 0 {
            st.drain_done = true;
            super::events::drain_done(st.me, st.metrics().connections.load(Relaxed));
            if let Some(w) = st.tick_waker.take() {
                w.wake();
            }
        }
    }
}

fn on_timer(st: &mut CoreState, id: ConnId, due: u32, now: u32) {
    let hb = st.shared.config.heartbeat.clone();
    let drain_code = st.shared.drain_code.load(Relaxed);
    let metrics = &st.shared.metrics[st.me];
    let Some(c) = st.conns.get_mut(id.key as usize).filter(|c| c.gen == id.gen && c.timer_due == due) else { return };
    match c.phase {
        Phase::Http => {
            if c.flags & (HTTP_SERVED | DRAIN) == 0 {
                metrics.handshake_failure(HandshakeFailure::Timeout);
                super::events::handshake_failed(st.me, Some(c.fd), HandshakeFailure::Timeout, 0, "no complete request head in time");
                c.kill(ReapReason::HandshakeTimeout);
            } else {
                // An idle keep-alive connection, or the drain.
                c.kill(ReapReason::Eof);
            }
        }
        Phase::Open if c.flags & DRAIN != 0 => {
            let reason = if drain_code == 1001 { "shutdown" } else { "restart" };
            // A per-connection random hint: clients take it as the floor of their next wait,
            // so a common value would line them all up again; a random one spreads their
            // return over DRAIN_RETRY_SPREAD_MS even when the drain window is short.
            let retry = rand::random_range(0..=DRAIN_RETRY_SPREAD_MS);
            let reason = format!("{{\"reason\":\"{reason}\",\"retry_after_ms\":{retry}}}");
            metrics.drain_remaining.fetch_sub(1, Relaxed);
            c.flags &= !DRAIN;
            st.close_by_us(id, drain_code, &reason, ReapReason::Drain);
        }
        Phase::Open => {
            let interval = CoreState::ticks(hb.ping_interval_ms);
            let pong = CoreState::ticks(hb.pong_timeout_ms);
            if c.flags & AWAIT_PONG != 0 && now.wrapping_sub(c.ping_sent) >= pong {
                c.kill(ReapReason::PongTimeout);
                return;
            }
            if c.out.is_empty() && c.out.capacity() > 0 {
                // Give an idle connection's queue memory back between bursts.
                c.out = VecDeque::new();
            }
            if c.flags & AWAIT_PONG == 0 && now.wrapping_sub(c.ping_sent) >= interval {
                c.ping_sent = now;
                c.flags |= AWAIT_PONG;
                metrics.pings_sent.fetch_add(1, Relaxed);
                st.enqueue(id, PING.clone(), NO_CHAN, None);
            }
            let Some(c) = st.conn(id) else { return };
            // Next look: the next ping time, or the pong deadline if that comes first. A pong
            // clears AWAIT_PONG without touching the timer, so the ping time must be a
            // candidate even while a pong is awaited.
            let ping_due = c.ping_sent.wrapping_add(interval.max(1));
            let mut next = ping_due;
            if c.flags & AWAIT_PONG != 0 {
                let pong_due = c.ping_sent.wrapping_add(pong.max(1));
                let ping_ahead = (ping_due.wrapping_sub(now) as i32) > 0;
                next = if ping_ahead && (ping_due.wrapping_sub(pong_due) as i32) < 0 { ping_due } else { pong_due };
            }
            let next = if (next.wrapping_sub(now) as i32) > 0 { next } else { now + 1 };
            st.schedule(id, next);
        }
        Phase::ClosingByUs | Phase::Flushing | Phase::Lingering => c.kill(ReapReason::CloseTimeout),
    }
}

/// Called when this core notices the drain: closes the accept loop and spreads the closes of
/// its connections evenly over `drain.window_ms` (so clients do not all come back at once).
pub fn start_drain(st: &mut CoreState) {
    st.draining = true;
    if let Some(w) = st.accept_waker.take() {
        w.wake();
    }
    let now = st.now_tick();
    let window = CoreState::ticks(st.shared.config.drain.window_ms).max(1) as u64;
    let open: Vec<ConnId> =
        st.conns.iter().filter(|(_, c)| c.phase == Phase::Open).map(|(k, c)| ConnId { key: k as u32, gen: c.gen }).collect();
    let n = open.len() as u64;
    st.metrics().drain_remaining.fetch_add(n as i64, Relaxed);
    super::events::drain_started(st.me, n, st.shared.config.drain.window_ms);
    for (i, id) in open.into_iter().enumerate() {
        if let Some(c) = st.conn(id) {
            c.flags |= DRAIN;
        }
        // Evenly spaced from the first tick to the end of the window.
        let due = now + 1 + ((i as u64 * window) / n.max(1)) as u32;
        st.schedule(id, due);
    }
    // Plain HTTP connections keep being served (a probe sees /readyz answer 503) until the
    // last WebSocket connection is gone.
}

/// Schedules the first heartbeat of a connection that just upgraded at a random point in
/// `[interval/2, 3·interval/2)`: the phase is uniform over a whole interval, so connections
/// opened together are pinged evenly rather than in lock-step (or in half-interval bursts), and
/// a fresh connection is not pinged in its first moments (conformance suites count every
/// frame).
pub fn first_ping(st: &mut CoreState, id: ConnId) {
    let interval = CoreState::ticks(st.shared.config.heartbeat.ping_interval_ms).max(1);
    let now = st.now_tick();
    let offset = interval.div_ceil(2) + rand::random_range(0..interval);
    if let Some(c) = st.conn(id) {
        c.ping_sent = now.wrapping_add(offset).wrapping_sub(interval);
        c.last_rx = now;
    }
    st.schedule(id, now + offset);
}
