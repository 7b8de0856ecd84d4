//! The stable fuzz runner (docs/security.md, "Fuzzing"): the targets of `tether_fuzz`, driven
//! by its mutation engine from the seed corpus in `corpus/<target>/`, for a time budget.
//!
//! ```sh
//! cargo run --release -p tether-fuzz -- --seconds 600            # every target, 10 min each
//! cargo run --release -p tether-fuzz -- frames handshake --seconds 60 --seed 7
//! cargo run --release -p tether-fuzz -- frames --replay artifacts/frames/crash-…
//! ```
//!
//! Prints one JSON line per target on stdout (`executions`, `signatures`, `crashes`, …) and
//! writes a crashing input, and its shrunk version, to `artifacts/<target>/`. Exits 1
//! when a target panicked, 2 on bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tether_fuzz::{engine, TARGETS};

#[derive(Parser)]
#[command(about = "Fuzz tether's parsers on stable Rust (targets: handshake, frames, protocol, http_body)")]
struct Args {
    /// Targets to run (default: all).
    targets: Vec<String>,
    /// Time budget per target, in seconds.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Seed of the mutation RNG (default: from the clock; printed in the report).
    #[arg(long)]
    seed: Option<u64>,
    /// Longest mutated input, in bytes.
    #[arg(long, default_value_t = 8192)]
    max_len: usize,
    /// Corpus root (one folder per target).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus"))]
    corpus: PathBuf,
    /// Where crashing inputs are written (one folder per target).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/artifacts"))]
    artifacts: PathBuf,
    /// Run this one file through the (single) target and report, instead of fuzzing.
    #[arg(long)]
    replay: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let names: Vec<&str> = if args.targets.is_empty() {
        TARGETS.iter().map(|t| t.name).collect()
    } else {
        args.targets.iter().map(String::as_str).collect()
    };
    let mut targets = Vec::new();
    for name in &names {
        match tether_fuzz::target(name) {
            Some(t) => targets.push(t),
            None => {
                let known: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
                eprintln!("fuzz: no target {name:?}; targets: {}", known.join(", "));
                return ExitCode::from(2);
            }
        }
    }
    if let Some(file) = &args.replay {
        let [target] = targets[..] else {
            eprintln!("fuzz: --replay needs exactly one target");
            return ExitCode::from(2);
        };
        let input = match std::fs::read(file) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("fuzz: cannot read {}: {e}", file.display());
                return ExitCode::from(2);
            }
        };
        return match engine::run_one(&target.run, &input) {
            Ok(sig) => {
                println!("{}: ok (signature {sig:016x})", target.name);
                ExitCode::SUCCESS
            }
            Err(message) => {
                println!("{}: panicked: {message}", target.name);
                ExitCode::from(1)
            }
        };
    }
    if !(args.seconds.is_finite() && args.seconds >= 0.0) {
        eprintln!("fuzz: --seconds must be a non-negative number of seconds");
        return ExitCode::from(2);
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    });
    let mut failed = false;
    let mut total = 0;
    for target in targets {
        let seeds = match engine::load_corpus(&args.corpus.join(target.name)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("fuzz: cannot read the corpus of {}: {e}", target.name);
                return ExitCode::from(2);
            }
        };
        let opts = engine::Options {
            duration: Duration::from_secs_f64(args.seconds),
            seed,
            max_len: args.max_len,
            artifacts: Some(args.artifacts.clone()),
            ..engine::Options::default()
        };
        let report = engine::fuzz(target, seeds, &opts);
        println!("{}", report.json());
        total += report.executions;
        if let Some(crash) = &report.crash {
            failed = true;
            eprintln!("fuzz: {} panicked: {}", target.name, crash.message);
            for path in &crash.saved {
                eprintln!("fuzz: input written to {}", path.display());
            }
        }
    }
    eprintln!("fuzz: {total} executions in total");
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
