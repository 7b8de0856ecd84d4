//! The memory a home core's full tombstone table costs (`server::broker::epoch`), measured by
//! counting the bytes the allocator hands out while `TOMBSTONES_PER_CORE` channels are
//! forgotten: the figure `epoch::TOMBSTONES_BYTES_PER_CORE` and docs/architecture.md state.
//! A rotation must not make it grow.
//!
//! `cargo test --release --test epoch_tombstones_memory -- --nocapture` prints the measurement.

mod counting_alloc;

use std::sync::atomic::Ordering::Relaxed;

use counting_alloc::{Counting, LIVE, PEAK};

use tether::server::broker::epoch::{new_epoch, Numbering, TOMBSTONES_BYTES_PER_CORE, TOMBSTONES_PER_CORE};

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn a_full_tombstone_table_costs_what_the_docs_say() {
    let names: Vec<String> = (0..=TOMBSTONES_PER_CORE).map(|i| format!("room:{i:08}")).collect();
    let epoch: std::sync::Arc<str> = "00000000000000e0".into();
    // The thread's random generator is set up (and allocated) by its first use: not ours.
    drop(new_epoch());
    let before = LIVE.load(Relaxed);
    PEAK.store(before, Relaxed);
    let mut n = Numbering::new(epoch.clone(), TOMBSTONES_PER_CORE);
    for (i, name) in names[..TOMBSTONES_PER_CORE].iter().enumerate() {
        assert!(!n.forget(name, &epoch, i as u64 + 1));
    }
    assert_eq!(n.tombstones(), TOMBSTONES_PER_CORE);
    let held = LIVE.load(Relaxed) - before;
    let peak = PEAK.load(Relaxed) - before;
    // One more: the core rotates, and the cleared table keeps its allocation.
    assert!(n.forget(&names[TOMBSTONES_PER_CORE], &epoch, 1));
    let after_rotation = LIVE.load(Relaxed) - before;
    eprintln!(
        "tombstones: {TOMBSTONES_PER_CORE} hold {held} B ({:.1} B each); peak while growing {peak} B; \
         after a rotation {after_rotation} B",
        held as f64 / TOMBSTONES_PER_CORE as f64
    );
    // The stated figure must not understate the cost, nor overstate it by more than 10%.
    assert!(held <= TOMBSTONES_BYTES_PER_CORE, "measured {held} B, docs say {TOMBSTONES_BYTES_PER_CORE}");
    assert!(
        held as f64 * 1.1 >= TOMBSTONES_BYTES_PER_CORE as f64,
        "measured {held} B, docs say {TOMBSTONES_BYTES_PER_CORE}"
    );
    // The new epoch string is the only allocation a rotation adds.
    assert!(after_rotation <= held + 64, "a rotation grew the table: {after_rotation} B after, {held} B before");
    drop(n);
}
