//! The shipped TLS proxy recipes work (issue 30, item 5): the real nginx and HAProxy, started
//! from docs/recipes/nginx.conf and docs/recipes/haproxy.cfg with only their addresses,
//! certificate paths and (to keep the test short) their 75 s idle timeouts replaced, terminate
//! TLS for a plain `tether serve` on 127.0.0.1 with a test CA made at test time.
//!
//! Through each, an independent client (Python `ssl` + `websockets`, trusting only the test CA)
//! subscribes over `wss://`, stays idle longer than the proxy's idle timeout (only tether's
//! heartbeat keeps the connection open: the recipes' rule "timeout above the ping interval"),
//! gets published messages, is cut without a close frame, misses messages, reconnects and
//! resumes with `from` + `epoch` (docs/protocol.md), and ends with every seq exactly once, in
//! order. Through nginx, Server-Sent Events over `https://` stream as they are published.
//!
//! tether does not read `X-Forwarded-For` (no trusted-proxy setting; it sees the proxy as the
//! peer): the recipes set the forwarded headers for other backends only, and nothing here
//! checks that tether uses them.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use common::proxy::{Proxy, ProxyOpts, TestCa};
use common::{Server, STEP};

/// tether's heartbeat in these tests; the proxies' idle timeouts are [`PROXY_IDLE`].
const SERVER_TOML: &str = "[heartbeat]\nping_interval_ms = 500\n";
/// The proxies' idle timeouts, rendered in place of the recipes' 75 s: above the 500 ms ping
/// interval with the recipes' margin (well over 1.5 x), below [`HOLD`].
const PROXY_IDLE: Duration = Duration::from_secs(2);
/// How long the client stays idle before the first publish: past [`PROXY_IDLE`].
const HOLD: Duration = Duration::from_secs(3);
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common/tls_proxy_client.py");

/// The Python client: its stdin, and its stdout lines through a channel (read with a bound).
struct Client {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Client {
    fn start(args: &[&str]) -> Client {
        let mut child = Command::new("python3")
            .arg(SCRIPT)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn python3 (pip install websockets: scripts/setup)");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stdin = child.stdin.take().unwrap();
        Client { child, stdin, lines }
    }

    /// The next line, which must start with `want`; panics with what came instead.
    fn expect(&self, want: &str, limit: Duration, proxy: &Proxy) -> String {
        match self.lines.recv_timeout(limit) {
            Ok(line) if line.starts_with(want) => line,
            Ok(line) => panic!("client said {line:?}, expected {want:?}\n{}", proxy.log_text()),
            Err(_) => panic!("client said nothing within {limit:?}, expected {want:?}\n{}", proxy.log_text()),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Subscribe, hold idle past the proxy's timeout, 3 messages, cut, 4 missed, resume, 2 live:
/// seqs 1..=9 exactly once, in order, the missed ones replayed with `recovered: true`.
fn subscribe_cut_resume(proxy: &Proxy, server: &Server, ca: &TestCa) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ch = "tls.resume";
    let url = proxy.wss_url();
    let hold = format!("{}", HOLD.as_secs_f64());
    let mut client = Client::start(&["ws", &url, ca.ca_cert.to_str().unwrap(), ch, &hold, "3", "4", "2"]);
    client.expect("subscribed", STEP, proxy);
    // The messages below reach the connection that was idle past the proxy's timeout.
    client.expect("held", HOLD + STEP, proxy);
    let publish = |n: u64| rt.block_on(server.publish(ch, &format!("{{\"n\":{n}}}")));
    for n in 1..=3 {
        assert_eq!(publish(n), n);
    }
    client.expect("cut", STEP, proxy);
    for n in 4..=7 {
        assert_eq!(publish(n), n);
    }
    writeln!(client.stdin, "go").unwrap();
    client.expect("resumed", STEP, proxy);
    for n in 8..=9 {
        assert_eq!(publish(n), n);
    }
    let last = client.expect("{", STEP, proxy);
    let got: serde_json::Value = serde_json::from_str(&last).unwrap();
    let seqs: Vec<u64> = got["seqs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=9).collect::<Vec<u64>>(), "every seq exactly once, in order: {last}");
    let data: Vec<u64> = got["data"].as_array().unwrap().iter().map(|d| d["n"].as_u64().unwrap()).collect();
    assert_eq!(data, (1..=9).collect::<Vec<u64>>(), "the published bodies: {last}");
    assert_eq!(got["recovered"], true, "the resume was honoured: {last}");
}

/// tether, a test CA, and `proxy` (`Proxy::nginx` or `Proxy::haproxy`) in front of it with the
/// idle timeouts at [`PROXY_IDLE`].
fn stack(proxy: fn(&TestCa, SocketAddr, ProxyOpts) -> Proxy) -> (Server, TestCa, Proxy) {
    let server = Server::start(SERVER_TOML, &[]);
    let ca = TestCa::new();
    let proxy = proxy(&ca, server.addr, ProxyOpts { idle_timeout: Some(PROXY_IDLE), ..ProxyOpts::default() });
    (server, ca, proxy)
}

#[test]
fn nginx_recipe_carries_a_wss_subscriber_through_a_cut_and_resume() {
    let (server, ca, proxy) = stack(Proxy::nginx);
    subscribe_cut_resume(&proxy, &server, &ca);
}

#[test]
fn haproxy_recipe_carries_a_wss_subscriber_through_a_cut_and_resume() {
    let (server, ca, proxy) = stack(Proxy::haproxy);
    subscribe_cut_resume(&proxy, &server, &ca);
}

#[test]
fn nginx_recipe_streams_sse_over_https_as_published() {
    let (server, ca, proxy) = stack(Proxy::nginx);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ch = "tls.sse";
    let hold = format!("{}", HOLD.as_secs_f64());
    let client = Client::start(&["sse", &proxy.addr.to_string(), ca.ca_cert.to_str().unwrap(), ch, &hold]);
    client.expect("open", STEP, &proxy);
    client.expect("held", HOLD + STEP, &proxy);
    let sent = Instant::now();
    assert_eq!(rt.block_on(server.publish(ch, r#"{"n":1}"#)), 1);
    let event = client.expect("event ", STEP, &proxy);
    // One small event on an open stream: a buffering proxy would sit on it until the stream
    // ends or its buffer fills; 2 s is far above a loopback hop, far below STEP.
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(2), "the event took {took:?} through nginx");
    let msg: serde_json::Value = serde_json::from_str(&event["event ".len()..]).unwrap();
    assert_eq!((msg["seq"].as_u64(), msg["data"]["n"].as_u64()), (Some(1), Some(1)), "{event}");
}
