//! A small mutation engine that runs on stable Rust: no compiler instrumentation, so the
//! outcome [`Signature`] of each input stands in for coverage.
//!
//! [`fuzz`] runs the seed corpus, then until the time budget is spent: picks an input of the
//! working corpus, mutates it (bit flips, interesting values, insertions, deletions, chunk
//! duplication, splicing with another input, the target's dictionary tokens, HTTP lines,
//! WebSocket re-framing), runs it, and keeps it when its signature is new. The first input that
//! makes the target panic stops the run: it is shrunk (chunks deleted while the panic stays at
//! the same place) and both versions are written to the artifacts folder.

use std::cell::RefCell;
use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{hash_of, mutate, Signature, Target};

/// Settings of one [`fuzz`] run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Time budget of the mutation loop (the seed corpus runs first, whatever the budget).
    pub duration: Duration,
    /// Seed of the mutation RNG; the same seed and corpus replay the same inputs (as long as
    /// the loop runs the same number of executions).
    pub seed: u64,
    /// Longest input produced by a mutation, in bytes.
    pub max_len: usize,
    /// Most inputs kept in the working corpus (seeds plus inputs with a new signature).
    pub max_pool: usize,
    /// Where a crashing input is written (`<dir>/<target>/crash-<hash>` and
    /// `minimized-<hash>`); `None` writes nothing.
    pub artifacts: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options { duration: Duration::from_secs(10), seed: 0, max_len: 8192, max_pool: 4096, artifacts: None }
    }
}

/// A panic found by [`fuzz`].
#[derive(Debug, Clone)]
pub struct Crash {
    /// The panic message, prefixed with its source location.
    pub message: String,
    /// The input that panicked.
    pub input: Vec<u8>,
    /// The smallest input found that panics at the same place.
    pub minimized: Vec<u8>,
    /// Files the two inputs were written to (empty without an artifacts folder).
    pub saved: Vec<PathBuf>,
}

/// What one [`fuzz`] run did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target's name.
    pub target: &'static str,
    /// Inputs run (seeds, mutations and shrinking attempts).
    pub executions: u64,
    /// Wall-clock time spent.
    pub elapsed: Duration,
    /// Inputs in the seed corpus.
    pub seeds: usize,
    /// Inputs in the working corpus at the end.
    pub pool: usize,
    /// Distinct outcome signatures seen.
    pub signatures: usize,
    /// The RNG seed (to replay the run).
    pub seed: u64,
    /// The first panic, if any.
    pub crash: Option<Crash>,
}

impl Report {
    /// One JSON line: `{"fuzz_target":…,"executions":…,"seconds":…,"seeds":…,"corpus":…,
    /// "signatures":…,"seed":…,"crashes":0|1[,"crash":…,"artifacts":[…]]}`.
    pub fn json(&self) -> String {
        let mut v = serde_json::json!({
            "fuzz_target": self.target,
            "executions": self.executions,
            "seconds": (self.elapsed.as_secs_f64() * 10.0).round() / 10.0,
            "seeds": self.seeds,
            "corpus": self.pool,
            "signatures": self.signatures,
            "seed": self.seed,
            "crashes": u8::from(self.crash.is_some()),
        });
        if let Some(c) = &self.crash {
            v["crash"] = c.message.clone().into();
            v["artifacts"] = c.saved.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().into();
        }
        v.to_string()
    }
}

/// The files of `dir` (not recursive, sorted by name) as inputs; an absent folder is an empty
/// corpus.
pub fn load_corpus(dir: &Path) -> std::io::Result<Vec<Vec<u8>>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut paths = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    paths.iter().map(std::fs::read).collect()
}

thread_local! {
    /// Set while this thread runs an input: the panic hook then records instead of printing.
    static CATCHING: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once per process) a panic hook that, on a thread running an input, records the
/// message and location for the report instead of printing it; other panics go to the hook
/// that was there before.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let caught = CATCHING.with(|c| {
                let mut c = c.borrow_mut();
                let Some(slot) = c.as_mut() else { return false };
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
                *slot = format!("{at}: {msg}");
                true
            });
            if !caught {
                previous(info);
            }
        }));
    });
}

/// Runs `exec` on `input`; `Err` holds the panic's location and message.
pub fn run_one(exec: &dyn Fn(&[u8]) -> Signature, input: &[u8]) -> Result<Signature, String> {
    install_hook();
    CATCHING.with(|c| *c.borrow_mut() = Some(String::new()));
    let result = panic::catch_unwind(AssertUnwindSafe(|| exec(input)));
    let message = CATCHING.with(|c| c.borrow_mut().take()).unwrap_or_default();
    result.map_err(|_| message)
}

/// Fuzzes `target` from `seeds` under `opts` (see the module doc).
pub fn fuzz(target: &Target, seeds: Vec<Vec<u8>>, opts: &Options) -> Report {
    fuzz_with(target, &target.run, seeds, opts)
}

/// [`fuzz`] running each input through `exec` instead of `target.run` (e.g. the target
/// wrapped in an allocation check); the target still gives the name, dictionary and
/// mutations.
pub fn fuzz_with(target: &Target, exec: &dyn Fn(&[u8]) -> Signature, seeds: Vec<Vec<u8>>, opts: &Options) -> Report {
    let start = Instant::now();
    let mut report = Report {
        target: target.name,
        executions: 0,
        elapsed: Duration::ZERO,
        seeds: seeds.len(),
        pool: 0,
        signatures: 0,
        seed: opts.seed,
        crash: None,
    };
    let mut rng = SmallRng::seed_from_u64(opts.seed);
    let mut seen = HashSet::new();
    let mut pool: Vec<Vec<u8>> = Vec::new();
    let mut crashed = None;
    for seed in seeds {
        report.executions += 1;
        match run_one(exec, &seed) {
            Ok(sig) => {
                seen.insert(sig);
                pool.push(seed);
            }
            Err(message) => {
                crashed = Some((seed, message));
                break;
            }
        }
    }
    if pool.is_empty() {
        pool.push(Vec::new());
    }
    while crashed.is_none() && start.elapsed() < opts.duration {
        for _ in 0..32 {
            let mut input = pool[rng.random_range(0..pool.len())].clone();
            mutate::mutate(&mut input, &pool, target.dictionary, target.reframe, &mut rng, opts.max_len);
            report.executions += 1;
            match run_one(exec, &input) {
                Ok(sig) => {
                    if seen.insert(sig) && pool.len() < opts.max_pool {
                        pool.push(input);
                    }
                }
                Err(message) => {
                    crashed = Some((input, message));
                    break;
                }
            }
        }
    }
    if let Some((input, message)) = crashed {
        let shrink_until = Instant::now() + Duration::from_secs(10);
        let minimized = minimize(exec, &input, &message, shrink_until, &mut report.executions);
        let saved = opts.artifacts.as_deref().map_or_else(Vec::new, |dir| save(dir, target.name, &input, &minimized));
        report.crash = Some(Crash { message, input, minimized, saved });
    }
    report.pool = pool.len();
    report.signatures = seen.len();
    report.elapsed = start.elapsed();
    report
}

/// The location part of a panic message (`file:line`).
fn location(message: &str) -> &str {
    message.split(": ").next().unwrap_or(message)
}

/// Deletes chunks of `input` (halving their size) while the panic stays at the same location.
fn minimize(
    exec: &dyn Fn(&[u8]) -> Signature,
    input: &[u8],
    message: &str,
    until: Instant,
    executions: &mut u64,
) -> Vec<u8> {
    let mut best = input.to_vec();
    let mut chunk = best.len().div_ceil(2).max(1);
    while Instant::now() < until && !best.is_empty() {
        let mut progressed = false;
        let mut i = 0;
        while i < best.len() && Instant::now() < until {
            let mut candidate = best.clone();
            candidate.drain(i..(i + chunk).min(best.len()));
            *executions += 1;
            match run_one(exec, &candidate) {
                Err(m) if location(&m) == location(message) => {
                    best = candidate;
                    progressed = true;
                }
                _ => i += chunk,
            }
        }
        if !progressed {
            if chunk == 1 {
                break;
            }
            chunk = chunk.div_ceil(2);
        }
    }
    best
}

fn save(dir: &Path, target: &str, input: &[u8], minimized: &[u8]) -> Vec<PathBuf> {
    let dir = dir.join(target);
    if std::fs::create_dir_all(&dir).is_err() {
        return Vec::new();
    }
    let mut saved = Vec::new();
    for (kind, bytes) in [("crash", input), ("minimized", minimized)] {
        let path = dir.join(format!("{kind}-{:016x}", hash_of(bytes)));
        if std::fs::write(&path, bytes).is_ok() {
            saved.push(path);
        }
    }
    saved
}
