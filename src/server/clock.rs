//! A core's clock: milliseconds since the process started, in ticks of [`TICK_MS`], and the
//! timer wheel that holds the sessions' deadlines (`server::tick` runs it).

use std::time::Instant;

use super::conn::ConnId;
use super::timer::TimerWheel;
use crate::session::SessionConfig;
use crate::tick::{heartbeat_slack, Tick, TICK_MS};
use crate::ws::deflate::Deflate;

/// The core's clock: milliseconds since the process started, in ticks of [`TICK_MS`], and
/// the timer wheel of the sessions' deadlines.
pub struct Clock {
    start: Instant,
    /// One entry per session deadline.
    pub wheel: TimerWheel,
    /// Entries fired in one clock step (kept to reuse its allocation).
    pub fired: Vec<(ConnId, Tick)>,
    /// Tick of the last sweep of idle channels.
    pub last_sweep: Tick,
    /// The sessions' limits in ticks.
    pub cfg: SessionConfig,
    /// The core's permessage-deflate compressor and inflater, lent to every session (none is
    /// held per connection).
    pub deflate: Deflate,
    /// The heartbeat grid in ticks ([`heartbeat_slack`]): ping times and pong deadlines are
    /// filed on its multiples.
    pub heartbeat_slack: Tick,
}

impl Clock {
    /// A clock counting from `start`, with an empty wheel and the sessions' limits `cfg`
    /// (ticks); the heartbeat grid comes from `cfg`'s ping interval and pong timeout.
    pub fn new(start: Instant, cfg: SessionConfig, deflate: Deflate) -> Clock {
        Clock {
            start,
            wheel: TimerWheel::new(4096, 0),
            fired: Vec::new(),
            last_sweep: 0,
            heartbeat_slack: heartbeat_slack(cfg.ping_interval, cfg.pong_timeout),
            cfg,
            deflate,
        }
    }

    /// Milliseconds since the process started.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Current tick.
    pub fn now(&self) -> Tick {
        (self.now_ms() / TICK_MS) as Tick
    }

    /// The instant tick `tick` begins (at or after which [`Clock::now`] returns it), taking
    /// the tick to be the first at or after the current one with these low 32 bits.
    pub fn instant_of(&self, tick: Tick) -> Instant {
        let now_ticks = self.now_ms() / TICK_MS;
        let ahead = tick.wrapping_sub(now_ticks as Tick) as i32;
        let at = now_ticks.saturating_add_signed(i64::from(ahead.max(0)));
        self.start + std::time::Duration::from_millis(at * TICK_MS)
    }
}
