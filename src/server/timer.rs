//! A hashed timer wheel: one entry per connection deadline, no timer object per ping.
//!
//! The wheel knows nothing of what a deadline means. The connection keeps its own `due` tick;
//! when an entry fires the core compares it with the connection's current `due` and ignores the
//! entry if they differ (the deadline moved, or the slot was reused by another connection: ids
//! carry a generation). Moving a deadline is therefore one push, never a search, and a
//! connection has at most a couple of live entries.

use super::ConnId;

/// Ticks are this many milliseconds. Pings are spread at this granularity.
pub const TICK_MS: u64 = 10;

/// A timer wheel of `2^k` slots of [`TICK_MS`] each; deadlines beyond one turn wait in their
/// slot for the right turn.
pub struct TimerWheel {
    slots: Vec<Vec<(ConnId, u32)>>,
    /// The last tick whose slot has been processed.
    now: u32,
}

impl TimerWheel {
    /// A wheel with `slots` slots (rounded up to a power of two) whose clock starts at `now`.
    pub fn new(slots: usize, now: u32) -> Self {
        let n = slots.next_power_of_two().max(2);
        TimerWheel { slots: (0..n).map(|_| Vec::new()).collect(), now }
    }

    /// The last processed tick.
    pub fn now(&self) -> u32 {
        self.now
    }

    /// Files `id` to fire at tick `due` (a due tick not after [`now`](Self::now) fires on the
    /// next advance).
    pub fn schedule(&mut self, id: ConnId, due: u32) {
        let next = self.now.wrapping_add(1);
        // Wrap-aware max: ticks are u32 (10 ms each, a wrap every ~497 days).
        let due = if (due.wrapping_sub(next) as i32) < 0 { next } else { due };
        let mask = self.slots.len() - 1;
        self.slots[due as usize & mask].push((id, due));
    }

    /// Advances the clock to `to`, appending every `(id, due)` whose tick has come to `fired`.
    pub fn advance(&mut self, to: u32, fired: &mut Vec<(ConnId, u32)>) {
        let mask = self.slots.len() - 1;
        // More than one turn behind (a stalled core): every slot is visited once.
        let steps = to.wrapping_sub(self.now).min(self.slots.len() as u32);
        let start = to.wrapping_sub(steps);
        for t in 1..=steps {
            let tick = start.wrapping_add(t);
            let slot = &mut self.slots[tick as usize & mask];
            let mut i = 0;
            while i < slot.len() {
                if slot[i].1.wrapping_sub(to) as i32 <= 0 {
                    fired.push(slot.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            if slot.capacity() > 64 && slot.len() < slot.capacity() / 4 {
                slot.shrink_to(slot.len() * 2);
            }
        }
        self.now = to;
    }

    /// Number of entries filed (live or stale), for tests and metrics.
    pub fn len(&self) -> usize {
        self.slots.iter().map(Vec::len).sum()
    }

    /// Whether no entry is filed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(k: u32) -> ConnId {
        ConnId { key: k, gen: 0 }
    }

    #[test]
    fn fires_at_due_tick_and_not_before() {
        let mut w = TimerWheel::new(8, 0);
        w.schedule(id(1), 3);
        w.schedule(id(2), 5);
        let mut f = Vec::new();
        w.advance(2, &mut f);
        assert!(f.is_empty());
        w.advance(3, &mut f);
        assert_eq!(f, vec![(id(1), 3)]);
        f.clear();
        w.advance(10, &mut f);
        assert_eq!(f, vec![(id(2), 5)]);
        assert!(w.is_empty());
    }

    #[test]
    fn deadlines_beyond_one_turn_wait_for_their_turn() {
        let mut w = TimerWheel::new(8, 0);
        w.schedule(id(1), 20);
        let mut f = Vec::new();
        for t in 1..20 {
            w.advance(t, &mut f);
            assert!(f.is_empty(), "fired early at {t}");
        }
        w.advance(20, &mut f);
        assert_eq!(f, vec![(id(1), 20)]);
    }

    #[test]
    fn past_due_fires_on_next_advance_and_big_jumps_fire_everything() {
        let mut w = TimerWheel::new(4, 100);
        w.schedule(id(1), 50);
        for k in 0..20 {
            w.schedule(id(10 + k), 101 + k);
        }
        let mut f = Vec::new();
        w.advance(1000, &mut f);
        assert_eq!(f.len(), 21);
    }

    #[test]
    fn clock_wraps_around_u32() {
        let mut w = TimerWheel::new(16, u32::MAX - 2);
        w.schedule(id(1), 2);
        let mut f = Vec::new();
        w.advance(u32::MAX, &mut f);
        assert!(f.is_empty());
        w.advance(2, &mut f);
        assert_eq!(f, vec![(id(1), 2)]);
    }
}
