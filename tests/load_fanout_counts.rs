//! `tether load fanout` counts loss and reordering correctly (issue 5, Tests): a relay between
//! the load generator and a real server drops seq 3 and swaps seqs 5 and 6 on every
//! subscriber's stream, so each subscriber must report exactly one lost and one reordered
//! message. Also: subscribers spread over several URLs (`--publish-url` for the publisher), and
//! raw mode (`--raw`) counts what an RFC 6455 echo endpoint sends back; and `--deflate`
//! subscribers (permessage-deflate, issue 29) count the same deliveries as plain ones while
//! receiving fewer bytes than they hand over.

use std::net::SocketAddr;
use std::time::Duration;

use tether::config::Config;
use tether::server::{ServeOptions, Server};
use tether::ws::codec::decode_server_frame;
use tether_load::args::{CommonArgs, FanoutArgs, Payload, PublishVia};
use tether_load::wire::{scan_str, scan_u64};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn start_server(echo: bool) -> Server {
    let cfg = Config { listen: "127.0.0.1:0".parse().unwrap(), cores: 1, ..Config::default() };
    Server::start(cfg, ServeOptions { echo, ..ServeOptions::default() }).expect("server starts")
}

fn common() -> CommonArgs {
    CommonArgs { threads: 2, concurrency: 16, sources: None, child_index: None, child_of: None, ca: None }
}

/// The fields every test leaves alone (no non-readers, WebSocket, padded payloads, no
/// compression); each test sets the rest.
fn quiet() -> FanoutArgs {
    FanoutArgs {
        urls: Vec::new(),
        publish_url: None,
        subs: 1,
        rate: 0.0,
        size: 64,
        duration: Duration::ZERO,
        channels: 1,
        publish: PublishVia::Ws,
        raw: None,
        grace: Duration::from_secs(1),
        non_readers: 0,
        non_reader_rcvbuf: 4096,
        non_reader_mss: 1460,
        sse: false,
        payload: Payload::Pad,
        deflate: false,
        common: common(),
    }
}

/// Starts the faulty relay in front of `upstream`; returns its address.
fn start_relay(upstream: SocketAddr) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                tokio::spawn(relay(client, upstream));
            }
        });
    });
    rx.recv().unwrap()
}

/// Client bytes go upstream untouched; server frames come back with `msg` seq 3 dropped and
/// seqs 5 and 6 delivered as 6, 5.
async fn relay(client: TcpStream, upstream: SocketAddr) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_rd, &mut server_wr).await;
    });
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    let mut head_done = false;
    let mut held: Option<Vec<u8>> = None;
    loop {
        let n = match server_rd.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut out = Vec::new();
        if !head_done {
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
            out.extend(buf.drain(..end + 4));
            head_done = true;
        }
        while let Ok(Some((consumed, _fin, opcode, payload))) = decode_server_frame(&buf) {
            let frame: Vec<u8> = buf.drain(..consumed).collect();
            let seq = (opcode == 0x1 && scan_str(&payload, "op") == Some(b"msg"))
                .then(|| scan_u64(&payload, "seq"))
                .flatten();
            match seq {
                Some(3) => {}
                Some(5) => held = Some(frame),
                Some(6) => {
                    out.extend_from_slice(&frame);
                    out.extend(held.take().unwrap_or_default());
                }
                _ => out.extend_from_slice(&frame),
            }
        }
        if client_wr.write_all(&out).await.is_err() {
            return;
        }
    }
}

#[test]
fn fanout_counts_one_drop_and_one_swap_per_subscriber() {
    let server = start_server(false);
    let relay = start_relay(server.local_addr());
    let subs = 3;
    let args = FanoutArgs {
        urls: vec![format!("ws://{relay}/ws")],
        subs,
        rate: 50.0,
        duration: Duration::from_millis(400),
        ..quiet()
    };
    let report = tether_load::fanout::run(args).expect("fanout runs");
    let field = |k: &str| report.get(k).and_then(|v| v.as_u64()).unwrap_or(u64::MAX);
    let published = field("published");
    assert_eq!(published, 20, "{}", report.to_json_line());
    assert_eq!(field("subscribed"), subs as u64);
    assert_eq!(field("lost"), subs as u64, "{}", report.to_json_line());
    assert_eq!(field("reordered"), subs as u64, "{}", report.to_json_line());
    assert_eq!(field("duplicates"), 0);
    assert_eq!(field("deliveries"), subs as u64 * (published - 1));
    assert_eq!(field("expected"), subs as u64 * published);
    server.shutdown(tether::ws::codec::CloseCode::Away);
}

#[test]
fn fanout_spreads_subscribers_over_urls_and_publishes_on_publish_url() {
    let server = start_server(false);
    let relay = start_relay(server.local_addr());
    let direct = format!("ws://{}/ws", server.local_addr());
    // Subscribers 0 and 2 go through the faulty relay, 1 and 3 straight to the server; the
    // publisher goes straight to the server too.
    let args = FanoutArgs {
        urls: vec![format!("ws://{relay}/ws"), direct.clone()],
        publish_url: Some(direct),
        subs: 4,
        rate: 50.0,
        duration: Duration::from_millis(400),
        ..quiet()
    };
    let report = tether_load::fanout::run(args).expect("fanout runs");
    let field = |k: &str| report.get(k).and_then(|v| v.as_u64()).unwrap_or(u64::MAX);
    assert_eq!(field("published"), 20, "{}", report.to_json_line());
    assert_eq!(field("subscribed"), 4);
    assert_eq!(field("lost"), 2, "{}", report.to_json_line());
    assert_eq!(field("reordered"), 2, "{}", report.to_json_line());
    assert_eq!(field("deliveries"), 2 * 19 + 2 * 20, "{}", report.to_json_line());
    server.shutdown(tether::ws::codec::CloseCode::Away);
}

#[test]
fn fanout_without_faults_reports_no_loss_over_http_publish_to_websocket_and_sse_subscribers() {
    for sse in [false, true] {
        fanout_without_faults(sse);
    }
}

/// 4 subscribers of `server` on 2 channels, 30 messages of 1 KiB in 300 ms (15 a channel).
fn four_on_two_channels(server: &Server) -> FanoutArgs {
    FanoutArgs {
        urls: vec![format!("ws://{}/ws", server.local_addr())],
        subs: 4,
        rate: 100.0,
        size: 1024,
        duration: Duration::from_millis(300),
        channels: 2,
        grace: Duration::from_secs(2),
        ..quiet()
    }
}

fn fanout_without_faults(sse: bool) {
    let server = start_server(false);
    let args = FanoutArgs { publish: PublishVia::Http, sse, ..four_on_two_channels(&server) };
    let report = tether_load::fanout::run(args).expect("fanout runs");
    let field = |k: &str| report.get(k).and_then(|v| v.as_u64()).unwrap_or(u64::MAX);
    assert_eq!(field("published"), 30);
    // 4 subscribers, 2 per channel, 15 messages per channel.
    assert_eq!(field("deliveries"), 60, "sse={sse}: {}", report.to_json_line());
    assert_eq!(field("lost"), 0);
    assert_eq!(field("reordered"), 0);
    assert_eq!(field("errors"), 0);
    assert!(report.ok);
    server.shutdown(tether::ws::codec::CloseCode::Away);
}

/// One fan-out of order-book snapshots (~1 KiB, over the server's default `min_bytes`) to 4
/// subscribers on 2 channels, offering permessage-deflate or not.
fn book_fanout(server: &Server, deflate: bool) -> tether_load::report::Report {
    let args = FanoutArgs { payload: Payload::Book, deflate, ..four_on_two_channels(server) };
    tether_load::fanout::run(args).expect("fanout runs")
}

#[test]
fn deflate_and_plain_subscribers_count_the_same_deliveries() {
    let server = start_server(false);
    let plain = book_fanout(&server, false);
    let deflate = book_fanout(&server, true);
    let field = |r: &tether_load::report::Report, k: &str| r.get(k).and_then(|v| v.as_u64()).unwrap_or(u64::MAX);
    for (r, agreed) in [(&plain, 0), (&deflate, 4)] {
        let line = r.to_json_line();
        assert_eq!(field(r, "published"), 30, "{line}");
        // 4 subscribers, 2 per channel, 15 messages per channel.
        assert_eq!(field(r, "deliveries"), 60, "{line}");
        assert_eq!((field(r, "lost"), field(r, "reordered"), field(r, "duplicates")), (0, 0, 0), "{line}");
        assert_eq!(field(r, "errors"), 0, "{line}");
        assert_eq!(field(r, "deflate_agreed"), agreed, "{line}");
        // Every delivery carried a ~1 KiB snapshot (inflated, for the deflate run).
        assert!(field(r, "message_bytes") >= 60 * 1024, "{line}");
    }
    // Plain frames are the message plus a header; compressed ones are smaller than the JSON
    // they inflate to.
    assert!(field(&plain, "wire_bytes") > field(&plain, "message_bytes"), "{}", plain.to_json_line());
    assert!(field(&deflate, "wire_bytes") < field(&deflate, "message_bytes") / 2, "{}", deflate.to_json_line());
    server.shutdown(tether::ws::codec::CloseCode::Away);
}

#[test]
fn raw_mode_counts_what_an_echo_endpoint_returns() {
    let server = start_server(true);
    let args = FanoutArgs {
        urls: vec![format!("ws://{}/echo", server.local_addr())],
        subs: 5,
        rate: 0.0,
        duration: Duration::from_millis(500),
        raw: Some(r#"{"k":1}"#.into()),
        ..quiet()
    };
    let report = tether_load::fanout::run(args).expect("raw fanout runs");
    let field = |k: &str| report.get(k).and_then(|v| v.as_u64()).unwrap_or(u64::MAX);
    assert_eq!(field("subscribed"), 5, "{}", report.to_json_line());
    assert_eq!(field("deliveries"), 5, "{}", report.to_json_line());
    assert_eq!(field("lost"), 0);
    assert_eq!(field("errors"), 0);
    server.shutdown(tether::ws::codec::CloseCode::Away);
}
