//! `tether feeds` (docs/feeds.md, "Admin API" and "From the command line") against a real
//! node with the memory store and an admin token, a test upstream in this process, test
//! timings (renew 250 ms):
//! - `put` from flags creates the feed (checked through the raw HTTP API too) and the node
//!   connects upstream; `list` shows it as a table and as JSON;
//! - `stop` closes the upstream, `start` reopens it resuming after the stored `last_seq`;
//! - `delete` removes it and closes the upstream;
//! - refusals exit 1 with the node's reason (a bad field named, 401 with a hint, 404), bad
//!   usage exits 2; `--token-file` and `--json` work.

mod common;

use std::time::Duration;

use common::feeds::{channel, node_config};
use common::upstream::Upstream;
use common::{http_request, run_tether, Server};
use serde_json::Value;

const TOKEN: &str = "admin-token-cli-0123456789";

/// Runs `tether feeds --admin <node> [--token TOKEN] args…` off the async workers; returns
/// (exit code, stdout, stderr).
async fn feeds(node: &Server, token: bool, args: &[&str]) -> (i32, String, String) {
    let admin = format!("http://{}", node.addr);
    let mut all: Vec<String> = vec!["feeds".into(), "--admin".into(), admin];
    if token {
        all.extend(["--token".into(), TOKEN.into()]);
    }
    all.extend(args.iter().map(|a| a.to_string()));
    let out = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        run_tether(&refs)
    })
    .await
    .expect("join");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feeds_cli_drives_the_admin_api() {
    let up = Upstream::start(Duration::from_millis(20), None).await;
    let cfg = format!("{}[admin]\ntoken = \"{TOKEN}\"\n", node_config("", "memory", &up, &[]));
    let node = Server::start(&cfg, &[]);
    let url = up.url("cli");
    let ch = channel("cli");

    // Create from flags: the node answers with the record and connects upstream.
    let put = ["put", "cli", "--url", &url, "--channel", &ch, "--seq-pointer", "/seq", "--resume-query", "from"];
    let (code, out, err) = feeds(&node, true, &put).await;
    assert_eq!(code, 0, "put: {err}");
    let rec = json(&out);
    assert_eq!((rec["id"].as_str(), rec["desired_state"].as_str()), (Some("cli"), Some("STARTED")), "{rec}");
    up.wait_open("cli", 1, Duration::from_secs(3)).await;
    let auth = format!("Bearer {TOKEN}");
    let (status, _, body) = http_request(node.addr, "GET", "/feeds/cli", &[("Authorization", &auth)], b"").await;
    let raw: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!((status, raw["url"].as_str(), raw["resume_query"].as_str()), (200, Some(url.as_str()), Some("from")));

    // List: a table with a header and one row naming the owner, and the same as JSON.
    let (code, out, err) = feeds(&node, true, &["list"]).await;
    assert_eq!(code, 0, "list: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("ID ") && lines[0].contains("OWNER"), "{out}");
    let owner = raw["lease_owner"].as_str().expect("owned");
    assert!(lines[1].starts_with("cli ") && lines[1].contains("STARTED") && lines[1].contains(owner), "{out}");
    let (code, out, _) = feeds(&node, true, &["list", "--json"]).await;
    assert_eq!((code, json(&out).as_array().map(Vec::len)), (0, Some(1)), "{out}");

    // Stop closes the upstream; start reopens it, resuming after the stored last_seq.
    let (code, out, err) = feeds(&node, true, &["stop", "cli"]).await;
    assert_eq!((code, json(&out)["desired_state"].as_str()), (0, Some("STOPPED")), "stop: {err}");
    up.wait_open("cli", 0, Duration::from_secs(2)).await;
    let (code, out, _) = feeds(&node, true, &["get", "cli"]).await;
    let last_seq: u64 = json(&out)["last_seq"].as_str().and_then(|s| s.parse().ok()).expect("last_seq stored at stop");
    let (code2, _, err) = feeds(&node, true, &["start", "cli"]).await;
    assert_eq!((code, code2), (0, 0), "start: {err}");
    up.wait_open("cli", 1, Duration::from_secs(3)).await;
    assert_eq!(up.resumes("cli").last(), Some(&last_seq), "start resumes from last_seq");

    // Refusals: exit 1 with the node's reason.
    let bad = ["put", "bad", "--url", "http://x/", "--channel", "c", "--seq-pointer", "/seq"];
    let (code, _, err) = feeds(&node, true, &bad).await;
    assert!(code == 1 && err.contains("HTTP 400") && err.contains("url"), "{code} {err}");
    let (code, _, err) = feeds(
        &node,
        true,
        &["put", "bad", "--json", r#"{"url":"ws://h/","channel":"c","seq_pointer":"/seq","colour":1}"#],
    )
    .await;
    assert!(code == 1 && err.contains("colour"), "{code} {err}");
    let (code, _, err) = feeds(&node, false, &["list"]).await;
    assert!(code == 1 && err.contains("HTTP 401") && err.contains("--token"), "{code} {err}");
    let (code, _, err) = feeds(&node, true, &["get", "nope"]).await;
    assert!(code == 1 && err.contains("HTTP 404"), "{code} {err}");
    let (code, _, err) = feeds(&node, true, &["get", "a/b"]).await;
    assert!(code == 1 && err.contains("HTTP 400") && err.contains("id"), "{code} {err}");
    let out = tokio::task::spawn_blocking(|| run_tether(&["feeds", "--admin", "ws://127.0.0.1:1/ws", "list"]))
        .await
        .expect("join");
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // --token-file, then delete: the upstream closes and the list is empty.
    let dir = std::env::temp_dir().join(format!("tether-feeds-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
    let tf = token_file.to_string_lossy().into_owned();
    let (code, out, err) = feeds(&node, false, &["--token-file", &tf, "delete", "cli"]).await;
    assert_eq!((code, out.trim()), (0, "deleted cli"), "delete: {err}");
    up.wait_open("cli", 0, Duration::from_secs(2)).await;
    let (code, out, _) = feeds(&node, true, &["list", "--json"]).await;
    assert_eq!((code, json(&out)), (0, Value::Array(vec![])));
    let _ = std::fs::remove_dir_all(&dir);
}
