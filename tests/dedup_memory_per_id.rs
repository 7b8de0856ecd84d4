//! The memory one remembered publish id costs (`[dedup]`, `server::home::Dedup`), measured by
//! counting the bytes the allocator hands out while 1,000,000 ids are inserted: the figure
//! `docs/configuration.md`, `systemd/tether.toml` and `config::DEDUP_BYTES_PER_ID` state.
//!
//! `cargo test --release --test dedup_memory_per_id -- --nocapture` prints the measurement.

mod counting_alloc;

use std::sync::atomic::Ordering::Relaxed;

use counting_alloc::{Counting, LIVE, PEAK};

use tether::config::DEDUP_BYTES_PER_ID;
use tether::server::broker::home::Dedup;

#[global_allocator]
static ALLOC: Counting = Counting;

const IDS: usize = 1_000_000;

#[test]
fn one_million_ids_cost_what_the_docs_say() {
    // Ids of a typical shape (a UUID) on a few channels; the table stores a 128-bit hash of
    // (channel, id), so their length does not matter.
    let ids: Vec<String> = (0..IDS).map(|i| format!("0b6c1e1a-7f3d-4c2e-9a55-{i:012}")).collect();
    let before = LIVE.load(Relaxed);
    PEAK.store(before, Relaxed);
    let mut dedup = Dedup::new(300_000, IDS + 1);
    for (i, id) in ids.iter().enumerate() {
        dedup.insert(["news", "prices.btc", "chat:42"][i % 3], id, i as u64, i as u64 / 1000);
    }
    assert_eq!(dedup.len(), IDS);
    let held = LIVE.load(Relaxed) - before;
    let peak = PEAK.load(Relaxed) - before;
    let per_id = held as f64 / IDS as f64;
    let peak_per_id = peak as f64 / IDS as f64;
    eprintln!(
        "dedup: {IDS} ids hold {held} B ({per_id:.1} B per id); peak while growing {peak} B ({peak_per_id:.1} B per id)"
    );
    // The stated figure is the steady-state cost, rounded up; it must not understate it, nor
    // overstate it by more than 10%.
    assert!(per_id <= DEDUP_BYTES_PER_ID as f64, "measured {per_id:.1} B per id, docs say {DEDUP_BYTES_PER_ID}");
    assert!(per_id * 1.1 >= DEDUP_BYTES_PER_ID as f64, "measured {per_id:.1} B per id, docs say {DEDUP_BYTES_PER_ID}");
    drop(dedup);
}
