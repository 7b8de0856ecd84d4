//! Memory that comes back: when a core holds far fewer connections or channels than its
//! tables were sized for, the tables give their spare capacity back and the allocator is asked
//! to return its free pages to the kernel (docs/operations.md, "Memory over time").
//!
//! Without this, a core that once held N connections keeps the slab of N sessions, the channel
//! maps sized for its peak, and the allocator keeps the pages those freed (glibc's arenas hand
//! a page back only when it is at the top of the heap); RSS then stays near its peak after the
//! clients leave. Shrinking never moves a live entry: a slab gives back only its vacant tail
//! (slab keys are the connections' and channels' ids), a map rehashes its live entries.
//!
//! When: [`CoreState::reclaim_if_spare`] runs after each idle-channel sweep (every 5 s while
//! the core's broker holds channels) and when the core's last connection leaves. It does
//! nothing unless some table holds at least [`SPARE_MIN`] spare slots and 3/4 of its capacity
//! is spare, so a busy core never pays for it; the allocator call that follows costs a walk of
//! the free lists (about a millisecond per few MB returned).

use super::core::CoreState;

/// Spare slots a table must hold before it is shrunk: below this, what it would give back is
/// not worth a reallocation (a 1,024-entry session slab is about 200 KB).
pub const SPARE_MIN: usize = 1024;

/// Whether a table of `capacity` slots holding `len` has enough spare to shrink.
pub fn spare(len: usize, capacity: usize) -> bool {
    capacity >= len.saturating_mul(4) && capacity - len >= SPARE_MIN
}

impl CoreState {
    /// Shrinks the core's tables that hold mostly spare capacity (sessions, local channels,
    /// the broker's channel tables, the bus queues of [`Router`](super::bus::Router)) and,
    /// when one was shrunk, returns the allocator's free memory to the kernel. Returns whether
    /// it shrank anything.
    pub fn reclaim_if_spare(&mut self) -> bool {
        let mut shrank = false;
        let slab = &mut self.conns.slab;
        if spare(slab.len(), slab.capacity()) {
            slab.shrink_to_fit();
            self.conns.dirty.shrink_to_fit();
            self.conns.flushing.shrink_to_fit();
            self.conns.held.shrink_to_fit();
            shrank = true;
        }
        shrank |= self.local.shrink_if_spare();
        shrank |= self.broker.shrink_if_spare();
        shrank |= self.router.shrink_if_spare();
        if shrank {
            release_free_memory();
        }
        shrank
    }
}

/// Allocations from this size up get pages of their own with glibc (`M_MMAP_THRESHOLD`):
/// 128 KiB, glibc's initial value.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Sets the allocator up, once at start, so that large freed blocks go back to the kernel: with
/// glibc, `M_MMAP_THRESHOLD` is fixed at [`MMAP_THRESHOLD`]. Left alone, glibc raises that
/// threshold to the size of each large block freed (up to 32 MiB), so once a core's session
/// slab or channel map was freed or shrunk, its next one comes from the heap, where its pages
/// stay after it is freed again: RSS then crept up cycle after cycle of connect / disconnect
/// (`cargo bench --bench soak`). Nothing with mimalloc or another libc.
pub fn configure_allocator() {
    #[cfg(all(not(feature = "mimalloc"), target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of glibc's allocator; called before the cores start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
    }
}

/// Asks the allocator to return its free pages to the kernel: `malloc_trim(0)` with glibc's
/// allocator, `mi_collect` with mimalloc (feature `mimalloc`); nothing elsewhere.
pub fn release_free_memory() {
    #[cfg(feature = "mimalloc")]
    {
        extern "C" {
            fn mi_collect(force: bool);
        }
        // SAFETY: mimalloc's own entry point, callable from any thread at any time.
        unsafe { mi_collect(true) };
    }
    #[cfg(all(not(feature = "mimalloc"), target_os = "linux", target_env = "gnu"))]
    // SAFETY: glibc's malloc_trim takes the arena locks itself; callable at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_mostly_spare_table_is_shrunk() {
        assert!(!spare(0, 0));
        assert!(!spare(0, SPARE_MIN - 1), "too little to give back");
        assert!(spare(0, SPARE_MIN));
        assert!(spare(500, 4000));
        assert!(!spare(1500, 4000), "busy: less than 3/4 spare");
    }
}
