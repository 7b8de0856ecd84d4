//! The CLI says what the server said (docs/clients.md, "Rust client and command-line tools"): every server
//! answer that changes what the user should expect is one JSON line on stderr (`retrying` for
//! `unavailable` with its wait, the refusal with its `ch`, the `connected` URL after a
//! disconnect); Ctrl-C ends `tether sub` and `tether pub` within 200 ms; a closed stdout or
//! stderr ends quietly, never with a panic; `--listen` takes a name; HTTP refusals name what
//! was refused. Real `tether` processes against real servers (and a real Redis).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::auth::*;
use common::redis::{redis_config, RedisProc};
use common::*;
use serde_json::Value;

/// A `tether` client process whose stderr lines arrive on a channel.
struct Cli {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Cli {
    fn spawn(args: &[&str]) -> Cli {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(args)
            .env("TETHER_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tether");
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Cli { child, lines, seen: Vec::new() }
    }

    /// Waits (bounded) for a stderr line that is JSON and satisfies `pred`.
    fn wait_json(&mut self, limit: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    let v: Value = serde_json::from_str(&line)
                        .unwrap_or_else(|e| panic!("stderr line is not JSON ({e}): {line}; so far {:?}", self.seen));
                    if pred(&v) {
                        return v;
                    }
                }
                Err(_) => panic!("no matching stderr line within {limit:?}; got {:?}", self.seen),
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// Waits (bounded) for the exit; its code and how long it took.
    fn wait_exit(&mut self, limit: Duration) -> (Option<i32>, Duration) {
        let start = Instant::now();
        let st =
            eventually_sync(limit, "tether exiting", || self.child.try_wait().expect("wait").ok_or("still running"));
        (st.code(), start.elapsed())
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_ends_sub_and_pub_within_200_ms() {
    let srv = Server::start("", &["--cores", "1"]);
    let url = srv.ws_url();
    let mut took = Vec::new();
    for round in 0..3 {
        let mut sub = Cli::spawn(&["sub", &url, "cli.sigint"]);
        srv.wait_gauge(1.0, STEP).await;
        sub.signal(libc::SIGINT);
        let (code, t) = sub.wait_exit(STEP);
        assert_eq!(code, Some(0), "round {round}: sub exits 0 on Ctrl-C");
        took.push(t);
        srv.wait_gauge(0.0, STEP).await;
    }
    // A `pub` that waits for an ack that cannot come (the channel name is valid, the server
    // is gone): Ctrl-C ends the wait.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("ws://{}/ws", dead.local_addr().unwrap());
    drop(dead);
    let mut publ = Cli::spawn(&["pub", &dead_url, "cli.sigint", "1"]);
    std::thread::sleep(Duration::from_millis(300));
    publ.signal(libc::SIGINT);
    let (code, t) = publ.wait_exit(STEP);
    assert_ne!(code, Some(101), "no panic");
    took.push(t);
    took.sort();
    eprintln!("exit after SIGINT: {took:?}");
    assert!(took[0] <= Duration::from_millis(200), "fastest exit after SIGINT {:?} > 200 ms", took[0]);
    assert!(took.iter().all(|t| *t < Duration::from_secs(1)), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_is_a_retrying_line_for_pub_and_sub() {
    let mut redis = RedisProc::start();
    let srv = Server::start(&redis_config(&redis.url(), "request_timeout_ms = 300"), &["--cores", "1"]);
    srv.wait_metric("tether_broker_up", &[], STEP, |v| v == 1.0).await;
    assert_eq!(srv.publish("cli.up", "1").await, 1);
    redis.kill9();
    let url = srv.ws_url();
    let mut publ = Cli::spawn(&["pub", &url, "cli.down", "{\"a\":1}", "--id", "x-1"]);
    let v = publ.wait_json(STEP, |v| v["event"] == "retrying");
    assert_eq!(
        (v["code"].as_str(), v["id"].as_str(), v["ch"].as_str()),
        (Some("unavailable"), Some("x-1"), Some("cli.down")),
        "{v}"
    );
    assert!(v["retry_in_ms"].as_u64().is_some_and(|ms| ms > 0), "{v}");
    let mut sub = Cli::spawn(&["sub", &url, "cli.down"]);
    let v = sub.wait_json(STEP, |v| v["event"] == "retrying");
    assert_eq!((v["code"].as_str(), v["ch"].as_str()), (Some("unavailable"), Some("cli.down")), "{v}");
    // Redis comes back: the pending publish is stored and acked, once.
    redis.restart();
    let (code, _) = publ.wait_exit(Duration::from_secs(20));
    assert_eq!(code, Some(0), "the publish went through after Redis came back: {:?}", publ.seen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_resumed_on_is_a_line_after_a_node_dies() {
    let _serial = serial().await;
    let a = Server::start("", &["--cores", "1"]);
    let b = Server::start("", &["--cores", "1"]);
    let urls = format!("{},{}", a.ws_url(), b.ws_url());
    let mut sub = Cli::spawn(&["sub", &urls, "cli.nodes"]);
    a.wait_gauge(1.0, STEP).await;
    drop(a); // SIGKILL
    sub.wait_json(STEP, |v| v["event"] == "disconnected");
    let v = sub.wait_json(STEP, |v| v["event"] == "connected");
    assert_eq!(v["url"].as_str(), Some(b.ws_url().as_str()), "{v}");
}

#[tokio::test]
async fn a_forbidden_line_names_its_channel() {
    let srv = Server::start(&hs256_config(1000), &["--cores", "1"]);
    let token = hs256(&claims("u", now_s() + 600, &["news.*"], &["news.*"]));
    let url = srv.ws_url();
    let mut sub = Cli::spawn(&["sub", &url, "admin.x", "--token", &token]);
    let v = sub.wait_json(STEP, |v| v["op"] == "error");
    assert_eq!((v["code"].as_str(), v["ch"].as_str()), (Some("forbidden"), Some("admin.x")), "{v}");
    let mut publ = Cli::spawn(&["pub", &url, "admin.x", "1", "--token", &token, "--id", "p-9"]);
    let v = publ.wait_json(STEP, |v| v["op"] == "error");
    assert_eq!(
        (v["code"].as_str(), v["ch"].as_str(), v["id"].as_str()),
        (Some("forbidden"), Some("admin.x"), Some("p-9")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_pipes_end_quietly() {
    let srv = Server::start("", &["--cores", "1"]);
    let url = srv.ws_url();
    // stdout closed (`tether sub … | head -0`): the first message ends it, exit 0, no panic.
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["sub", &url, "cli.pipe"])
        .env("TETHER_LOG", "off")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    srv.wait_gauge(1.0, STEP).await;
    // Published until `sub` meets its closed stdout (its subscription may not be live yet).
    let end = Instant::now() + STEP;
    while child.try_wait().expect("wait").is_none() && Instant::now() < end {
        srv.publish("cli.pipe", "1").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = wait_child(child);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "quiet: {}", String::from_utf8_lossy(&out.stderr));
    srv.wait_gauge(0.0, STEP).await;

    // stderr closed: lines that cannot be written are dropped, and Ctrl-C still exits 0.
    let other = Server::start("", &["--cores", "1"]);
    let urls = format!("{},{}", other.ws_url(), url);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["sub", &urls, "cli.pipe"])
        .env("TETHER_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stderr.take());
    other.wait_gauge(1.0, STEP).await;
    drop(other); // a `disconnected` line, then a `connected` line, on the closed stderr
    srv.wait_gauge(1.0, STEP).await;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = wait_child(child);
    assert_eq!(out.status.code(), Some(0), "no panic (101) on a closed stderr");
    // A refused pub whose stderr is closed: exit 1, not 101.
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["pub", &url, "bad name", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stderr.take());
    assert_eq!(wait_child(child).status.code(), Some(1));
}

fn wait_child(child: Child) -> std::process::Output {
    common::wait_child(child, STEP, "tether")
}

#[tokio::test]
async fn smaller_wording() {
    // --listen with a name resolves it.
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["serve", "--listen", "localhost:0", "--cores", "1"])
        .env("TETHER_LOG", "off")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(STEP);
    let _ = child.kill();
    let _ = child.wait();
    let line = line.expect("a listening line");
    assert!(line.starts_with("tether listening on 127.0.0.1:"), "{line}");
    let out = run_tether(&["serve", "--listen", "no-such-host.invalid:8098"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("use IP:PORT"), "{stderr}");

    // A 413 names the limit and its value.
    let small = Server::start("[limits]\nmax_publish_bytes = 4096\nqueue_max_bytes = 131072\n", &["--cores", "1"]);
    let (status, _, body) = http_request(small.addr, "POST", "/publish/c", &[], &vec![b'1'; 5000]).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 413);
    assert!(body.contains("limits.max_publish_bytes = 4096"), "{body}");

    // An invalid channel in HTTP is repeated, escaped.
    for (raw, shown) in [("bad%20name", "bad name"), ("a%0Ab", r"a\nb"), ("x%2Fy", "x/y")] {
        let (status, _, body) = http_request(small.addr, "POST", &format!("/publish/{raw}"), &[], b"1").await;
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, 400);
        assert!(v["error"].as_str().unwrap().contains(&format!("\"{shown}\"")), "{raw}: {v}");
    }

    // `pub` with data that is not JSON hints at quoting a string.
    let out = run_tether(&["pub", &small.ws_url(), "c", "hello"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("DATA is not JSON") && stderr.contains("quote it"), "{stderr}");
}
