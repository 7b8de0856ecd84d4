//! RFC 6455 conformance: runs the Autobahn|Testsuite fuzzing client (`../shared/tools/autobahn.sh`)
//! against `tether serve --echo` and requires 0 failed cases.
//!
//! The script sets itself up (python2.7 + autobahntestsuite from the package registries) on first
//! use, about 30 s. Without the script (a checkout outside the workplace), the test says so and
//! passes unless `TETHER_REQUIRE_AUTOBAHN=1` (CI sets it).

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
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/autobahn.sh");
    if !script.exists() {
        assert!(std::env::var("TETHER_REQUIRE_AUTOBAHN").as_deref() != Ok("1"), "{} is missing", script.display());
        eprintln!("autobahn: {} not found; conformance not checked", script.display());
        return;
    }
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
        .expect("run autobahn.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{}", stderr.lines().rev().take(10).collect::<Vec<_>>().join("\n"));
    assert!(started.elapsed() < Duration::from_secs(900));
    let summary = stdout.lines().chain(stderr.lines()).find(|l| l.contains(" passed (")).unwrap_or("");
    assert!(out.status.success(), "autobahn reported failures: {summary}");
    assert!(summary.contains(" 0 failed"), "unexpected summary: {summary:?}");
    assert!(server.0.try_wait().expect("server status").is_none(), "the server died during the run");
}
