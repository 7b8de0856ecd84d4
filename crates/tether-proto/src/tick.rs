//! The session's time base: a [`Tick`] is [`TICK_MS`] milliseconds on a core's clock. The
//! caller reads its clock once and passes the tick in (`Ctx::now` of the session); nothing here
//! reads a clock. Also the heartbeat grid on which a core files ping times and pong deadlines,
//! so that one clock wake-up handles a batch of them ([`heartbeat_slack`]).

/// A point in time on a core's clock, in ticks of [`TICK_MS`] milliseconds since the core
/// started. Wraps after ~497 days; compare with [`reached`], never with `<`.
pub type Tick = u32;

/// Milliseconds → ticks, rounded up.
pub fn ticks(ms: u64) -> Tick {
    ms.div_ceil(TICK_MS) as Tick
}

/// Whether tick `a` is at or after tick `b` (wrap-aware over half of `u32`).
pub fn reached(a: Tick, b: Tick) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

/// Ticks are this many milliseconds. Pings are spread at this granularity.
pub const TICK_MS: u64 = 10;

/// The widest heartbeat grid, in ticks (640 ms): see [`heartbeat_slack`].
pub const MAX_HEARTBEAT_SLACK_TICKS: Tick = 64;

/// The heartbeat grid of a ping interval and pong timeout (both in ticks), in ticks: the
/// largest power of two at most an eighth of the shorter of the two, between 1 (exact) and
/// [`MAX_HEARTBEAT_SLACK_TICKS`]. 64 ticks (640 ms) for the default 25 s and 10 s; 8 (80 ms)
/// for a 1 s interval.
///
/// Ping times and pong deadlines are filed on this grid ([`heartbeat_slot`]): a ping leaves,
/// and a silent peer is reaped, less than one grid step late (at most 1/8 of the interval or the
/// timeout), and one clock wake-up handles the heartbeats of a whole step. Each ping touches a
/// socket and a session that have been cold for a whole interval, so sent in batches they cost
/// about half as much CPU as sent a few at a time (docs/operations.md, heartbeats).
pub fn heartbeat_slack(ping_interval: Tick, pong_timeout: Tick) -> Tick {
    let eighth = (ping_interval.min(pong_timeout) / 8).clamp(1, MAX_HEARTBEAT_SLACK_TICKS);
    1 << eighth.ilog2()
}

/// The tick a heartbeat deadline due at `due` is filed for: the first multiple of `slack` (a
/// power of two, [`heartbeat_slack`]) at or after it (wrap-aware: 2^32 is a multiple).
pub fn heartbeat_slot(due: Tick, slack: Tick) -> Tick {
    debug_assert!(slack.is_power_of_two());
    due.wrapping_add(slack - 1) & !(slack - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_round_up_and_compare_across_the_wrap() {
        assert_eq!(ticks(0), 0);
        assert_eq!(ticks(1), 1);
        assert_eq!(ticks(TICK_MS), 1);
        assert_eq!(ticks(TICK_MS + 1), 2);
        assert!(reached(5, 5) && reached(6, 5) && !reached(4, 5));
        assert!(reached(2, u32::MAX - 2), "3 ticks after the wrap is after");
        assert!(!reached(u32::MAX - 2, 2));
    }

    #[test]
    fn heartbeat_slots_are_the_next_multiple() {
        assert_eq!(heartbeat_slot(8, 4), 8);
        assert_eq!(heartbeat_slot(9, 4), 12);
        assert_eq!(heartbeat_slot(11, 4), 12);
        assert_eq!(heartbeat_slot(u32::MAX - 1, 4), 0, "wraps onto the grid");
        assert_eq!(heartbeat_slot(65, 64), 128);
        assert_eq!(heartbeat_slot(7, 1), 7, "a slack of 1 is exact");
    }

    #[test]
    fn heartbeat_slack_is_an_eighth_of_the_shorter_as_a_power_of_two() {
        assert_eq!(heartbeat_slack(2500, 1000), 64, "the defaults (25 s, 10 s): 640 ms");
        assert_eq!(heartbeat_slack(100, 1000), 8, "1 s interval: 80 ms");
        assert_eq!(heartbeat_slack(10, 30), 1, "100 ms interval: exact");
        assert_eq!(heartbeat_slack(1, 1), 1);
        assert_eq!(heartbeat_slack(u32::MAX, u32::MAX), MAX_HEARTBEAT_SLACK_TICKS);
        for (i, p) in [(3000, 300), (50, 70), (640, 9000)] {
            let s = heartbeat_slack(i, p);
            assert!(s.is_power_of_two() && s <= (i.min(p) / 8).max(1), "{i} {p}: {s}");
        }
    }
}
