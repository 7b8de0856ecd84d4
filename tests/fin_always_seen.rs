//! A peer's FIN is always seen (issue 26, item 5): a client that shuts down its sending side
//! (`shutdown(SHUT_WR)`) at any point of the stream has its connection closed by the server
//! within 1 s (the client reads EOF, no server socket stays in `CLOSE_WAIT`) and taken out of
//! the connection gauge, not left for the heartbeat to reap 25–45 s later.
//!
//! Each EOF position is tried with 50 connections at once, with the FIN right behind the data
//! (the same segment or the same readiness report, the case that was missed) and, for the
//! mid-frame position, 20 ms after it; on every monoio driver and readiness source
//! ([`DRIVERS`]). The clients are raw blocking `std` sockets that do the upgrade themselves,
//! so the test controls exactly which bytes reach the server before the FIN.
//!
//! Two faults failed it: a FIN reported in the same readiness report as the last bytes was
//! never read (a short read stopped there, and no later edge came), and, on the readiness
//! ring, a connection torn down while its poll had a wake-up queued kept its socket open
//! after the close (the poll's removal failed; it is cancelled now), so the client never read
//! EOF (docs/architecture.md, "Readiness").

mod common;

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::drivers::{start, Setup, DRIVERS};
use common::*;
use tether::ws::codec::encode_client_frame;

/// Connections per case.
const CONNS: usize = 50;

/// How soon after the FIN the server must have closed its side and dropped the connection.
const WITHIN: Duration = Duration::from_secs(1);

const MASK: [u8; 4] = [0x5a, 0x17, 0xc3, 0x09];

/// Where the client's stream ends.
#[derive(Debug, Clone, Copy)]
enum Position {
    /// Half of the upgrade request's head.
    MidHead,
    /// A whole upgrade request, the FIN in the same write (before the 101 is read).
    HeadThenFin,
    /// A whole keep-alive `POST /publish` (answered before the close).
    HttpRequest,
    /// A `POST /publish` head and 3 of its 10 body bytes.
    HttpMidBody,
    /// Upgraded, nothing sent.
    Upgraded,
    /// Upgraded, the first byte of a frame header.
    MidFrameHeader,
    /// Upgraded, a frame header up to half its masking key.
    MidMaskingKey,
    /// Upgraded, a masked text frame header declaring 100 bytes and 10 of them (the issue's
    /// input).
    MidFrame,
    /// Upgraded, a whole `sub` request (answered before the close).
    AfterFrame,
    /// Upgraded, a whole frame and the first 10 bytes of the next.
    FrameThenMidFrame,
    /// Upgraded, a close frame (the close handshake may be answered first).
    AfterCloseFrame,
}

const POSITIONS: [Position; 11] = [
    Position::MidHead,
    Position::HeadThenFin,
    Position::HttpRequest,
    Position::HttpMidBody,
    Position::Upgraded,
    Position::MidFrameHeader,
    Position::MidMaskingKey,
    Position::MidFrame,
    Position::AfterFrame,
    Position::FrameThenMidFrame,
    Position::AfterCloseFrame,
];

/// The masked text frame header declaring 100 payload bytes and the first 10 of them.
fn partial_frame() -> Vec<u8> {
    let whole = encode_client_frame(OP_TEXT, true, &[b'x'; 100], MASK);
    whole[..2 + 4 + 10].to_vec()
}

fn sub_frame() -> Vec<u8> {
    encode_client_frame(OP_TEXT, true, br#"{"op":"sub","ch":"fin"}"#, MASK)
}

/// The bytes the client sends before its FIN, after the upgrade when the position has one.
fn tail(p: Position, addr: SocketAddr) -> Vec<u8> {
    let head = upgrade_request(addr, "/ws", SAMPLE_KEY).into_bytes();
    match p {
        Position::MidHead => head[..head.len() / 2].to_vec(),
        Position::HeadThenFin => head,
        Position::HttpRequest => publish_request(addr).into_bytes(),
        Position::HttpMidBody => {
            let r = publish_request(addr);
            r.as_bytes()[..r.len() - BODY.len() + 3].to_vec()
        }
        Position::Upgraded => Vec::new(),
        Position::MidFrameHeader => vec![0x81],
        Position::MidMaskingKey => partial_frame()[..4].to_vec(),
        Position::MidFrame => partial_frame(),
        Position::AfterFrame => sub_frame(),
        Position::FrameThenMidFrame => [sub_frame(), partial_frame()].concat(),
        Position::AfterCloseFrame => encode_client_frame(OP_CLOSE, true, &1000u16.to_be_bytes(), MASK),
    }
}

/// The body of the publishes: a JSON string of 10 bytes.
const BODY: &str = "\"01234567\"";

/// A keep-alive `POST /publish/fin` carrying [`BODY`].
fn publish_request(addr: SocketAddr) -> String {
    format!("POST /publish/fin HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{BODY}", BODY.len())
}

/// Whether the client upgrades before sending [`tail`].
fn upgrades_first(p: Position) -> bool {
    !matches!(p, Position::MidHead | Position::HeadThenFin | Position::HttpRequest | Position::HttpMidBody)
}

/// A blocking connection to `addr` that has read the 101 answer to its upgrade request.
fn upgraded(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect_timeout(&addr, STEP).expect("connect");
    s.set_read_timeout(Some(STEP)).unwrap();
    s.write_all(upgrade_request(addr, "/ws", SAMPLE_KEY).as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8];
    // Byte by byte, so no frame after the head is consumed (none is expected).
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).expect("read the 101"), 1, "closed during the upgrade: {head:?}");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "upgrade refused: {}", String::from_utf8_lossy(&head));
    s
}

/// Reads `s` until the server closes its side (EOF) or `end`; returns what was read, or
/// panics naming the connection and what it got.
fn read_to_eof(s: &mut TcpStream, end: Instant, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{what}: the server did not close within {WITHIN:?} of the FIN ({})", shown(&got));
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut chunk) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("{what}: the server did not close within {WITHIN:?} of the FIN ({})", shown(&got))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("{what}: read failed instead of EOF: {e}"),
        }
    }
}

/// What a connection read, for a failure message: its length and its last 120 bytes.
fn shown(got: &[u8]) -> String {
    let tail = &got[got.len().saturating_sub(120)..];
    format!("read {} bytes, ending {:?}", got.len(), String::from_utf8_lossy(tail))
}

/// The server sockets of local port `port` in state `CLOSE_WAIT` (`/proc/net/tcp`, state 08)
/// whose peer is one of `conns`: each is a FIN of ours the server has not acted on. (Other
/// peers, such as the metrics scrapes, are not counted: one of those may be in `CLOSE_WAIT` for
/// the moment between its client's close and the server's read of it.)
fn close_wait(port: u16, conns: &[TcpStream]) -> usize {
    let peers: HashSet<String> =
        conns.iter().map(|s| format!("{:04X}", s.local_addr().expect("local address").port())).collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3
                && f[1].rsplit(':').next() == Some(&format!("{port:04X}"))
                && f[2].rsplit(':').next().is_some_and(|p| peers.contains(p))
                && f[3] == "08"
        })
        .count()
}

/// One position with [`CONNS`] connections: their FINs go out `delay` after their data; the
/// server must close every one within [`WITHIN`] of the last FIN and count none of them.
async fn case(srv: &Server, setup: Setup, p: Position, delay: Duration) {
    let what = format!("{setup:?} {p:?} (FIN {delay:?} after the data)");
    let addr = srv.addr;
    let mut conns: Vec<TcpStream> =
        (0..CONNS)
            .map(|_| {
                if upgrades_first(p) {
                    upgraded(addr)
                } else {
                    TcpStream::connect_timeout(&addr, STEP).expect("connect")
                }
            })
            .collect();
    if upgrades_first(p) {
        srv.wait_gauge(CONNS as f64, STEP).await;
    }
    let bytes = tail(p, addr);
    for s in &mut conns {
        s.set_nodelay(true).unwrap();
        s.write_all(&bytes).unwrap();
        if delay.is_zero() {
            s.shutdown(Shutdown::Write).unwrap();
        }
    }
    if !delay.is_zero() {
        std::thread::sleep(delay);
        for s in &conns {
            s.shutdown(Shutdown::Write).unwrap();
        }
    }
    let end = Instant::now() + WITHIN;
    for (i, s) in conns.iter_mut().enumerate() {
        let got = read_to_eof(s, end, &format!("{what}, connection {i}"));
        let answer = match p {
            Position::HeadThenFin => Some("HTTP/1.1 101"),
            Position::HttpRequest => Some("HTTP/1.1 200"),
            _ => None,
        };
        if let Some(answer) = answer {
            assert!(got.starts_with(answer.as_bytes()), "{what}: {}", shown(&got));
        }
    }
    let left = end.saturating_duration_since(Instant::now()) + Duration::from_millis(50);
    let gauge = srv.metric("tether_connections", &[]).await;
    if gauge != 0.0 {
        // Every socket was closed, so the gauge must follow at once: one more scrape's grace.
        srv.wait_metric("tether_connections", &[], left, |v| v == 0.0).await;
    }
    assert_eq!(close_wait(addr.port(), &conns), 0, "{what}: server sockets left in CLOSE_WAIT");
}

/// Every EOF position, the FIN right behind the data, 50 connections each, on every driver and
/// readiness source; and the issue's mid-frame input with the FIN 20 ms late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fin_is_seen_at_every_position() {
    for setup in DRIVERS {
        let srv = start(setup, "", "2");
        for p in POSITIONS {
            case(&srv, setup, p, Duration::ZERO).await;
        }
        case(&srv, setup, Position::MidFrame, Duration::from_millis(20)).await;
        case(&srv, setup, Position::AfterFrame, Duration::from_millis(20)).await;
        assert_eq!(srv.gauge().await, 0.0, "{setup:?}: connections left in the gauge");
    }
}

/// A FIN that arrives while the connection's answers are being written (a `sub` per frame,
/// 200 frames in the write the FIN follows) is still seen: the server answers what it read,
/// then closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fin_behind_many_requests_is_seen() {
    for setup in DRIVERS {
        let srv = start(setup, "", "1");
        let addr = srv.addr;
        let mut conns: Vec<TcpStream> = (0..CONNS).map(|_| upgraded(addr)).collect();
        srv.wait_gauge(CONNS as f64, STEP).await;
        let burst: Vec<u8> = (0..200)
            .flat_map(|i| encode_client_frame(OP_TEXT, true, format!(r#"{{"op":"sub","ch":"b{i}"}}"#).as_bytes(), MASK))
            .collect();
        for s in &mut conns {
            s.write_all(&burst).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
        }
        let end = Instant::now() + WITHIN;
        for (i, s) in conns.iter_mut().enumerate() {
            read_to_eof(s, end, &format!("{setup:?} burst, connection {i}"));
        }
        srv.wait_gauge(0.0, WITHIN).await;
        assert_eq!(close_wait(addr.port(), &conns), 0, "{setup:?}: server sockets left in CLOSE_WAIT");
    }
}
