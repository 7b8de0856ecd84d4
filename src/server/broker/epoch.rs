//! Channel epochs of the memory broker: which epoch a channel gets when its home creates it,
//! and at which seq its numbering starts. Sans-IO, one [`Numbering`] per home core.
//!
//! # The rule
//! An epoch names one numbering of a channel: under one epoch a seq is never given to two
//! messages. The memory broker keeps that promise with one *process epoch* and tombstones:
//!
//! - Every channel a home core creates gets the core's current epoch `E`, which starts as the
//!   process epoch (random, the same on every core, new at every process start). A channel
//!   that was forgotten and comes back therefore comes back under the same `E`: a client that
//!   subscribed (seq 0, epoch `E`) to a channel nobody had published to, left (which forgets
//!   the channel at once), and resumes with `from: 0, epoch: E` gets every message published
//!   since, not a reset.
//! - A channel that was published to under `E` and is forgotten by the idle sweep leaves a
//!   tombstone: a 64-bit keyed hash of its name → its head. When the name comes back, its
//!   numbering continues after that head under `E`. Its history is empty, so a resume from
//!   inside the old range gets `reset` (`evicted`, with `oldest`), a resume from the old head
//!   continues with no gap, and no seq is ever reused under `E`.
//! - The tombstones of a core are bounded ([`TOMBSTONES_PER_CORE`]). When a tombstone would
//!   not fit, the core *rotates*: it picks a new random `E` for the channels it creates from
//!   then on and clears its tombstones. Channels still in the table keep the epoch they were
//!   created with. A channel created after the rotation starts at seq 1 under the new epoch,
//!   so a resume with the old epoch is a `reset` (`epoch`): safe, never a silent gap.
//!
//! So an epoch changes only at a process start and at a rotation; a channel's epoch never
//! changes while it stays in its home's table.
//!
//! # Why tombstones stay after use
//! A tombstone is a lower bound, not a record of one channel: it is kept when its name comes
//! back (and raised to the new head when that incarnation is forgotten in turn). Removing it on
//! use would be unsafe under a hash collision: a name that never had a tombstone but shares the
//! hash of a forgotten one would consume it, and the forgotten channel, coming back later,
//! would restart at seq 1 under the same epoch — reusing seqs a client may hold. Kept, a
//! colliding tombstone only makes a channel's numbering start higher than it needs to: a
//! resume into the skipped range is answered `reset` (`evicted`), never with wrong data. The
//! hash is keyed per core (SipHash with a random key), so clients cannot craft collisions; by
//! chance, a new name hits one of `n` tombstones with probability `n / 2^64` (about 5·10⁻¹⁵ at
//! the bound). The cost of keeping them: a name that is forgotten, comes back and is forgotten
//! again still takes one entry, so the bound counts distinct names published to and forgotten
//! under `E` on this core.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

/// A fresh random epoch: 16 hex digits. The process epoch is one of these (see the module
/// doc), and so is the epoch a core rotates to.
pub fn new_epoch() -> Arc<str> {
    format!("{:016x}", rand::random::<u64>()).into()
}

/// Tombstones one home core keeps before it rotates its epoch. Costs up to
/// [`TOMBSTONES_BYTES_PER_CORE`] per core.
pub const TOMBSTONES_PER_CORE: usize = 100_000;

/// Bytes a full tombstone table takes on one core. A tombstone is a `u64 → u64` entry of a
/// `HashMap`: 16 bytes plus a control byte per slot, at a power-of-two number of slots at most
/// 7/8 full, so [`TOMBSTONES_PER_CORE`] (100,000) take 131,072 slots: 2,228,240 bytes, about
/// 2.2 MB per core (measured by `tests/epoch_tombstones_memory.rs`). A rotation clears the
/// table but keeps its allocation, so a core that has filled it once holds that much for the
/// life of the process; while it grows to that size, the old table (half as large) is held
/// too for a moment.
pub const TOMBSTONES_BYTES_PER_CORE: usize = 2_228_240;

/// The epoch a home core gives the channels it creates, and the tombstones of the channels it
/// forgot (see the module doc).
pub struct Numbering {
    /// The epoch of channels created from now on.
    epoch: Arc<str>,
    /// Keyed hash of a forgotten channel's name → the highest head it had under `epoch`.
    tombstones: HashMap<u64, u64>,
    max_tombstones: usize,
    keys: RandomState,
    rotations: u64,
}

impl Numbering {
    /// Numbering under `epoch` (the process epoch), keeping at most `max_tombstones`
    /// tombstones (at least 1) before rotating.
    pub fn new(epoch: Arc<str>, max_tombstones: usize) -> Numbering {
        Numbering {
            epoch,
            tombstones: HashMap::new(),
            max_tombstones: max_tombstones.max(1),
            keys: RandomState::new(),
            rotations: 0,
        }
    }

    fn key(&self, ch: &str) -> u64 {
        self.keys.hash_one(ch)
    }

    /// The epoch a channel created now gets.
    pub fn epoch(&self) -> &Arc<str> {
        &self.epoch
    }

    /// Epoch and head for channel `ch`, being created now: the current epoch, and the head
    /// its tombstone recorded (0 without one), so its next message gets head + 1.
    pub fn start(&self, ch: &str) -> (Arc<str>, u64) {
        let head = self.tombstones.get(&self.key(ch)).copied().unwrap_or(0);
        (self.epoch.clone(), head)
    }

    /// Channel `ch`, numbered under `epoch` up to `head`, is being forgotten. Published under
    /// the current epoch, it leaves a tombstone (raised to `head` if one is there); when the
    /// table is full the core rotates instead, and the channel's epoch is no longer the one
    /// new channels get. Returns whether it rotated.
    pub fn forget(&mut self, ch: &str, epoch: &str, head: u64) -> bool {
        if head == 0 || epoch != &*self.epoch {
            // Nothing was numbered, or a channel of an earlier epoch: under the current epoch
            // its name starts at seq 1, which no one has seen.
            return false;
        }
        let key = self.key(ch);
        if let Some(t) = self.tombstones.get_mut(&key) {
            *t = (*t).max(head);
            return false;
        }
        if self.tombstones.len() >= self.max_tombstones {
            self.epoch = new_epoch();
            self.tombstones.clear();
            self.rotations += 1;
            return true;
        }
        self.tombstones.insert(key, head);
        false
    }

    /// Tombstones kept now.
    pub fn tombstones(&self) -> usize {
        self.tombstones.len()
    }

    /// How many times this core has rotated its epoch.
    pub fn rotations(&self) -> u64 {
        self.rotations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_channel_continues_after_its_head() {
        let mut n = Numbering::new("e".into(), 10);
        assert_eq!(n.start("a"), ("e".into(), 0));
        assert!(!n.forget("a", "e", 0), "nothing numbered: no tombstone");
        assert_eq!(n.tombstones(), 0);
        n.forget("a", "e", 7);
        assert_eq!(n.start("a"), ("e".into(), 7));
        assert_eq!(n.start("a").1, 7, "kept after use");
        n.forget("a", "e", 7);
        n.forget("a", "e", 3);
        assert_eq!(n.start("a").1, 7, "never lowered");
        n.forget("a", "e", 9);
        assert_eq!((n.start("a").1, n.tombstones()), (9, 1));
        assert_eq!(n.start("b").1, 0);
    }

    #[test]
    fn an_earlier_epoch_leaves_no_tombstone() {
        let mut n = Numbering::new("e".into(), 10);
        n.forget("a", "old", 5);
        assert_eq!((n.start("a").1, n.tombstones()), (0, 0));
    }

    #[test]
    fn a_full_table_rotates_the_epoch() {
        let mut n = Numbering::new("e".into(), 2);
        assert!(!n.forget("a", "e", 1));
        assert!(!n.forget("b", "e", 2));
        assert!(!n.forget("a", "e", 4), "raising a tombstone needs no room");
        assert!(n.forget("c", "e", 3));
        let (epoch, head) = n.start("a");
        assert_ne!(&*epoch, "e");
        assert_eq!((head, n.tombstones(), n.rotations()), (0, 0, 1));
        // "c" was numbered under "e", which new channels no longer get: no tombstone needed.
        assert_eq!(n.start("c").1, 0);
        assert!(!n.forget("a", "e", 4), "a channel of the old epoch is forgotten without a trace");
        assert_eq!(n.tombstones(), 0);
        n.forget("a", &epoch, 2);
        assert_eq!(n.start("a"), (epoch, 2));
    }

    #[test]
    fn epochs_are_16_hex_digits() {
        let e = new_epoch();
        assert_eq!(e.len(), 16);
        assert!(e.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
