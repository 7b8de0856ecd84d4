//! The status page in a real headless Chromium: runs `node tests/browser/status_page.mjs`
//! with this build's `tether` binary (the script starts and stops the server itself, puts a
//! small load on it, and checks the numbers the page shows against `/metrics`; see its
//! header). Needs Node.js ≥ 18 and Debian's `chromium` (`.ci/run` installs both); installs
//! `puppeteer-core` and `ws` with `npm ci --prefix tests/browser` when they are missing.
//! The screenshots' paths are printed by the script (its output is not captured).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::browser;

/// Bound of the whole browser run (the script bounds itself at 150 s).
const RUN_LIMIT: Duration = Duration::from_secs(200);

#[test]
fn status_page_in_headless_chromium_shows_what_metrics_says() {
    browser::require_node();
    let chromium = browser::chromium();
    browser::require_modules();
    let dir = browser::dir();
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
    let st = browser::wait_bounded(node, RUN_LIMIT, "node tests/browser/status_page.mjs");
    assert!(st.success(), "the browser test failed ({st}); its output above says why");
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    println!("status page screenshot: {}", shot.display());
}
