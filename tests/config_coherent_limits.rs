//! Limits that contradict each other are refused at start with the keys named (exit 2), and
//! limits that work but are probably not meant are logged as warnings naming the key (issue 8).
//! The shipped OS profile agrees with the default config: the systemd unit's stop timeout
//! outlasts the default drain.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use tether::config::{Config, SHIPPED_UNIT_STOP_TIMEOUT_MS};

/// Runs `tether serve --config <toml> --listen 127.0.0.1:0` expecting it to refuse; returns
/// (exit code, stderr).
fn refused(toml: &str) -> (Option<i32>, String) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("tether-coherent-{}-{n}.toml", std::process::id()));
    std::fs::write(&path, toml).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tether");
    let out = wait_child(child, Duration::from_secs(10), &format!("tether serve with {toml:?} (accepted it?)"));
    let _ = std::fs::remove_file(&path);
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_queue_smaller_than_the_largest_accepted_message_is_refused() {
    // The shape of the issue: the default 1 MiB publish and a 1 MiB queue.
    let (code, err) = refused("[limits]\nqueue_max_bytes = 1048576\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(
            "config: limits.queue_max_bytes = 1048576: cannot hold one message of limits.max_publish_bytes = 1048576"
        ),
        "{err}"
    );
    assert!(
        err.contains("raise limits.queue_max_bytes to at least 1052865 or lower limits.max_publish_bytes"),
        "{err}"
    );

    // WebSocket `pub` messages up to max_message_bytes count the same way.
    let (code, err) =
        refused("[limits]\nmax_message_bytes = 1048576\nmax_publish_bytes = 1024\nqueue_max_bytes = 524288\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("limits.queue_max_bytes = 524288: cannot hold one message of limits.max_message_bytes = 1048576"),
        "{err}"
    );
}

#[test]
fn timeouts_beyond_the_timer_range_are_refused() {
    for (toml, key) in [
        ("[limits]\nhandshake_timeout_ms = 18446744073709551615\n", "limits.handshake_timeout_ms"),
        ("[heartbeat]\nping_interval_ms = 100000000000\n", "heartbeat.ping_interval_ms"),
        ("[dedup]\nwindow_ms = 100000000000\n", "dedup.window_ms"),
    ] {
        let (code, err) = refused(toml);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.starts_with(&format!("config: {key} = ")) && err.contains("must be at most 86400000"), "{err}");
    }
}

#[test]
fn bad_redis_broker_keys_are_refused_naming_the_key() {
    let (code, err) = refused("[broker]\nkind = \"redis\"\nurl = \"http://127.0.0.1:6379\"\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("config: broker.url = \"http://127.0.0.1:6379\""), "{err}");
    // A valid Redis broker passes validation (connecting happens at run time).
    Config::from_toml_str("[broker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"").unwrap();
    let e = Config::from_toml_str("[broker]\nkind = \"redis\"\nkey_prefix = \"{x}\"").unwrap_err();
    assert_eq!(e.key, "broker.key_prefix");
}

#[tokio::test]
async fn incoherent_but_workable_limits_start_with_a_warning_naming_the_key() {
    let srv = Server::start(
        "[heartbeat]\nping_interval_ms = 2000\npong_timeout_ms = 3000\n[drain]\nwindow_ms = 40000\n",
        &["--cores", "1"],
    );
    let log = srv.log_tail(200);
    for key in ["config: heartbeat.pong_timeout_ms = 3000", "config: drain.window_ms = 40000"] {
        assert!(log.lines().any(|l| l.contains("WARN") && l.contains(key)), "no warning with {key:?} in:\n{log}");
    }
    assert_eq!(srv.publish("w", "1").await, 1, "the server runs");
}

/// `TimeoutStopSec` of the shipped unit, in milliseconds.
fn unit_stop_timeout_ms() -> u64 {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/tether.service")).unwrap();
    let value = unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("TimeoutStopSec="))
        .expect("TimeoutStopSec in systemd/tether.service");
    let secs: u64 = value
        .trim()
        .trim_end_matches('s')
        .parse()
        .unwrap_or_else(|_| panic!("TimeoutStopSec={value}: seconds expected"));
    secs * 1000
}

#[test]
fn shipped_unit_outlasts_the_default_drain() {
    let stop = unit_stop_timeout_ms();
    assert_eq!(stop, SHIPPED_UNIT_STOP_TIMEOUT_MS, "the constant the drain warning uses must match the unit");
    let d = Config::default();
    // A drain ends at most 2 s (the last close handshakes) after its window.
    let drain = d.drain.window_ms + d.limits.close_timeout_ms.min(tether::config::DRAIN_CLOSE_WAIT_MS);
    assert!(drain < stop, "default drain {drain} ms does not fit TimeoutStopSec {stop} ms");
    assert!(d.warnings(Some(8 << 30)).is_empty(), "{:?}", d.warnings(Some(8 << 30)));
    // The example config the installer ships is the defaults, so it is coherent too.
    let shipped = Config::from_toml_str(include_str!("../systemd/tether.toml")).unwrap();
    assert_eq!(shipped, d);
}
