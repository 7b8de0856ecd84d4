//! The JavaScript client's suite (`clients/js/test/*.test.js`, `node --test`) against this
//! build's `tether`: delivery across cuts and restarts, close-code classes, the backoff
//! distribution, presence, a 500-client drain herd, and a page in headless Chromium.
//!
//! Needs Node ≥ 20 with npm and Debian's `chromium` (`.ci/run` installs chromium and npm when
//! missing, and Debian's `nodejs` when there is no node at all, but Debian 12's is 18: take
//! Node 20 from backports or NodeSource); without them the test fails saying which is missing. `npm ci` runs first when
//! `clients/js/node_modules` is missing (the npm registry must be reachable then). The whole
//! run is bounded in time and node's output is printed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bound of the `npm ci` step.
const NPM_CI_LIMIT: Duration = Duration::from_secs(300);
/// Bound of the whole `node --test` run (35–60 s on a 2-core box).
const SUITE_LIMIT: Duration = Duration::from_secs(240);

/// Starts of the lines worth showing from a passing run: the figures the tests print and
/// node's totals.
const FIGURES: &[&str] = &[
    "backoff distribution",
    "two cuts:",
    "backlog:",
    "heartbeat:",
    "drain herd:",
    "browser:",
    "tests ",
    "pass ",
    "fail ",
    "duration_ms ",
];

/// Runs `cmd` with stdout and stderr in a temporary file, killing it by PID after `limit`.
/// Returns (success, output).
fn run_bounded(mut cmd: Command, what: &str, limit: Duration) -> (bool, String) {
    let log =
        std::env::temp_dir().join(format!("tether-js-client-{}-{}.log", std::process::id(), what.replace(' ', "_")));
    let out = std::fs::File::create(&log).expect("create the log file");
    let err = out.try_clone().expect("clone the log file handle");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for the child") {
            break Some(st);
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    match status {
        Some(st) => (st.success(), text),
        None => panic!("{what} did not finish within {limit:?}; its output:\n{text}"),
    }
}

fn node_major() -> Option<u32> {
    let out = Command::new("node").arg("--version").output().ok()?;
    let v = String::from_utf8_lossy(&out.stdout);
    v.trim().trim_start_matches('v').split('.').next()?.parse().ok()
}

fn chromium() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CHROMIUM") {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    let out = Command::new("sh").args(["-c", "command -v chromium"]).output().ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Some(PathBuf::from(path)).filter(|p| !p.as_os_str().is_empty() && p.exists())
}

fn test_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .expect("read clients/js/test")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".test.js"))
        .map(|n| format!("test/{n}"))
        .collect();
    files.sort();
    files
}

#[test]
fn js_client_suite_passes() {
    let js = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/js");
    match node_major() {
        Some(v) if v >= 20 => {}
        Some(v) => panic!("node v{v} is too old: the JavaScript client's tests need Node >= 20"),
        None => panic!(
            "node is not installed: the JavaScript client's tests need Node >= 20 and npm (Debian 12's nodejs is 18: take Node 20 from backports or NodeSource)"
        ),
    }
    let chromium = chromium().unwrap_or_else(|| {
        panic!("chromium is not installed: the browser test needs it (apt-get install chromium; .ci/run installs it)")
    });
    if !js.join("node_modules").exists() {
        let mut npm = Command::new("npm");
        npm.args(["ci", "--no-audit", "--no-fund"]).current_dir(&js);
        let (ok, out) = run_bounded(npm, "npm ci", NPM_CI_LIMIT);
        assert!(ok, "npm ci in clients/js failed (is the npm registry reachable?):\n{out}");
    }
    let mut node = Command::new("node");
    node.args(["--test", "--test-concurrency=1"])
        .args(test_files(&js.join("test")))
        .current_dir(&js)
        .env("TETHER_BIN", env!("CARGO_BIN_EXE_tether"))
        .env("CHROMIUM", &chromium);
    let started = Instant::now();
    let (ok, out) = run_bounded(node, "node --test", SUITE_LIMIT);
    let took = started.elapsed().as_secs_f64();
    // The figures the tests measure (lines they print) and node's summary, shown even when the
    // test passes (written past libtest's capture of `println!`); everything when it fails.
    let summary: String = out
        .lines()
        .filter(|l| FIGURES.iter().any(|f| l.trim_start().trim_start_matches("# ").starts_with(f)))
        .map(|l| format!("{}\n", l.trim_start()))
        .collect();
    let shown = if ok { summary } else { out };
    let _ = std::io::stderr().write_all(format!("{shown}node --test took {took:.1} s\n").as_bytes());
    assert!(ok, "the JavaScript client's suite failed (output above)");
}
