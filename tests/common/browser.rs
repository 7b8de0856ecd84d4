//! What the headless-Chromium tests driving `tests/browser/*.mjs` need: node (≥ 18), Debian's
//! `chromium` (or `$CHROMIUM`), `puppeteer-core` and `ws` from `tests/browser/package.json`
//! (installed with `npm ci --prefix tests/browser` when missing), and a bounded wait for a
//! child process. Each helper panics saying what to install.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Bound of `npm ci` (downloads puppeteer-core and ws, about 60 MB unpacked).
const NPM_LIMIT: Duration = Duration::from_secs(300);

/// `tests/browser`, where the scripts and their `node_modules` live.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// Waits for `child` up to `limit`; kills it (by its PID) and panics naming `what` past it.
pub fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> ExitStatus {
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

/// Checks that `node --version` is at least 18; panics with how to install it otherwise.
pub fn require_node() {
    let out = Command::new("node").arg("--version").output().unwrap_or_else(|e| {
        panic!("node is missing ({e}): the browser tests need Node.js >= 18 (apt-get install nodejs npm; .ci/run does)")
    });
    let v = String::from_utf8_lossy(&out.stdout);
    let major: u32 = v.trim().trim_start_matches('v').split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    assert!(major >= 18, "node {major} is too old: the browser tests need Node.js >= 18");
}

/// The Chromium binary: `$CHROMIUM`, else `/usr/bin/chromium`; panics when it is missing.
pub fn chromium() -> PathBuf {
    let path = PathBuf::from(std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()));
    assert!(
        path.exists(),
        "chromium is missing at {}: the browser tests need it (apt-get install chromium; .ci/run does), \
         or set CHROMIUM to a Chrome/Chromium binary",
        path.display()
    );
    path
}

/// Installs `tests/browser`'s pinned modules (`npm ci`) unless they are there.
pub fn require_modules() {
    let dir = dir();
    if dir.join("node_modules/puppeteer-core/package.json").exists() && dir.join("node_modules/ws").exists() {
        return;
    }
    let npm = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--prefix"])
        .arg(&dir)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("npm is missing ({e}): apt-get install npm"));
    let st = wait_bounded(npm, NPM_LIMIT, "npm ci --prefix tests/browser");
    assert!(st.success(), "npm ci --prefix tests/browser failed: {st}");
}
