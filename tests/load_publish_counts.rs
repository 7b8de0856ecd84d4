//! `tether load publish` counts what the server acknowledged: every publish sent within the
//! interval is acked once (ids are unique per connection, so none is taken for a duplicate),
//! nothing is left in flight, and the server stored exactly as many messages as were sent.

use std::time::Duration;

use tether::config::Config;
use tether::server::{ServeOptions, Server};
use tether_load::args::{CommonArgs, PublishArgs};

#[test]
fn publish_acks_every_publish_with_several_in_flight() {
    let cfg = Config { listen: "127.0.0.1:0".parse().unwrap(), cores: 2, ..Config::default() };
    let server = Server::start(cfg, ServeOptions::default()).expect("server starts");
    let args = PublishArgs {
        url: format!("ws://{}/ws", server.local_addr()),
        publishers: 4,
        window: 3,
        size: 64,
        duration: Duration::from_millis(300),
        channels: 2,
        grace: Duration::from_secs(2),
        common: CommonArgs { threads: 2, concurrency: 16, sources: None, child_index: None, child_of: None, ca: None },
    };
    let report = tether_load::throughput::run(args).expect("publish runs");
    let field = |k: &str| report.get(k).and_then(|v| v.as_u64()).unwrap_or(u64::MAX);
    let line = report.to_json_line();
    assert_eq!(field("connected"), 4, "{line}");
    assert!(field("sent") >= 12, "every publisher fills its window at least once: {line}");
    assert_eq!(field("acked"), field("sent"), "{line}");
    assert_eq!(field("unacked"), 0, "{line}");
    assert_eq!(field("refused"), 0, "{line}");
    assert_eq!(field("errors"), 0, "{line}");
    assert!(field("publishes_per_s") > 0, "{line}");
    assert_eq!(field("end_ns") - field("start_ns"), 300_000_000, "{line}");
    let stored: u64 =
        server.shared().metrics.iter().map(|m| m.published.load(std::sync::atomic::Ordering::Relaxed)).sum();
    assert_eq!(stored, field("sent"), "{line}");
    assert!(report.ok);
    server.shutdown(tether::ws::codec::CloseCode::Away);
}
