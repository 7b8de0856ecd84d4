//! Reconnect delays with full jitter (docs/protocol.md, the reference client): a fleet of clients
//! dropped at the same moment (a drain, a cut) comes back spread over the whole window instead of
//! in one spike.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Backoff parameters. Defaults: `base` 500 ms, `cap` 30 s, `stable_after` 10 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    /// Ceiling of the first delay; the ceiling doubles per failed attempt.
    pub base: Duration,
    /// Largest ceiling. Raising it spreads a storm wider but slows recovery.
    pub cap: Duration,
    /// A connection that stayed up at least this long resets the attempt count; a shorter one
    /// does not, so a server that accepts and immediately drops is not hammered.
    pub stable_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self { base: Duration::from_millis(500), cap: Duration::from_secs(30), stable_after: Duration::from_secs(10) }
    }
}

/// Full-jitter backoff: the n-th delay (n from 0) is uniform in `[0, min(cap, base·2^n)]`,
/// raised to a server-given floor when there is one.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    stable_after: Duration,
    attempt: u32,
    rng: StdRng,
}

impl Backoff {
    /// A backoff seeded from the operating system (from the clock and process id if the OS
    /// random source is unavailable: jitter only needs to differ between clients).
    pub fn new(cfg: BackoffConfig) -> Self {
        let rng = StdRng::try_from_os_rng().unwrap_or_else(|_| {
            let nanos =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
            StdRng::seed_from_u64(nanos ^ u64::from(std::process::id()).rotate_left(32))
        });
        Self::with_rng(cfg, rng)
    }

    /// A backoff with a fixed seed, so tests get the same delays on every run.
    pub fn with_seed(cfg: BackoffConfig, seed: u64) -> Self {
        Self::with_rng(cfg, StdRng::seed_from_u64(seed))
    }

    fn with_rng(cfg: BackoffConfig, rng: StdRng) -> Self {
        Self { base: cfg.base, cap: cfg.cap, stable_after: cfg.stable_after, attempt: 0, rng }
    }

    /// Failed attempts since the last reset.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// `min(cap, base·2^attempt)`: the upper bound of the next delay before any floor.
    pub fn ceiling(&self) -> Duration {
        1u32.checked_shl(self.attempt)
            .and_then(|factor| self.base.checked_mul(factor))
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// The next delay: `max(floor, uniform[0, ceiling()])`; then the attempt count grows by
    /// one. `floor` is the server's `retry_after_ms` or `Retry-After` hint and is honoured
    /// even above `cap`.
    pub fn next_delay(&mut self, floor: Option<Duration>) -> Duration {
        let ceiling = u64::try_from(self.ceiling().as_nanos()).unwrap_or(u64::MAX);
        let jittered = Duration::from_nanos(self.rng.random_range(0..=ceiling));
        self.attempt = self.attempt.saturating_add(1);
        floor.map_or(jittered, |f| jittered.max(f))
    }

    /// The delay before trying *another* server after one failed (a client with several URLs,
    /// `ClientConfig::urls` (`crate::client`)): `max(floor, uniform[0, min(cap,
    /// base)])`, the window of a first attempt. The attempt count does not grow: a failure that
    /// the next server may not share is no reason to wait longer, and the first window still
    /// spreads the clients of a dead server instead of moving them all in the same instant.
    pub fn switch_delay(&mut self, floor: Option<Duration>) -> Duration {
        let ceiling = u64::try_from(self.base.min(self.cap).as_nanos()).unwrap_or(u64::MAX);
        let jittered = Duration::from_nanos(self.rng.random_range(0..=ceiling));
        floor.map_or(jittered, |f| jittered.max(f))
    }

    /// Reports how long the last connection stayed up; at least `stable_after` resets the
    /// attempt count to 0. Returns whether it did (the connection counts as stable).
    pub fn connected_for(&mut self, up: Duration) -> bool {
        let stable = up >= self.stable_after;
        if stable {
            self.attempt = 0;
        }
        stable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BackoffConfig {
        BackoffConfig::default()
    }

    #[test]
    fn ceiling_doubles_then_caps() {
        let mut b = Backoff::with_seed(cfg(), 1);
        let expected_ms = [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000];
        for ms in expected_ms {
            assert_eq!(b.ceiling(), Duration::from_millis(ms));
            b.next_delay(None);
        }
        for _ in 0..100 {
            b.next_delay(None);
        }
        assert_eq!(b.ceiling(), Duration::from_secs(30), "no overflow past 2^32");
    }

    #[test]
    fn delays_stay_within_bounds() {
        let mut b = Backoff::with_seed(cfg(), 42);
        for _ in 0..1000 {
            let ceiling = b.ceiling();
            let d = b.next_delay(None);
            assert!(d <= ceiling, "{d:?} > {ceiling:?}");
        }
    }

    #[test]
    fn seeded_delays_repeat() {
        let run = |seed| {
            let mut b = Backoff::with_seed(cfg(), seed);
            (0..10).map(|_| b.next_delay(None)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn first_delays_are_spread_over_the_window() {
        // 1000 clients, each on its first attempt: full jitter spreads them over
        // [0, 500 ms]; no 50 ms slot holds more than 15 % of them.
        let mut slots = [0u32; 11];
        for seed in 0..1000 {
            let d = Backoff::with_seed(cfg(), seed).next_delay(None);
            slots[(d.as_millis() / 50) as usize] += 1;
        }
        assert!(slots.iter().all(|&n| n <= 150), "{slots:?}");
        assert!(slots[..10].iter().all(|&n| n >= 50), "{slots:?}");
    }

    #[test]
    fn floor_raises_the_delay() {
        let mut b = Backoff::with_seed(cfg(), 3);
        let d = b.next_delay(Some(Duration::from_secs(45)));
        assert_eq!(d, Duration::from_secs(45), "a floor above the cap is honoured");
        for _ in 0..100 {
            let d = b.next_delay(Some(Duration::from_millis(400)));
            assert!(d >= Duration::from_millis(400));
        }
    }

    #[test]
    fn stable_connection_resets_attempts() {
        let mut b = Backoff::with_seed(cfg(), 5);
        for _ in 0..4 {
            b.next_delay(None);
        }
        b.connected_for(Duration::from_secs(9));
        assert_eq!(b.attempt(), 4, "a short connection does not reset");
        b.connected_for(Duration::from_secs(10));
        assert_eq!(b.attempt(), 0);
        assert_eq!(b.ceiling(), Duration::from_millis(500));
    }

    #[test]
    fn switch_delay_stays_in_the_first_window() {
        let mut b = Backoff::with_seed(cfg(), 11);
        for _ in 0..5 {
            b.next_delay(None);
        }
        for _ in 0..1000 {
            assert!(b.switch_delay(None) <= Duration::from_millis(500));
        }
        assert_eq!(b.attempt(), 5, "switching does not grow the attempt count");
        assert_eq!(b.switch_delay(Some(Duration::from_secs(2))), Duration::from_secs(2), "the floor holds");
        let small_cap = BackoffConfig { cap: Duration::from_millis(100), ..cfg() };
        let mut b = Backoff::with_seed(small_cap, 12);
        assert!((0..1000).all(|_| b.switch_delay(None) <= Duration::from_millis(100)));
    }

    #[test]
    fn zero_base_gives_zero_delay() {
        let zero = BackoffConfig { base: Duration::ZERO, ..cfg() };
        let mut b = Backoff::with_seed(zero, 9);
        assert_eq!(b.next_delay(None), Duration::ZERO);
    }
}
