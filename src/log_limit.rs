//! A rate limiter for log lines a flood can produce (a storm of bad handshakes, a mass reap
//! after a network cut): at most `max_per_window` lines of one kind per window, then silence,
//! then one summary line "suppressed K similar lines" once the window is over. Sans-IO: the
//! caller passes the time in milliseconds on any monotonic clock, so the tests need no clock.
//!
//! ```
//! use tether::log_limit::{Admit, LogLimiter};
//! let mut l = LogLimiter::new(2, 1000);
//! assert_eq!(l.admit(0), Admit::Log { suppressed_before: 0 });
//! assert_eq!(l.admit(1), Admit::Log { suppressed_before: 0 });
//! assert_eq!(l.admit(2), Admit::Suppress);
//! assert_eq!(l.flush(500), None); // the window is not over yet
//! assert_eq!(l.flush(1000), Some(1)); // "suppressed 1 similar line"
//! ```

/// What to do with one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Log it. When `suppressed_before` is above 0, lines were suppressed in an earlier
    /// window and not yet reported: log that summary first.
    Log {
        /// Lines suppressed before this one and not yet reported.
        suppressed_before: u64,
    },
    /// Drop it (it is counted for the summary).
    Suppress,
}

/// At most `max_per_window` lines per window of `window_ms` milliseconds, for one kind of
/// line. A window starts at the first event after the previous window ended.
#[derive(Debug, Clone)]
pub struct LogLimiter {
    max_per_window: u32,
    window_ms: u64,
    /// Start of the current window; `None` before the first event.
    window_start: Option<u64>,
    /// Lines logged in the current window.
    logged: u32,
    /// Lines suppressed and not yet reported.
    suppressed: u64,
}

impl LogLimiter {
    /// A limiter letting `max_per_window` lines through per `window_ms` milliseconds.
    pub const fn new(max_per_window: u32, window_ms: u64) -> LogLimiter {
        LogLimiter { max_per_window, window_ms, window_start: None, logged: 0, suppressed: 0 }
    }

    fn window_over(&self, now_ms: u64) -> bool {
        self.window_start.is_none_or(|start| now_ms.saturating_sub(start) >= self.window_ms)
    }

    /// One event at `now_ms`.
    pub fn admit(&mut self, now_ms: u64) -> Admit {
        let mut suppressed_before = 0;
        if self.window_over(now_ms) {
            self.window_start = Some(now_ms);
            self.logged = 0;
            suppressed_before = std::mem::take(&mut self.suppressed);
        }
        if self.logged < self.max_per_window {
            self.logged += 1;
            Admit::Log { suppressed_before }
        } else {
            self.suppressed += suppressed_before + 1;
            Admit::Suppress
        }
    }

    /// Call now and then (e.g. every clock tick): once the window in which lines were
    /// suppressed is over, returns their count, once, so a flood that stopped is still
    /// reported.
    pub fn flush(&mut self, now_ms: u64) -> Option<u64> {
        if self.suppressed > 0 && self.window_over(now_ms) {
            Some(std::mem::take(&mut self.suppressed))
        } else {
            None
        }
    }

    /// When [`flush`](Self::flush) will report the lines suppressed so far, in the caller's
    /// milliseconds: the end of the window they were suppressed in; `None` when none are
    /// pending.
    pub fn summary_due(&self) -> Option<u64> {
        if self.suppressed == 0 {
            return None;
        }
        Some(self.window_start.map_or(0, |start| start.saturating_add(self.window_ms)))
    }

    /// Lines suppressed and not yet reported.
    pub fn pending(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: Admit = Admit::Log { suppressed_before: 0 };

    #[test]
    fn lets_n_lines_through_per_window_then_suppresses() {
        let mut l = LogLimiter::new(3, 1000);
        assert_eq!([l.admit(0), l.admit(10), l.admit(20)], [LOG; 3]);
        for t in 30..100 {
            assert_eq!(l.admit(t), Admit::Suppress);
        }
        assert_eq!(l.pending(), 70);
        // The next window's first line carries the summary.
        assert_eq!(l.admit(1000), Admit::Log { suppressed_before: 70 });
        assert_eq!(l.pending(), 0);
        assert_eq!(l.admit(1001), LOG);
    }

    #[test]
    fn a_flood_that_stops_is_summarised_once_by_flush() {
        let mut l = LogLimiter::new(1, 1000);
        assert_eq!(l.admit(5), LOG);
        assert_eq!(l.admit(6), Admit::Suppress);
        assert_eq!(l.admit(7), Admit::Suppress);
        assert_eq!(l.summary_due(), Some(1005));
        assert_eq!(l.flush(999), None, "the window is still open");
        assert_eq!(l.flush(1005), Some(2));
        assert_eq!(l.flush(2000), None, "reported once");
        assert_eq!(l.summary_due(), None);
        // After a flush the next line starts clean.
        assert_eq!(l.admit(3000), LOG);
    }

    #[test]
    fn quiet_traffic_is_never_suppressed() {
        let mut l = LogLimiter::new(2, 1000);
        for t in (0..10_000).step_by(600) {
            assert_eq!(l.admit(t), LOG, "at {t}");
        }
        assert_eq!(l.flush(20_000), None);
    }

    #[test]
    fn suppressed_lines_count_across_windows_until_reported() {
        // A window can end without an event to carry its summary: the count is kept.
        let mut l = LogLimiter::new(1, 100);
        assert_eq!(l.admit(0), LOG);
        assert_eq!(l.admit(1), Admit::Suppress);
        // The next event opens a window and carries the 1; then it floods again.
        assert_eq!(l.admit(150), Admit::Log { suppressed_before: 1 });
        assert_eq!(l.admit(151), Admit::Suppress);
        assert_eq!(l.admit(152), Admit::Suppress);
        assert_eq!(l.flush(300), Some(2));
    }

    #[test]
    fn zero_lines_per_window_suppresses_everything_but_still_reports() {
        let mut l = LogLimiter::new(0, 100);
        assert_eq!(l.admit(0), Admit::Suppress);
        assert_eq!(l.admit(200), Admit::Suppress, "the earlier count is carried, not lost");
        assert_eq!(l.flush(400), Some(2));
        assert_eq!(l.admit(0), Admit::Suppress, "a clock that goes back is a still-open window");
    }
}
