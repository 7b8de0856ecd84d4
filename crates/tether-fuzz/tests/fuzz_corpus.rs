//! The fuzz targets of `tether_fuzz` in `cargo test` (docs/security.md, "Fuzzing"):
//! every file of `corpus/` through every target, then the mutation engine for a bounded
//! time per target. Every input also runs under a counting allocator: the most it made the
//! target hold at once must stay within `tether_fuzz::allocation_bound` (linear in the input,
//! plus the limits), so a parser that trusts a declared length fails here.
//!
//! `TETHER_FUZZ_SECONDS` sets the mutation time per target (default 10; four targets run on
//! the test harness's threads), `TETHER_FUZZ_SEED` the RNG seed (default: from the clock,
//! printed). Each target prints one JSON line with its executions on stderr, whatever the
//! test harness captures. A crashing input is written to `artifacts/<target>/`.

// The workspace's counting allocator, shared with the server's memory tests.
#[path = "../../../tests/counting_alloc/mod.rs"]
mod counting_alloc;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use counting_alloc::{thread_mark, thread_peak_since, Counting};
use tether_fuzz::{allocation_bound, engine, Signature, Target, TARGETS};

#[global_allocator]
static ALLOC: Counting = Counting;

/// Default mutation time per target, in seconds: four targets on a 2-core CI box stay well
/// within the minute the CI gives fuzzing.
const DEFAULT_SECONDS: f64 = 10.0;

/// The crate's folder: `corpus/` and `artifacts/` live there.
fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Runs `target` on `input`, then panics if it held more than the bound at once.
fn checked(target: &Target, input: &[u8]) -> Signature {
    let mark = thread_mark();
    let sig = (target.run)(input);
    let peak = thread_peak_since(mark);
    let bound = allocation_bound(input.len());
    assert!(
        peak <= bound,
        "{}: held {peak} bytes at once for an input of {} bytes (bound {bound})",
        target.name,
        input.len()
    );
    sig
}

#[test]
fn every_corpus_file_through_every_target() {
    let mut files = Vec::new();
    for t in &TARGETS {
        let dir = fuzz_dir().join("corpus").join(t.name);
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        assert!(entries.len() >= 10, "{} holds {} seeds", dir.display(), entries.len());
        files.extend(entries);
    }
    let mut failures = Vec::new();
    let mut runs = 0;
    for t in &TARGETS {
        for file in &files {
            let input = std::fs::read(file).unwrap();
            runs += 1;
            if let Err(message) = engine::run_one(&|data: &[u8]| checked(t, data), &input) {
                failures.push(format!("{} on {}: {message}", t.name, file.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {runs} runs failed:\n{}", failures.len(), failures.join("\n"));
}

fn seconds() -> f64 {
    match std::env::var("TETHER_FUZZ_SECONDS") {
        Ok(s) => s
            .trim()
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s >= 0.0)
            .unwrap_or_else(|| panic!("TETHER_FUZZ_SECONDS={s:?}: expected a non-negative number of seconds")),
        Err(_) => DEFAULT_SECONDS,
    }
}

fn seed() -> u64 {
    match std::env::var("TETHER_FUZZ_SEED") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("TETHER_FUZZ_SEED={s:?}: expected an integer")),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    }
}

/// The bounded mutation run of one target; its report goes to the real stderr (not captured).
fn mutate(name: &str) {
    let target = tether_fuzz::target(name).expect("target");
    let seeds = engine::load_corpus(&fuzz_dir().join("corpus").join(name)).expect("corpus");
    let opts = engine::Options {
        duration: Duration::from_secs_f64(seconds()),
        seed: seed(),
        artifacts: Some(fuzz_dir().join("artifacts")),
        ..engine::Options::default()
    };
    let report = engine::fuzz_with(target, &|data: &[u8]| checked(target, data), seeds, &opts);
    let _ = writeln!(std::io::stderr(), "{}", report.json());
    if let Some(crash) = &report.crash {
        panic!(
            "{name}: {}\ninput ({} bytes, shrunk to {}) written to {:?}; replay with \
             `cargo run -p tether-fuzz -- {name} --replay FILE`",
            crash.message,
            crash.input.len(),
            crash.minimized.len(),
            crash.saved
        );
    }
    assert!(report.executions > report.seeds as u64 || opts.duration.is_zero(), "no mutation ran: {}", report.json());
}

#[test]
fn mutation_handshake() {
    mutate("handshake");
}

#[test]
fn mutation_frames() {
    mutate("frames");
}

#[test]
fn mutation_protocol() {
    mutate("protocol");
}

#[test]
fn mutation_http_body() {
    mutate("http_body");
}

#[test]
fn allocation_check_catches_a_parser_that_trusts_a_declared_length() {
    // The check itself: a "parser" that reserves what the input declares breaks the bound.
    let trusting = Target {
        name: "trusting",
        run: |data: &[u8]| {
            let declared = data.iter().take(4).fold(0usize, |n, &b| n << 8 | usize::from(b));
            Vec::<u8>::with_capacity(declared).capacity() as Signature
        },
        dictionary: &[],
        reframe: false,
    };
    assert!(engine::run_one(&|d: &[u8]| checked(&trusting, d), &[0, 0, 0, 9]).is_ok());
    let err = engine::run_one(&|d: &[u8]| checked(&trusting, d), &[0x10, 0, 0, 0]).unwrap_err();
    assert!(err.contains("held 268435456 bytes at once"), "{err}");
}
