//! A global allocator for memory tests: the system allocator, counting the bytes it holds
//! live ([`LIVE`]) and the most it held ([`PEAK`]), process-wide and per thread
//! ([`thread_peak_since`], for tests that run in parallel). A test installs it with
//! `#[global_allocator] static ALLOC: counting_alloc::Counting = counting_alloc::Counting;`.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering::Relaxed};

/// The system allocator, counting live bytes.
pub struct Counting;

pub static LIVE: AtomicUsize = AtomicUsize::new(0);
pub static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Live allocations by size in bytes (index [`SIZE_CAP`] counts every larger one), for tests
/// that say where their bytes go ([`live_by_size`]).
pub const SIZE_CAP: usize = 8192;
static BY_SIZE: [AtomicIsize; SIZE_CAP + 1] = [const { AtomicIsize::new(0) }; SIZE_CAP + 1];

fn by_size(size: usize, d: isize) {
    BY_SIZE[size.min(SIZE_CAP)].fetch_add(d, Relaxed);
}

/// The live allocations now, by size: `(size, count)` for every size with a live one
/// (`SIZE_CAP` stands for "that or more").
pub fn live_by_size() -> Vec<(usize, isize)> {
    BY_SIZE.iter().enumerate().map(|(s, c)| (s, c.load(Relaxed))).filter(|&(_, c)| c != 0).collect()
}

thread_local! {
    // Const-initialised and without destructors: usable from inside the allocator. Signed,
    // since a thread may free what another allocated.
    static THREAD_LIVE: Cell<isize> = const { Cell::new(0) };
    static THREAD_PEAK: Cell<isize> = const { Cell::new(0) };
}

fn thread_grow(n: usize) {
    let _ = THREAD_LIVE.try_with(|live| {
        let now = live.get().wrapping_add(n as isize);
        live.set(now);
        let _ = THREAD_PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn thread_shrink(n: usize) {
    let _ = THREAD_LIVE.try_with(|live| live.set(live.get().wrapping_sub(n as isize)));
}

/// A mark of this thread's allocations, for [`thread_peak_since`].
pub fn thread_mark() -> isize {
    let live = THREAD_LIVE.with(Cell::get);
    THREAD_PEAK.with(|p| p.set(live));
    live
}

/// The most bytes this thread held at once since `mark`, beyond what it held at `mark`.
pub fn thread_peak_since(mark: isize) -> usize {
    THREAD_PEAK.with(Cell::get).saturating_sub(mark).max(0) as usize
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
        PEAK.fetch_max(live, Relaxed);
        thread_grow(layout.size());
        by_size(layout.size(), 1);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        thread_shrink(layout.size());
        by_size(layout.size(), -1);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            let live = LIVE.fetch_add(new_size - layout.size(), Relaxed) + new_size - layout.size();
            PEAK.fetch_max(live, Relaxed);
            thread_grow(new_size - layout.size());
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Relaxed);
            thread_shrink(layout.size() - new_size);
        }
        by_size(layout.size(), -1);
        by_size(new_size, 1);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
