//! Session rules on a simulated clock: no sockets, no sleeps.
//!
//! Each test drives one [`Session`] through its inputs (`handle_bytes`, `handle_timeout`,
//! `enqueue`, replay calls) at chosen ticks and checks what it would write, when it wants to be
//! woken and how it ends. Durations below are in ticks (10 ms).

use std::io::IoSlice;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::replay::Fetch;
use super::stats::{CLOSE_CODES, FAILURE_NAMES, LIMIT_NAMES, OVERFLOW_POLICIES};
use super::*;
use crate::protocol::close::CloseReason;
use crate::protocol::ClientOp;
use crate::tick::Tick;
use crate::ws::codec::{decode_server_frame, encode_client_frame};

const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];
const OP_TEXT: u8 = 0x1;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// Limits roomy enough to stay out of the way; tests narrow the one they exercise.
fn cfg() -> SessionConfig {
    SessionConfig {
        ping_interval: 100,
        pong_timeout: 20,
        close_timeout: 50,
        handshake_timeout: 30,
        queue_max_bytes: 1 << 16,
        queue_max_messages: 64,
        max_message_bytes: 1 << 16,
        max_header_bytes: 8192,
        max_publish_bytes: 1 << 16,
        rates: super::limits::Rates::default(),
        token_refresh_grace: 50,
    }
}

/// One core's limits and counters, handing out a [`Ctx`] at any tick.
struct Sim {
    cfg: SessionConfig,
    m: SessionStats,
    deflate: crate::ws::deflate::Deflate,
}

impl Sim {
    fn new(cfg: SessionConfig) -> Sim {
        Sim { cfg, m: SessionStats::default(), deflate: Default::default() }
    }

    fn at(&self, now: Tick) -> Ctx<'_> {
        Ctx { now, cfg: &self.cfg, stats: &self.m, deflate: &self.deflate }
    }

    /// A session upgraded at `now`, its 101 response already written.
    fn open(&self, now: Tick, rng: &mut StdRng) -> Session {
        let mut s = Session::new(now, &self.cfg);
        s.upgrade(&self.at(now), b"HTTP/1.1 101 Switching Protocols\r\n\r\n".to_vec(), false, false, rng);
        write_all(&mut s, now);
        s
    }

    /// The count behind one Prometheus series of the server's `/metrics` (the one core of
    /// this simulation), e.g. `tether_overflow_total{core="0",policy="conflate"}`.
    fn metric(&self, series: &str) -> u64 {
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let value = labels.rsplit_once("=\"").map(|(_, v)| v.trim_end_matches("\"}"));
        let at = |names: &[&str]| {
            let v = value.unwrap_or_else(|| panic!("no label in {series}"));
            names.iter().position(|n| *n == v).unwrap_or_else(|| panic!("no label value {v} in {series}"))
        };
        let m = &self.m;
        match name {
            "tether_closes_total" => {
                let codes: Vec<String> = CLOSE_CODES.iter().map(u16::to_string).collect();
                let codes: Vec<&str> = codes.iter().map(String::as_str).collect();
                m.closes[at(&codes)].load(Relaxed)
            }
            "tether_handshake_failures_total" => m.handshake_failures[at(&FAILURE_NAMES)].load(Relaxed),
            "tether_limit_refusals_total" => m.limit_refusals[at(&LIMIT_NAMES)].load(Relaxed),
            "tether_overflow_total" => m.overflow[at(&OVERFLOW_POLICIES)].load(Relaxed),
            "tether_pings_sent_total" => m.pings_sent.load(Relaxed),
            _ => panic!("no series {series} among the session's counters"),
        }
    }
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(7)
}

fn msg(ch: &str, seq: u64) -> Bytes {
    crate::protocol::msg_frame(ch, seq, "1")
}

/// Plays a socket that accepts at most `max` bytes of what the session offers.
fn write(s: &mut Session, max: usize, now: Tick) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut iov = [IoSlice::new(&[]); queue::MAX_IOV];
        let n = s.poll_transmit(&mut iov);
        for slice in &iov[..n] {
            out.extend_from_slice(slice);
        }
    }
    out.truncate(max);
    s.transmitted(out.len(), now);
    out
}

/// Plays a socket that takes everything queued.
fn write_all(s: &mut Session, now: Tick) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let chunk = write(s, usize::MAX, now);
        if chunk.is_empty() {
            return out;
        }
        out.extend_from_slice(&chunk);
    }
}

/// The (opcode, payload) of every server frame in `bytes`, which must end on a frame boundary.
fn frames(mut bytes: &[u8]) -> Vec<(u8, Bytes)> {
    let mut v = Vec::new();
    while !bytes.is_empty() {
        let (n, fin, op, payload) = decode_server_frame(bytes).expect("valid server frame").expect("whole frame");
        assert!(fin, "the server never fragments");
        v.push((op, payload));
        bytes = &bytes[n..];
    }
    v
}

/// Code and reason of a close frame payload.
fn close_of(payload: &[u8]) -> (u16, String) {
    (u16::from_be_bytes([payload[0], payload[1]]), String::from_utf8(payload[2..].to_vec()).expect("UTF-8 reason"))
}

/// The only frame in `bytes`, which must be a close frame: its code and reason.
fn only_close(bytes: &[u8]) -> (u16, String) {
    let f = frames(bytes);
    assert_eq!(f.len(), 1, "expected one close frame, got {f:?}");
    assert_eq!(f[0].0, OP_CLOSE);
    close_of(&f[0].1)
}

fn json(payload: &[u8]) -> serde_json::Value {
    serde_json::from_slice(payload).expect("JSON text frame")
}

/// (channel, seq) of every `msg` frame in `bytes`, in order.
fn msgs(bytes: &[u8]) -> Vec<(String, u64)> {
    frames(bytes)
        .iter()
        .filter(|(op, _)| *op == OP_TEXT)
        .map(|(_, p)| json(p))
        .filter(|v| v["op"] == "msg")
        .map(|v| (v["ch"].as_str().expect("ch").to_string(), v["seq"].as_u64().expect("seq")))
        .collect()
}

fn seqs_of(bytes: &[u8], ch: &str) -> Vec<u64> {
    msgs(bytes).into_iter().filter(|(c, _)| c == ch).map(|(_, s)| s).collect()
}

fn client(opcode: u8, payload: &[u8]) -> Vec<u8> {
    encode_client_frame(opcode, true, payload, MASK)
}

/// Feeds `bytes` and returns the requests handed up; the answers the session made itself are
/// queued on it, as the core does when it serves them.
fn feed(s: &mut Session, ctx: &Ctx, bytes: &[u8]) -> Vec<ClientOp> {
    let mut events = Events::default();
    s.handle_bytes(ctx, bytes, &mut events);
    // As the core does on its next passes: what one turn left (MESSAGES_PER_TURN) goes on.
    while s.poll_turn_ended() && s.has_input() {
        s.handle_bytes(ctx, &[], &mut events);
    }
    let mut ops = Vec::new();
    while let Some(e) = events.poll_event() {
        match e {
            Event::Request(Inbound::Op(op)) => ops.push(op),
            Event::Request(Inbound::Answered { frame, .. }) => {
                s.reply(ctx, frame);
            }
            Event::PeerClosed { .. } | Event::Refused(_) => {}
        }
    }
    ops
}

// ---- handshake and HTTP deadlines ----

fn history(ch: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<Bytes> {
    seqs.map(|n| msg(ch, n)).collect()
}

fn start(s: &mut Session, ctx: &Ctx, from: u64, frames: Vec<Bytes>, until: u64) -> Option<Fetch> {
    s.start_replay(ctx, 0, Arc::from("a"), Arc::from("e1"), from, frames, until)
}

/// The session failed at tick `now` with `code`: close frame queued, FIN after it, no wait
/// for the peer's close.
fn assert_failed(sim: &Sim, s: &mut Session, now: Tick, code: u16) {
    assert_eq!(s.state(), State::Finishing);
    assert_eq!(s.reap_reason(), Some(ReapReason::Protocol));
    assert_eq!(s.poll_timeout(), now + sim.cfg.close_timeout);
    assert_eq!(only_close(&write_all(s, now)).0, code);
    assert_eq!(sim.metric(&format!(r#"tether_closes_total{{core="0",code="{code}"}}"#)), 1);
}

/// `a1` partly written (5 bytes out) then `rest` queued behind it; returns the bytes written.
fn queue_behind_partial_front(sim: &Sim, s: &mut Session, rest: &[(&str, u32, u64)]) -> Vec<u8> {
    assert!(s.enqueue(&sim.at(1), msg("a", 1), 0, Some(Overflow::Disconnect)));
    let head = write(s, 5, 1);
    assert_eq!(head.len(), 5);
    for &(ch, chan, seq) in rest {
        assert!(s.enqueue(&sim.at(1), msg(ch, seq), chan, Some(Overflow::Disconnect)));
    }
    head
}

fn pairs(v: &[(&str, u64)]) -> Vec<(String, u64)> {
    v.iter().map(|&(c, s)| (c.to_string(), s)).collect()
}

/// The drain close of a session opened at 0 and scheduled at 40, under `code`.
fn drain_close(sim: &Sim, rng: &mut StdRng, code: CloseCode) -> (Session, u16, CloseReason) {
    let mut s = sim.open(0, rng);
    s.start_drain(40);
    assert_eq!(s.poll_timeout(), 40, "the drain moves the deadline ahead of the first ping");
    s.handle_timeout(&sim.at(39), Some(code), rng);
    assert!(!s.has_output());
    s.handle_timeout(&sim.at(40), Some(code), rng);
    let (wire, reason) = only_close(&write_all(&mut s, 40));
    (s, wire, CloseReason::parse(&reason).expect("JSON close reason"))
}

mod close;
mod heartbeat;
mod lifecycle;
mod limits;
mod overflow;
mod replay;
mod sse;
mod token;
