//! Headless Chromium over wss:// on tether's own TLS (`[tls]`), trusting only a test CA: the
//! CA and the server's certificate for 127.0.0.1 are made by `openssl` (tests/common/tls.rs);
//! the CA goes into an NSS database (`certutil -A -t "C,,"`) in a throwaway HOME, which is
//! where Chromium on Linux looks for locally trusted roots (`~/.pki/nssdb`); a second HOME's
//! database is left empty. `node tests/browser/wss_resume.mjs` then drives both browsers (see
//! its header): with the CA, a page tether served over https:// runs the JavaScript client
//! over wss://, subscribes, publishes and receives, and after `POST /api/disconnect` cuts the
//! connection (1012) it resumes from its last seq and receives the missed messages exactly
//! once; without the CA the navigation fails with ERR_CERT_AUTHORITY_INVALID and a wss://
//! WebSocket never opens, so the first browser's success is real verification.
//!
//! Needs node (≥ 18), Debian's `chromium`, `certutil` (`libnss3-tools`) and `openssl`
//! (scripts/setup installs them); installs tests/browser's modules with `npm ci` when missing.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::tls::{self, Pki};
use common::{browser, Server};

/// Bound of the node script (it bounds itself at 90 s).
const RUN_LIMIT: Duration = Duration::from_secs(120);
/// The HS256 secret the script signs alice's token with (at least 32 bytes).
const SECRET: &str = "browser-wss-test-secret-of-32-bytes-or-more";
/// The key for `POST /api/disconnect` and `POST /publish/{ch}`.
const API_KEY: &str = "browser-wss-api-key-0123456789";

/// Runs `certutil` with `args`; panics with its output when it fails or is missing.
fn certutil(args: &[&str]) {
    let out =
        Command::new("certutil").args(args).stdin(Stdio::null()).output().unwrap_or_else(|e| {
            panic!("certutil is missing ({e}): apt-get install libnss3-tools (scripts/setup does)")
        });
    assert!(
        out.status.success(),
        "certutil {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A HOME for Chromium whose NSS database (`home/.pki/nssdb`, no password) trusts `ca` as a
/// TLS server root ("C,,") when given, else nothing.
fn nss_home(home: &Path, ca: Option<&Path>) {
    let db = home.join(".pki/nssdb");
    std::fs::create_dir_all(&db).expect("create the NSS database directory");
    let db = format!("sql:{}", db.display());
    certutil(&["-N", "-d", &db, "--empty-password"]);
    if let Some(ca) = ca {
        certutil(&["-A", "-d", &db, "-t", "C,,", "-n", "tether-test", "-i", ca.to_str().expect("UTF-8 path")]);
        certutil(&["-L", "-d", &db, "-n", "tether-test"]);
    }
}

#[test]
fn chromium_with_the_test_ca_subscribes_publishes_and_resumes_over_wss() {
    browser::require_node();
    let chromium = browser::chromium();
    browser::require_modules();
    let pki = Pki::new("chromium");
    let leaf = pki.leaf("server");
    let (trusted, bare) = (pki.dir.join("home-trusted"), pki.dir.join("home-bare"));
    nss_home(&trusted, Some(&pki.ca));
    nss_home(&bare, None);
    let config =
        format!("{}\n[auth]\njwt_hs256_secret = \"{SECRET}\"\npublish_keys = [\"{API_KEY}\"]\n", tls::section(&leaf));
    let srv = Server::start(&config, &["--cores", "2"]);
    let node = Command::new("node")
        .arg(browser::dir().join("wss_resume.mjs"))
        .env("TETHER_ADDR", srv.addr.to_string())
        .env("TRUSTED_HOME", &trusted)
        .env("BARE_HOME", &bare)
        .env("JWT_SECRET", SECRET)
        .env("API_KEY", API_KEY)
        .env("CHROMIUM", &chromium)
        .env("NODE_EXTRA_CA_CERTS", &pki.ca)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn node");
    let st = browser::wait_bounded(node, RUN_LIMIT, "node tests/browser/wss_resume.mjs");
    assert!(
        st.success(),
        "the browser test failed ({st}); its output above says why. Server log:\n{}",
        srv.log_tail(40)
    );
}
