//! RFC 6455 conformance: runs the Autobahn|Testsuite fuzzing client (`scripts/autobahn.sh`)
//! against `tether serve --echo` and requires 0 failed cases.
//!
//! The script sets itself up (python2.7 + autobahntestsuite from Debian's and PyPI's registries)
//! on first use, about 30 s. A suite that cannot be set up or run fails this test with the
//! script's own message: a conformance test that passes without running proves nothing.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn autobahn_fuzzingclient_reports_no_failures() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/autobahn.sh");
    assert!(script.exists(), "{} is missing: the conformance suite cannot run", script.display());
    let mut server = Child(
        Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["serve", "--listen", "127.0.0.1:0", "--echo", "--cores", "2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tether"),
    );
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().expect("stdout")).read_line(&mut line).expect("read listen line");
    let addr = line.trim().rsplit(' ').next().expect("address").to_string();
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .args(["--timeout", "600", &format!("ws://{addr}/echo")])
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{}", stderr.lines().rev().take(10).collect::<Vec<_>>().join("\n"));
    assert!(started.elapsed() < Duration::from_secs(900));
    // Exit 2: the suite could not be set up or started; its last stderr lines say why.
    assert!(
        out.status.code() != Some(2),
        "autobahn.sh could not run the suite (exit 2): {}",
        stderr.lines().rfind(|l| l.starts_with("autobahn.sh:")).unwrap_or("see the output above")
    );
    let summary = stdout.lines().chain(stderr.lines()).find(|l| l.contains(" passed (")).unwrap_or("");
    assert!(out.status.success(), "autobahn reported failures: {summary}");
    assert!(summary.contains(" 0 failed"), "unexpected summary: {summary:?}");
    assert!(server.0.try_wait().expect("server status").is_none(), "the server died during the run");
}
