//! The status page in a real headless Chromium: runs `node tests/browser/status_page.mjs`
//! with this build's `tether` binary (the script starts and stops the server itself, puts a
//! small load on it, and checks the numbers the page shows against `/metrics`; see its
//! header). Needs Node.js ≥ 18 and Debian's `chromium` (`.ci/run` installs both); installs
//! `puppeteer-core` and `ws` with `npm ci --prefix tests/browser` when they are missing.
//! The screenshots' paths are printed by the script (its output is not captured).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bound of the whole browser run (the script bounds itself at 150 s).
const RUN_LIMIT: Duration = Duration::from_secs(200);
/// Bound of `npm ci` (downloads puppeteer-core and ws, about 60 MB unpacked).
const NPM_LIMIT: Duration = Duration::from_secs(300);

/// Waits for `child` up to `limit`; kills it (by its PID) and panics naming `what` past it.
fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let end = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("{what}: wait: {e}")) {
            return status;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `node --version` as its major number; panics with how to install it when missing.
fn node_major() -> u32 {
    let out = Command::new("node").arg("--version").output().unwrap_or_else(|e| {
        panic!("node is missing ({e}): the browser test needs Node.js >= 18 (apt-get install nodejs npm; .ci/run does)")
    });
    let v = String::from_utf8_lossy(&out.stdout);
    v.trim().trim_start_matches('v').split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0)
}

fn chromium() -> PathBuf {
    let path = PathBuf::from(std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()));
    assert!(
        path.exists(),
        "chromium is missing at {}: the browser test needs it (apt-get install chromium; .ci/run does), \
         or set CHROMIUM to a Chrome/Chromium binary",
        path.display()
    );
    path
}

#[test]
fn status_page_in_headless_chromium_shows_what_metrics_says() {
    let major = node_major();
    assert!(major >= 18, "node {major} is too old: the browser test needs Node.js >= 18");
    let chromium = chromium();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    if !dir.join("node_modules/puppeteer-core/package.json").exists() || !dir.join("node_modules/ws").exists() {
        let npm = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("npm is missing ({e}): apt-get install npm"));
        let st = wait_bounded(npm, NPM_LIMIT, "npm ci --prefix tests/browser");
        assert!(st.success(), "npm ci --prefix tests/browser failed: {st}");
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_tether"));
    // <target>/release/tether → <target>/status-page.png
    let shot = bin.parent().and_then(Path::parent).expect("target dir").join("status-page.png");
    let node = Command::new("node")
        .arg(dir.join("status_page.mjs"))
        .arg(bin)
        .arg(&shot)
        .env("CHROMIUM", &chromium)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn node");
    let st = wait_bounded(node, RUN_LIMIT, "node tests/browser/status_page.mjs");
    assert!(st.success(), "the browser test failed ({st}); its output above says why");
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    println!("status page screenshot: {}", shot.display());
}
