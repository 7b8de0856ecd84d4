//! A hashed timer wheel: one entry per connection deadline, no timer object per ping.
//!
//! The wheel knows nothing of what a deadline means. The connection keeps its own `due` tick;
//! when an entry fires the core compares it with the connection's current `due` and ignores the
//! entry if they differ (the deadline moved, or the slot was reused by another connection: ids
//! carry a generation). Moving a deadline is therefore one push, never a search, and a
//! connection has at most a couple of live entries.
//!
//! The clock sleeps until the wheel's next due tick ([`TimerWheel::next_due`]) instead of
//! waking every tick, so that question must be cheap with 15,000 entries or more: an
//! occupancy bitmap (one bit per slot) finds the next non-empty slot 64 slots per word, and
//! each slot keeps the earliest due tick of its entries, so a slot holding only entries of a
//! later turn is recognised without walking it.

use super::ConnId;
/// Re-exported where the engine has always found it.
pub use crate::tick::TICK_MS;

/// Whether tick `a` comes before tick `b` (wrap-aware over half of `u32`).
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// One slot: its entries and the earliest due tick among them (meaningless while empty).
#[derive(Default)]
struct Slot {
    entries: Vec<(ConnId, u32)>,
    min_due: u32,
}

/// A timer wheel of `2^k` slots of [`TICK_MS`] each; deadlines beyond one turn wait in their
/// slot for the right turn.
pub struct TimerWheel {
    slots: Vec<Slot>,
    /// Bit `i % 64` of word `i / 64` is set when slot `i` holds an entry.
    occupied: Vec<u64>,
    /// The last tick whose slot has been processed.
    now: u32,
}

impl TimerWheel {
    /// A wheel with `slots` slots (rounded up to a power of two, at least 64) whose clock
    /// starts at `now`.
    pub fn new(slots: usize, now: u32) -> Self {
        let n = slots.next_power_of_two().max(64);
        TimerWheel { slots: (0..n).map(|_| Slot::default()).collect(), occupied: vec![0; n / 64], now }
    }

    /// The last processed tick.
    pub fn now(&self) -> u32 {
        self.now
    }

    /// Files `id` to fire at tick `due` (a due tick not after [`now`](Self::now) fires on the
    /// next advance, as if due at `now + 1`). Returns the tick the entry was filed for.
    pub fn schedule(&mut self, id: ConnId, due: u32) -> u32 {
        let next = self.now.wrapping_add(1);
        // Wrap-aware max: ticks are u32 (10 ms each, a wrap every ~497 days).
        let due = if before(due, next) { next } else { due };
        let i = due as usize & (self.slots.len() - 1);
        let slot = &mut self.slots[i];
        if slot.entries.is_empty() || before(due, slot.min_due) {
            slot.min_due = due;
        }
        slot.entries.push((id, due));
        self.occupied[i / 64] |= 1 << (i % 64);
        due
    }

    /// Advances the clock to `to`, appending every `(id, due)` whose tick has come to `fired`.
    pub fn advance(&mut self, to: u32, fired: &mut Vec<(ConnId, u32)>) {
        let mask = self.slots.len() - 1;
        // More than one turn behind (a stalled core): every slot is visited once.
        let steps = to.wrapping_sub(self.now).min(self.slots.len() as u32);
        let start = to.wrapping_sub(steps);
        for t in 1..=steps {
            let i = start.wrapping_add(t) as usize & mask;
            if self.occupied[i / 64] & (1 << (i % 64)) == 0 {
                continue;
            }
            let slot = &mut self.slots[i];
            if !before(to, slot.min_due) {
                let mut min = None::<u32>;
                let mut k = 0;
                while k < slot.entries.len() {
                    let due = slot.entries[k].1;
                    if !before(to, due) {
                        fired.push(slot.entries.swap_remove(k));
                    } else {
                        min = Some(min.map_or(due, |m| if before(due, m) { due } else { m }));
                        k += 1;
                    }
                }
                if let Some(m) = min {
                    slot.min_due = m;
                }
                // An emptied slot frees its buffer: 4,096 slots that each keep one, allocated
                // at scattered times among short-lived blocks, pin heap pages that never go
                // back to the kernel once the connections left (`cargo bench --bench soak`).
                if slot.entries.is_empty() {
                    slot.entries = Vec::new();
                } else if slot.entries.capacity() > 64 && slot.entries.len() < slot.entries.capacity() / 4 {
                    slot.entries.shrink_to(slot.entries.len() * 2);
                }
            }
            if slot.entries.is_empty() {
                self.occupied[i / 64] &= !(1 << (i % 64));
            }
        }
        self.now = to;
    }

    /// The earliest due tick of any entry filed (live or stale), `None` when the wheel is
    /// empty; always after [`now`](Self::now). Costs one bitmap word per 64 slots up to the
    /// first slot holding an entry of the current turn: at worst one pass over the bitmap
    /// (64 words for 4096 slots) plus one comparison per occupied slot.
    pub fn next_due(&self) -> Option<u32> {
        let n = self.slots.len();
        let mask = n - 1;
        let mut best: Option<u32> = None;
        // Slots in tick order from now + 1: offset k (1..=n) is tick now + k.
        let first = self.now.wrapping_add(1) as usize & mask;
        let mut k = 0usize;
        while k < n {
            let i = (first + k) & mask;
            let word = self.occupied[i / 64] >> (i % 64);
            if word == 0 {
                // Nothing more in this word: jump to the next word's first slot.
                k += 64 - i % 64;
                continue;
            }
            let skip = word.trailing_zeros() as usize;
            k += skip;
            if k >= n {
                break;
            }
            let i = (first + k) & mask;
            let min = self.slots[i].min_due;
            if best.is_none_or(|b| before(min, b)) {
                best = Some(min);
            }
            // An entry of this turn at offset k + 1 is due at now + k + 1; any slot further on
            // only holds ticks after that, so nothing can beat it.
            if min == self.now.wrapping_add(k as u32 + 1) {
                break;
            }
            k += 1;
        }
        best
    }

    /// Number of entries filed (live or stale), for tests and metrics.
    pub fn len(&self) -> usize {
        self.slots.iter().map(|s| s.entries.len()).sum()
    }

    /// Whether no entry is filed.
    pub fn is_empty(&self) -> bool {
        self.occupied.iter().all(|w| *w == 0)
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
        let mut w = TimerWheel::new(64, 0);
        w.schedule(id(1), 200);
        let mut f = Vec::new();
        for t in 1..200 {
            w.advance(t, &mut f);
            assert!(f.is_empty(), "fired early at {t}");
        }
        w.advance(200, &mut f);
        assert_eq!(f, vec![(id(1), 200)]);
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

    #[test]
    fn next_due_is_the_earliest_entry() {
        let mut w = TimerWheel::new(64, 0);
        assert_eq!(w.next_due(), None);
        w.schedule(id(1), 40);
        w.schedule(id(2), 7);
        w.schedule(id(3), 7);
        assert_eq!(w.next_due(), Some(7));
        let mut f = Vec::new();
        w.advance(7, &mut f);
        assert_eq!(f.len(), 2);
        assert_eq!(w.next_due(), Some(40));
        w.advance(40, &mut f);
        assert_eq!(w.next_due(), None);
        assert!(w.is_empty());
    }

    #[test]
    fn next_due_sees_past_a_slot_holding_only_a_later_turn() {
        let mut w = TimerWheel::new(64, 0);
        // Slot 5 holds tick 5 + 3 turns; slot 30 holds tick 30 of this turn.
        w.schedule(id(1), 5 + 3 * 64);
        w.schedule(id(2), 30);
        assert_eq!(w.next_due(), Some(30));
        let mut f = Vec::new();
        w.advance(30, &mut f);
        // Only the entry of a later turn is left, and its slot has been passed once.
        assert_eq!(w.next_due(), Some(5 + 3 * 64));
        w.advance(5 + 3 * 64 - 1, &mut f);
        assert_eq!(f, vec![(id(2), 30)], "the later turn's entry fired early");
        w.advance(5 + 3 * 64, &mut f);
        assert_eq!(f.last(), Some(&(id(1), 5 + 3 * 64)));
    }

    #[test]
    fn next_due_of_a_slot_mixing_turns_is_its_earliest() {
        let mut w = TimerWheel::new(64, 0);
        w.schedule(id(1), 10 + 64);
        w.schedule(id(2), 10);
        w.schedule(id(3), 10 + 128);
        assert_eq!(w.next_due(), Some(10));
        let mut f = Vec::new();
        w.advance(10, &mut f);
        assert_eq!(f, vec![(id(2), 10)]);
        assert_eq!(w.next_due(), Some(10 + 64));
    }

    #[test]
    fn next_due_across_the_u32_wrap() {
        let mut w = TimerWheel::new(64, u32::MAX - 5);
        w.schedule(id(1), 3); // 9 ticks ahead, after the wrap
        w.schedule(id(2), u32::MAX - 1); // 4 ticks ahead, before it
        assert_eq!(w.next_due(), Some(u32::MAX - 1));
        let mut f = Vec::new();
        w.advance(u32::MAX, &mut f);
        assert_eq!(f, vec![(id(2), u32::MAX - 1)]);
        assert_eq!(w.next_due(), Some(3));
        // A later turn across the wrap.
        w.schedule(id(3), 2 + 64 * 5);
        assert_eq!(w.next_due(), Some(3));
        w.advance(3, &mut f);
        assert_eq!(w.next_due(), Some(2 + 64 * 5));
    }

    #[test]
    fn past_due_is_next_tick() {
        let mut w = TimerWheel::new(64, 100);
        assert_eq!(w.schedule(id(1), 90), 101);
        assert_eq!(w.next_due(), Some(101));
    }

    /// Against a plain list: random schedules and advances (with big jumps and entries many
    /// turns ahead) near the u32 wrap; `next_due` is always the list's minimum and entries
    /// fire exactly at their due tick when the clock passes it tick by tick.
    #[test]
    fn next_due_matches_a_model() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = |n: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % u64::from(n)) as u32
        };
        let start = u32::MAX - 3000;
        let mut w = TimerWheel::new(256, start);
        let mut model: Vec<(ConnId, u32)> = Vec::new();
        let mut now = start;
        let mut f = Vec::new();
        for step in 0..20_000u32 {
            if rnd(3) == 0 {
                let ahead = match rnd(4) {
                    0 => rnd(3) + 1,
                    1 => rnd(256) + 1,
                    _ => rnd(5000) + 1,
                };
                let due = w.schedule(id(step), now.wrapping_add(ahead));
                model.push((id(step), due));
            } else {
                let to = now.wrapping_add(if rnd(50) == 0 { rnd(600) } else { rnd(3) });
                w.advance(to, &mut f);
                let mut expect: Vec<_> = model.iter().copied().filter(|e| !before(to, e.1)).collect();
                model.retain(|e| before(to, e.1));
                f.sort_by_key(|e| (e.0.key, e.1));
                expect.sort_by_key(|e| (e.0.key, e.1));
                assert_eq!(f, expect, "fired at {to}");
                f.clear();
                now = to;
            }
            let want = model.iter().map(|e| e.1).min_by_key(|d| d.wrapping_sub(now));
            assert_eq!(w.next_due(), want, "step {step} at {now}");
        }
    }
}
