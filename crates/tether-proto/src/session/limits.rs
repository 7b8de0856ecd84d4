//! Per-connection abuse limits, sans-IO (`[limits.per_connection]`, docs/security.md,
//! "Per-connection limits"): token buckets on the core's clock for WebSocket `pub` messages,
//! `pub` bytes, control frames, `sub`/`unsub` requests, `refresh` requests and malformed
//! requests, and the rule that closes a connection which goes on far past its rate.
//!
//! Each bucket holds at most its burst and refills continuously at its rate; a request that
//! finds too few tokens is refused (`error` `limit` with `retry_after_ms` for a `pub`, no pong
//! for a ping) and takes nothing. Refusals are counted in windows of one second that open at
//! the first refusal after the previous window ended; when one window's refusals exceed
//! [`CLOSE_AFTER_BURSTS`] times the bucket's burst, the connection is closed with 1008.
//!
//! The state ([`Limiter`]) lives behind an `Option<Box<_>>` in the session, made the first
//! time a configured limit has something to count beyond the few requests the session's
//! flags count for free (`Flags::free_ops`), and dropped again at a heartbeat that finds every
//! bucket full: a connection that subscribes to a few channels, never publishes under a rate
//! and never pings costs nothing here. Time is the session's tick ([`TICK_MS`]), never a
//! clock read per message.

use super::Limit;
use crate::tick::{Tick, TICK_MS};

/// Ticks in one second: the length of a refusal window.
pub const SECOND: Tick = (1000 / TICK_MS) as Tick;

/// A connection is closed with 1008 when the refusals of one window (one second) exceed this
/// many bursts: 10 × `publish_rate` refused `pub`s, 10 × the bytes burst of refused `data`,
/// or 10 × `control_frames_rate` refused control frames. A client that slows down when told
/// (`retry_after_ms`) never gets near it.
pub const CLOSE_AFTER_BURSTS: u64 = 10;

/// The per-connection rates, from `[limits.per_connection]`; 0 = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rates {
    /// `pub` messages per second; the burst is the same number.
    pub publish_rate: u64,
    /// `pub` `data` bytes per second.
    pub publish_bytes_rate: u64,
    /// Burst of the bytes bucket: one second's worth, and at least the largest client message
    /// (`limits.max_message_bytes`), so that every accepted message can pass at some point.
    pub publish_bytes_burst: u64,
    /// Control frames (pings, unsolicited pongs) per second; the burst is the same number.
    pub control_frames_rate: u64,
    /// `sub` and `unsub` requests per second.
    pub subscribe_rate: u64,
    /// Burst of the `sub`/`unsub` bucket: the rate, and at least twice
    /// `max_subscriptions`, so a client can drop and take again every subscription it may hold
    /// at once (a reconnect, a refreshed grant).
    pub subscribe_burst: u64,
    /// `refresh` requests per second (burst = rate), each counted, also one whose token is
    /// the one already held.
    pub refresh_rate: u64,
    /// Requests answered with an error of the request itself (`bad_json`, `bad_request`,
    /// `bad_op`, `bad_channel`, binary frames) per second (burst = rate).
    pub bad_request_rate: u64,
    /// `presence` and `presence_stats` requests per second (burst = rate).
    pub presence_rate: u64,
}

/// The requests counted by the op buckets of a [`Limiter`] (besides `pub` and control frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A `sub` or an `unsub` (`subscribe_rate`).
    Subscribe = 0,
    /// A `refresh` (`refresh_rate`).
    Refresh,
    /// A malformed or unknown request (`bad_request_rate`).
    BadRequest,
    /// A `presence` or `presence_stats` (`presence_rate`).
    Presence,
}

impl Op {
    /// Every op, in the order of their buckets.
    pub const ALL: [Op; 4] = [Op::Subscribe, Op::Refresh, Op::BadRequest, Op::Presence];

    /// The limit this op counts against.
    pub fn limit(self) -> Limit {
        match self {
            Op::Subscribe => Limit::SubscribeRate,
            Op::Refresh => Limit::RefreshRate,
            Op::BadRequest => Limit::BadRequestRate,
            Op::Presence => Limit::PresenceRate,
        }
    }

    /// Its rate and burst under `r` (0: unlimited).
    pub fn rate(self, r: &Rates) -> (u64, u64) {
        match self {
            Op::Subscribe => (r.subscribe_rate, r.subscribe_burst),
            Op::Refresh => (r.refresh_rate, r.refresh_rate),
            Op::BadRequest => (r.bad_request_rate, r.bad_request_rate),
            Op::Presence => (r.presence_rate, r.presence_rate),
        }
    }
}

impl Rates {
    /// These rates with the bursts that follow from them: the bytes bucket holds one second's
    /// worth and at least `max_message_bytes` (`limits.max_message_bytes`), the `sub`/`unsub`
    /// bucket one second's worth and at least twice `max_subscriptions`
    /// (`limits.per_connection.max_subscriptions`). A rate of 0 (unlimited) keeps a burst of 0.
    pub fn with_bursts(self, max_subscriptions: usize, max_message_bytes: usize) -> Rates {
        let (bytes, subs) = (self.publish_bytes_rate, self.subscribe_rate);
        Rates {
            publish_bytes_burst: if bytes == 0 { 0 } else { bytes.max(max_message_bytes as u64) },
            subscribe_burst: if subs == 0 { 0 } else { subs.max(2 * max_subscriptions as u64) },
            ..self
        }
    }

    /// Whether a `pub` is limited at all.
    pub fn limits_publish(&self) -> bool {
        self.publish_rate > 0 || self.publish_bytes_rate > 0
    }
}

/// A token bucket counted in thousandths of a token, so a refill at `rate` tokens per second
/// is `rate` thousandths per millisecond: integers only, exact at any rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    milli: u64,
    last: Tick,
}

impl TokenBucket {
    /// A bucket holding its whole `burst` (tokens) at tick `now`.
    pub fn full(now: Tick, burst: u64) -> TokenBucket {
        TokenBucket { milli: burst.saturating_mul(1000), last: now }
    }

    /// Tokens held (whole ones).
    pub fn tokens(&self) -> u64 {
        self.milli / 1000
    }

    /// Adds what `rate` tokens per second brought since the last refill, up to `burst`.
    pub fn refill(&mut self, now: Tick, rate: u64, burst: u64) {
        let ms = now.wrapping_sub(self.last) as u64 * TICK_MS;
        self.last = now;
        self.milli = self.milli.saturating_add(rate.saturating_mul(ms)).min(burst.saturating_mul(1000));
    }

    /// Milliseconds until the bucket holds `cost` tokens at `rate` per second, rounded up to
    /// whole ticks (the session's clock advances in ticks); 0 when it holds them now.
    pub fn wait_ms(&self, cost: u64, rate: u64) -> u64 {
        let need = cost.saturating_mul(1000).saturating_sub(self.milli);
        if need == 0 {
            return 0;
        }
        let per_tick = rate.saturating_mul(TICK_MS).max(1);
        need.div_ceil(per_tick).saturating_mul(TICK_MS)
    }

    /// Takes `cost` tokens; the caller checked [`TokenBucket::wait_ms`] is 0.
    pub fn take(&mut self, cost: u64) {
        self.milli = self.milli.saturating_sub(cost.saturating_mul(1000));
    }
}

/// Refusals in the current one-second window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Refusals {
    start: Tick,
    count: u64,
}

impl Refusals {
    /// Adds `n` refused units at `now` (a new window opens when the last one is a second old
    /// or empty); returns the window's total.
    fn add(&mut self, now: Tick, n: u64) -> u64 {
        if self.count == 0 || now.wrapping_sub(self.start) >= SECOND {
            *self = Refusals { start: now, count: 0 };
        }
        self.count = self.count.saturating_add(n);
        self.count
    }
}

/// What a limit decided about one `pub` or control frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the limits; the tokens are taken.
    Allow,
    /// Refused by `limit`: retry after `retry_after_ms` milliseconds.
    Refuse {
        /// The limit that refused (the message bucket when both publish buckets did).
        limit: Limit,
        /// When the bucket(s) will hold enough for this request, in milliseconds.
        retry_after_ms: u64,
        /// `Some(l)` when this refusal took a window of `l` past [`CLOSE_AFTER_BURSTS`]
        /// bursts: close the connection with 1008 naming `l`.
        close: Option<Limit>,
    },
}

/// One connection's buckets and refusal windows (about 200 bytes, boxed, made on first use).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limiter {
    messages: TokenBucket,
    bytes: TokenBucket,
    control: TokenBucket,
    refused_messages: Refusals,
    refused_bytes: Refusals,
    refused_control: Refusals,
    /// One bucket per [`Op`], in its order.
    ops: [TokenBucket; Op::ALL.len()],
    refused_ops: [Refusals; Op::ALL.len()],
}

impl Limiter {
    /// Full buckets at tick `now`.
    pub fn new(now: Tick, r: &Rates) -> Limiter {
        Limiter {
            messages: TokenBucket::full(now, r.publish_rate),
            bytes: TokenBucket::full(now, r.publish_bytes_burst),
            control: TokenBucket::full(now, r.control_frames_rate),
            refused_messages: Refusals::default(),
            refused_bytes: Refusals::default(),
            refused_control: Refusals::default(),
            ops: Op::ALL.map(|op| TokenBucket::full(now, op.rate(r).1)),
            refused_ops: [Refusals::default(); Op::ALL.len()],
        }
    }

    /// One request of kind `op` at tick `now`, taking `cost` tokens (more than 1 when the
    /// session counted some for free before this limiter existed). Refused when its bucket
    /// holds fewer than 1; then nothing is taken.
    pub fn op(&mut self, now: Tick, r: &Rates, op: Op, cost: u64) -> Verdict {
        let (rate, burst) = op.rate(r);
        let i = op as usize;
        self.ops[i].refill(now, rate, burst);
        let wait = self.ops[i].wait_ms(1, rate);
        if wait == 0 {
            self.ops[i].take(cost);
            return Verdict::Allow;
        }
        let over = self.refused_ops[i].add(now, 1) > CLOSE_AFTER_BURSTS.saturating_mul(burst);
        Verdict::Refuse { limit: op.limit(), retry_after_ms: wait, close: over.then(|| op.limit()) }
    }

    /// Whether, at tick `now`, every bucket is full and no refusal window is open: the
    /// limiter holds nothing a fresh one would not, and can be dropped.
    pub fn is_rested(&mut self, now: Tick, r: &Rates) -> bool {
        self.messages.refill(now, r.publish_rate, r.publish_rate);
        self.bytes.refill(now, r.publish_bytes_rate, r.publish_bytes_burst);
        self.control.refill(now, r.control_frames_rate, r.control_frames_rate);
        let full = |b: &TokenBucket, burst: u64| b.milli >= burst.saturating_mul(1000);
        let mut rested = full(&self.messages, r.publish_rate)
            && full(&self.bytes, r.publish_bytes_burst)
            && full(&self.control, r.control_frames_rate);
        for op in Op::ALL {
            let (rate, burst) = op.rate(r);
            self.ops[op as usize].refill(now, rate, burst);
            rested &= full(&self.ops[op as usize], burst);
        }
        let quiet = |w: &Refusals| w.count == 0 || now.wrapping_sub(w.start) >= SECOND;
        rested
            && quiet(&self.refused_messages)
            && quiet(&self.refused_bytes)
            && quiet(&self.refused_control)
            && self.refused_ops.iter().all(quiet)
    }

    /// A `pub` whose `data` is `len` bytes, at tick `now`. It takes one message token and
    /// `len` byte tokens, or nothing when either bucket is short; unlimited rates (0) are not
    /// consulted.
    pub fn publish(&mut self, now: Tick, r: &Rates, len: u64) -> Verdict {
        let mut refused = None;
        let mut wait = 0;
        if r.publish_rate > 0 {
            self.messages.refill(now, r.publish_rate, r.publish_rate);
            let w = self.messages.wait_ms(1, r.publish_rate);
            if w > 0 {
                (refused, wait) = (Some(Limit::PublishRate), w);
            }
        }
        if r.publish_bytes_rate > 0 {
            self.bytes.refill(now, r.publish_bytes_rate, r.publish_bytes_burst);
            let w = self.bytes.wait_ms(len, r.publish_bytes_rate);
            if w > 0 {
                refused.get_or_insert(Limit::PublishBytesRate);
                wait = wait.max(w);
            }
        }
        let Some(limit) = refused else {
            if r.publish_rate > 0 {
                self.messages.take(1);
            }
            if r.publish_bytes_rate > 0 {
                self.bytes.take(len);
            }
            return Verdict::Allow;
        };
        let mut over = None;
        if r.publish_rate > 0 && self.refused_messages.add(now, 1) > CLOSE_AFTER_BURSTS.saturating_mul(r.publish_rate) {
            over = Some(Limit::PublishRate);
        }
        if r.publish_bytes_rate > 0
            && self.refused_bytes.add(now, len) > CLOSE_AFTER_BURSTS.saturating_mul(r.publish_bytes_burst)
        {
            over.get_or_insert(Limit::PublishBytesRate);
        }
        Verdict::Refuse { limit, retry_after_ms: wait, close: over }
    }

    /// A control frame that counts (a ping, or a pong that answers none of our pings) at tick
    /// `now`, with `control_frames_rate` > 0.
    pub fn control(&mut self, now: Tick, r: &Rates) -> Verdict {
        let rate = r.control_frames_rate;
        self.control.refill(now, rate, rate);
        let wait = self.control.wait_ms(1, rate);
        if wait == 0 {
            self.control.take(1);
            return Verdict::Allow;
        }
        let over = self.refused_control.add(now, 1) > CLOSE_AFTER_BURSTS.saturating_mul(rate);
        Verdict::Refuse {
            limit: Limit::ControlFrames,
            retry_after_ms: wait,
            close: over.then_some(Limit::ControlFrames),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(publish_rate: u64, publish_bytes_rate: u64, burst: u64, control: u64) -> Rates {
        Rates {
            publish_rate,
            publish_bytes_rate,
            publish_bytes_burst: burst,
            control_frames_rate: control,
            ..Rates::default()
        }
    }

    #[test]
    fn bucket_starts_full_refills_at_its_rate_and_caps_at_its_burst() {
        // 5 tokens per second, burst 5: 200 ms (20 ticks) per token.
        let mut b = TokenBucket::full(0, 5);
        assert_eq!(b.tokens(), 5);
        for _ in 0..5 {
            assert_eq!(b.wait_ms(1, 5), 0);
            b.take(1);
        }
        assert_eq!(b.wait_ms(1, 5), 200);
        b.refill(10, 5, 5);
        assert_eq!((b.tokens(), b.wait_ms(1, 5)), (0, 100), "half a token after 100 ms");
        b.refill(20, 5, 5);
        assert_eq!((b.tokens(), b.wait_ms(1, 5)), (1, 0));
        b.refill(10_000, 5, 5);
        assert_eq!(b.tokens(), 5, "never more than the burst, however long idle");
    }

    #[test]
    fn wait_is_rounded_up_to_whole_ticks_and_is_enough() {
        // 3 per second: 333.3 ms per token, so the wait is 340 ms (34 ticks), never 330.
        let mut b = TokenBucket::full(0, 3);
        b.take(3);
        let w = b.wait_ms(1, 3);
        assert_eq!(w, 340);
        let mut later = b;
        later.refill((w / TICK_MS) as Tick, 3, 3);
        assert_eq!(later.wait_ms(1, 3), 0, "retrying after retry_after_ms succeeds");
        let mut early = b;
        early.refill((w / TICK_MS) as Tick - 1, 3, 3);
        assert!(early.wait_ms(1, 3) > 0, "one tick earlier does not");
    }

    #[test]
    fn bucket_survives_extreme_rates_and_clock_wrap() {
        let mut b = TokenBucket::full(Tick::MAX - 5, u64::MAX);
        b.refill(3, u64::MAX, u64::MAX);
        assert_eq!(b.wait_ms(u64::MAX / 1000, u64::MAX), 0);
        let mut slow = TokenBucket::full(Tick::MAX - 5, 1);
        slow.take(1);
        slow.refill(Tick::MAX, 1, 1);
        assert_eq!(slow.wait_ms(1, 1), 950, "50 ms of refill across ticks near the wrap");
        slow.refill(4, 1, 1);
        assert_eq!(slow.wait_ms(1, 1), 900, "another 50 ms across the wrap");
    }

    #[test]
    fn publish_rate_refuses_with_the_wait_then_closes_past_ten_bursts_in_a_second() {
        let r = rates(2, 0, 0, 0);
        let mut l = Limiter::new(0, &r);
        assert_eq!(l.publish(0, &r, 10), Verdict::Allow);
        assert_eq!(l.publish(0, &r, 10), Verdict::Allow);
        assert_eq!(
            l.publish(0, &r, 10),
            Verdict::Refuse { limit: Limit::PublishRate, retry_after_ms: 500, close: None }
        );
        // Half a second later one token is back.
        assert_eq!(l.publish(50, &r, 10), Verdict::Allow);
        // A flood within one second: refusals 2..=20 keep the connection, the 21st (past
        // 10 × 2) closes it. The window opened at tick 0 with one refusal, so 19 more fit.
        for i in 2..=20 {
            match l.publish(60, &r, 10) {
                Verdict::Refuse { close: None, limit: Limit::PublishRate, .. } => {}
                v => panic!("refusal {i}: {v:?}"),
            }
        }
        assert!(matches!(l.publish(60, &r, 10), Verdict::Refuse { close: Some(Limit::PublishRate), .. }));
    }

    #[test]
    fn refusal_window_restarts_after_a_second() {
        let r = rates(1, 0, 0, 0);
        let mut l = Limiter::new(0, &r);
        assert_eq!(l.publish(0, &r, 1), Verdict::Allow);
        // 10 refusals per window are tolerated (10 × rate 1); windows a second apart reset.
        for window in 0..5 {
            let t = window * (SECOND + 1) + 1;
            l.messages = TokenBucket::full(t, 0);
            for _ in 0..10 {
                assert!(matches!(l.publish(t, &r, 1), Verdict::Refuse { close: None, .. }), "window {window}");
            }
        }
        let t = 4 * (SECOND + 1) + 2;
        l.messages = TokenBucket::full(t, 0);
        assert!(matches!(l.publish(t, &r, 1), Verdict::Refuse { close: Some(_), .. }));
    }

    #[test]
    fn bytes_bucket_counts_data_bytes_and_names_itself() {
        // 1000 bytes per second, burst 1000.
        let r = rates(0, 1000, 1000, 0);
        let mut l = Limiter::new(0, &r);
        assert_eq!(l.publish(0, &r, 600), Verdict::Allow);
        assert_eq!(
            l.publish(0, &r, 600),
            Verdict::Refuse { limit: Limit::PublishBytesRate, retry_after_ms: 200, close: None }
        );
        assert_eq!(l.publish(0, &r, 400), Verdict::Allow, "a refusal takes nothing");
        // Refused bytes beyond 10 × the burst (10,000) within a second close the connection:
        // 600 so far, 15 more refusals make 9,600, the next one 10,200.
        for _ in 0..15 {
            assert!(matches!(l.publish(1, &r, 600), Verdict::Refuse { close: None, .. }));
        }
        assert_eq!(
            l.publish(1, &r, 600),
            Verdict::Refuse {
                limit: Limit::PublishBytesRate,
                retry_after_ms: 590,
                close: Some(Limit::PublishBytesRate)
            }
        );
    }

    #[test]
    fn both_buckets_must_hold_enough_and_the_wait_covers_both() {
        let r = rates(10, 100, 100, 0);
        let mut l = Limiter::new(0, &r);
        assert_eq!(l.publish(0, &r, 100), Verdict::Allow);
        // The message bucket has 9 left; the bytes bucket is empty for 1 s.
        assert_eq!(
            l.publish(0, &r, 100),
            Verdict::Refuse { limit: Limit::PublishBytesRate, retry_after_ms: 1000, close: None }
        );
        assert_eq!(l.messages.tokens(), 9, "the message token was not taken");
        for _ in 0..9 {
            l.messages.take(1);
        }
        assert_eq!(
            l.publish(0, &r, 100),
            Verdict::Refuse { limit: Limit::PublishRate, retry_after_ms: 1000, close: None },
            "the message bucket is named first; the wait is the longer of the two"
        );
        assert_eq!(l.publish(100, &r, 100), Verdict::Allow);
    }

    #[test]
    fn control_frames_within_the_rate_pass_and_a_flood_closes() {
        let r = rates(0, 0, 0, 100);
        let mut l = Limiter::new(0, &r);
        for _ in 0..100 {
            assert_eq!(l.control(0, &r), Verdict::Allow);
        }
        for _ in 0..1000 {
            assert!(matches!(l.control(0, &r), Verdict::Refuse { close: None, limit: Limit::ControlFrames, .. }));
        }
        assert!(matches!(l.control(0, &r), Verdict::Refuse { close: Some(Limit::ControlFrames), .. }));
        // A client that pings once a second forever is never refused.
        let mut steady = Limiter::new(0, &rates(0, 0, 0, 1));
        for s in 0..1000 {
            assert_eq!(steady.control(s * SECOND, &rates(0, 0, 0, 1)), Verdict::Allow);
        }
    }
}
