//! `tether load fanout --non-readers`: subscribers that never read are closed 1013 by a
//! server whose channels say `overflow = "disconnect"`, or kept open with a gap under
//! `drop-oldest`, and either way stay out of the readers' figures (docs/benchmarks.md, "The
//! load generator"). The load tool's own crate cannot start a server, so this runs here.

use std::time::Duration;

use tether_load::Report;

/// A 1-core in-process server whose channels use `overflow`, with a 1 MiB queue: a
/// non-reader overflows within the run, while a reader rides out a stall of its thread of
/// over 200 ms on a busy box (64 messages of 16 KiB; a 256 KiB queue let readers overflow
/// too when the test ran beside a build) — and publishes capped at 64 KiB, so the queue holds
/// the largest one, and a close deadline longer than the run so a non-reader that reads at
/// the end still finds the close frame (docs/protocol.md, close handshake).
fn slow_consumer_server(overflow: &str) -> tether::server::Server {
    let toml = format!(
        "listen = \"127.0.0.1:0\"\ncores = 1\n[limits]\nqueue_max_bytes = 1048576\nmax_publish_bytes = 65536\nclose_timeout_ms = 20000\n[drain]\nwindow_ms = 200\n\
         [[channels]]\npattern = \"*\"\noverflow = \"{overflow}\"\nhistory = 10\n"
    );
    let cfg = tether::config::Config::from_toml_str(&toml).expect("valid config");
    tether::server::Server::start(cfg, tether::server::ServeOptions::default()).expect("server starts")
}

/// Runs `fanout` with 4 readers and 2 non-readers, 16 KiB at 300 msg/s for 2 s: 9.4 MiB per
/// subscriber, past a non-reader's 1 MiB queue plus what its kernel buffers absorb even
/// without the small MSS (the server's send buffer autotunes up to `tcp_wmem` max, 4 MiB by
/// default).
fn fanout_with_non_readers(url: String) -> Report {
    let args = tether_load::FanoutArgs {
        urls: vec![url],
        publish_url: None,
        subs: 4,
        rate: 300.0,
        size: 16384,
        duration: Duration::from_secs(2),
        channels: 1,
        publish: tether_load::PublishVia::Ws,
        raw: None,
        grace: Duration::from_secs(5),
        non_readers: 2,
        non_reader_rcvbuf: 4096,
        non_reader_mss: 1460,
        sse: false,
        payload: tether_load::Payload::Pad,
        deflate: false,
        common: tether_load::CommonArgs {
            threads: 1,
            concurrency: 16,
            sources: None,
            child_index: None,
            child_of: None,
            ca: None,
        },
    };
    tether_load::fanout::run(args).expect("fanout runs")
}

fn field(r: &Report, key: &str) -> serde_json::Value {
    r.get(key).cloned().unwrap_or(serde_json::Value::Null)
}

#[test]
fn non_readers_get_1013_and_stay_out_of_the_figures() {
    let server = slow_consumer_server("disconnect");
    let r = fanout_with_non_readers(format!("ws://{}/ws", server.local_addr()));
    assert_eq!(field(&r, "errors"), 0, "{}", r.to_json_line());
    assert_eq!(field(&r, "lost"), 0, "{}", r.to_json_line());
    assert_eq!(field(&r, "deliveries"), field(&r, "expected"), "{}", r.to_json_line());
    assert_eq!(field(&r, "non_readers_subscribed"), 2, "{}", r.to_json_line());
    assert_eq!(field(&r, "non_readers_closed"), 2, "{}", r.to_json_line());
    assert_eq!(field(&r, "non_reader_close_kinds"), serde_json::json!({"closed_1013": 2}), "{}", r.to_json_line());
    server.shutdown(tether::ws::codec::CloseCode::Away);
    server.wait();
}

#[test]
fn drop_oldest_keeps_non_readers_open_with_a_gap() {
    let server = slow_consumer_server("drop-oldest");
    let r = fanout_with_non_readers(format!("ws://{}/ws", server.local_addr()));
    assert_eq!(field(&r, "errors"), 0, "{}", r.to_json_line());
    assert_eq!(field(&r, "non_readers_open"), 2, "{}", r.to_json_line());
    assert!(field(&r, "non_reader_lost").as_u64().unwrap_or(0) > 0, "{}", r.to_json_line());
    server.shutdown(tether::ws::codec::CloseCode::Away);
    server.wait();
}
