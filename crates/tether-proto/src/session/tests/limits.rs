//! Per-connection abuse limits as the session applies them: refused `pub`s answered with
//! `error` `limit`, unanswered pings, the 1008 close, and the pongs that never count.

use super::*;
use crate::session::limits::{Rates, SECOND};
use crate::tick::TICK_MS;

fn rated(publish_rate: u64, publish_bytes_rate: u64, control_frames_rate: u64) -> SessionConfig {
    let burst = if publish_bytes_rate == 0 { 0 } else { publish_bytes_rate.max(1 << 16) };
    SessionConfig {
        rates: Rates {
            publish_rate,
            publish_bytes_rate,
            publish_bytes_burst: burst,
            control_frames_rate,
            ..Rates::default()
        },
        ..cfg()
    }
}

fn publish(id: &str, data: &str) -> Vec<u8> {
    client(OP_TEXT, format!(r#"{{"op":"pub","ch":"a","id":"{id}","data":{data}}}"#).as_bytes())
}

/// The `error` objects among the text frames of `bytes`.
fn errors(bytes: &[u8]) -> Vec<serde_json::Value> {
    frames(bytes).iter().filter(|(op, _)| *op == OP_TEXT).map(|(_, p)| json(p)).filter(|v| v["op"] == "error").collect()
}

#[test]
fn pub_over_the_rate_is_answered_with_limit_and_retry_after_and_not_handed_up() {
    let sim = Sim::new(rated(2, 0, 0));
    let mut s = sim.open(0, &mut rng());
    assert!(s.limiter.is_none(), "nothing allocated before the first pub");
    let mut wire = Vec::new();
    for i in 0..3 {
        wire.extend_from_slice(&publish(&format!("p{i}"), "1"));
    }
    let ops = feed(&mut s, &sim.at(5), &wire);
    assert_eq!(ops.len(), 2, "the third pub never reaches the broker");
    let errs = errors(&write_all(&mut s, 5));
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0]["code"], "limit");
    assert_eq!(errs[0]["id"], "p2");
    assert_eq!(errs[0]["retry_after_ms"], 500, "one token at 2 per second");
    assert!(errs[0]["reason"].as_str().unwrap().contains("publish_rate"), "{}", errs[0]);
    assert_eq!(s.state(), State::Open);
    // Retrying after the hint succeeds.
    assert_eq!(feed(&mut s, &sim.at(55), &publish("p2", "1")).len(), 1);
    assert_eq!(sim.metric(r#"tether_limit_refusals_total{core="0",limit="publish_rate"}"#), 1);
}

#[test]
fn pub_flood_past_ten_times_the_rate_in_a_second_closes_with_1008_naming_the_limit() {
    let sim = Sim::new(rated(2, 0, 0));
    let mut s = sim.open(0, &mut rng());
    // 2 pass (the burst), refusals 1..=20 are answered, the 21st (past 10 × 2) closes.
    let wire: Vec<u8> = (0..30).flat_map(|i| publish(&format!("p{i}"), "1")).collect();
    let ops = feed(&mut s, &sim.at(1), &wire);
    assert_eq!(ops.len(), 2);
    let out = write_all(&mut s, 1);
    let f = frames(&out);
    let errs = errors(&out);
    assert_eq!(errs.len(), 21, "every refusal is answered, the last one too");
    assert_eq!(errs[20]["id"], "p22");
    let (op, payload) = f.last().expect("frames");
    assert_eq!(*op, OP_CLOSE, "the close follows the last answer");
    let (code, reason) = close_of(payload);
    assert_eq!(code, 1008);
    assert_eq!(CloseReason::parse(&reason), Some(CloseReason::limit("publish_rate")));
    assert_eq!(s.state(), State::ClosingByUs);
    assert_eq!(s.reap_reason(), Some(ReapReason::Limit));
    assert_eq!(sim.metric(r#"tether_limit_refusals_total{core="0",limit="publish_rate"}"#), 21);
    assert_eq!(sim.metric(r#"tether_closes_total{core="0",code="1008"}"#), 1);
}

#[test]
fn a_publisher_that_follows_retry_after_is_never_closed() {
    let sim = Sim::new(rated(5, 0, 0));
    let mut s = sim.open(0, &mut rng());
    let mut now = 0;
    let mut acked = 0;
    for i in 0..200 {
        let ops = feed(&mut s, &sim.at(now), &publish(&format!("p{i}"), "1"));
        acked += ops.len();
        if let Some(e) = errors(&write_all(&mut s, now)).first() {
            now += (e["retry_after_ms"].as_u64().unwrap() / TICK_MS) as Tick;
        }
    }
    assert_eq!(s.state(), State::Open);
    assert!(acked >= 100, "only {acked} of 200 passed");
}

#[test]
fn bytes_rate_counts_data_bytes() {
    // 65536 data bytes per second (the burst is at least max_message_bytes = 65536).
    let sim = Sim::new(rated(0, 1 << 16, 0));
    let mut s = sim.open(0, &mut rng());
    let big = format!("\"{}\"", "x".repeat(40_000));
    assert_eq!(feed(&mut s, &sim.at(1), &publish("a", &big)).len(), 1);
    assert_eq!(feed(&mut s, &sim.at(1), &publish("b", &big)).len(), 0);
    let errs = errors(&write_all(&mut s, 1));
    assert_eq!(errs.len(), 1);
    assert!(errs[0]["reason"].as_str().unwrap().contains("publish_bytes_rate"), "{}", errs[0]);
    // 40,002 needed, 25,534 held: 14,468 more at 65,536 per second is 221 ms, 230 in ticks.
    assert_eq!(errs[0]["retry_after_ms"], 230);
    assert_eq!(feed(&mut s, &sim.at(1), &publish("c", "1")).len(), 1, "a small one still fits");
    assert_eq!(sim.metric(r#"tether_limit_refusals_total{core="0",limit="publish_bytes_rate"}"#), 1);
    assert_eq!(sim.metric(r#"tether_limit_refusals_total{core="0",limit="publish_rate"}"#), 0);
}

#[test]
fn pings_beyond_the_rate_go_unanswered_and_a_flood_closes_with_1008() {
    let sim = Sim::new(rated(0, 0, 10));
    let mut s = sim.open(0, &mut rng());
    let wire: Vec<u8> = (0..200).flat_map(|_| client(OP_PING, b"p")).collect();
    feed(&mut s, &sim.at(1), &wire);
    let f = frames(&write_all(&mut s, 1));
    let pongs = f.iter().filter(|(op, _)| *op == OP_PONG).count();
    assert_eq!(pongs, 10, "the burst is answered, nothing beyond");
    let (op, payload) = f.last().expect("frames");
    assert_eq!(*op, OP_CLOSE);
    assert_eq!(close_of(payload), (1008, CloseReason::limit("control_frames_rate").to_json()));
    // 10 answered, then refusals 1..=101: the 101st is past 10 × 10.
    assert_eq!(sim.metric(r#"tether_limit_refusals_total{core="0",limit="control_frames"}"#), 101);
    assert_eq!(s.reap_reason(), Some(ReapReason::Limit));
}

#[test]
fn pongs_to_our_heartbeat_never_count_but_unsolicited_ones_do() {
    // One control frame per second: a single unsolicited pong uses it up.
    let sim = Sim::new(SessionConfig { ping_interval: 20, pong_timeout: 10, ..rated(0, 0, 1) });
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    let (mut pings, mut now) = (0, 0);
    while pings < 50 {
        now = s.poll_timeout();
        s.handle_timeout(&sim.at(now), None, &mut rng);
        let out = write_all(&mut s, now);
        if out.is_empty() {
            continue; // the pong deadline of the previous ping, already answered
        }
        assert_eq!(out, [0x89, 0x00], "a heartbeat ping at {now}");
        pings += 1;
        now += 1;
        feed(&mut s, &sim.at(now), &client(OP_PONG, b""));
    }
    assert!(s.limiter.is_none(), "answered pongs allocate nothing");
    assert_eq!(s.state(), State::Open);
    // An unsolicited pong takes the token, so a ping right after it is not answered.
    feed(&mut s, &sim.at(now), &client(OP_PONG, b""));
    feed(&mut s, &sim.at(now), &client(OP_PING, b"x"));
    assert!(write_all(&mut s, now).is_empty());
    assert_eq!(sim.metric(r#"tether_limit_refusals_total{core="0",limit="control_frames"}"#), 1);
    // A second later the rate allows one again.
    feed(&mut s, &sim.at(now + SECOND), &client(OP_PING, b"y"));
    assert_eq!(frames(&write_all(&mut s, now + SECOND)), vec![(OP_PONG, Bytes::from_static(b"y"))]);
}

#[test]
fn unlimited_rates_allocate_nothing_and_refuse_nothing() {
    let sim = Sim::new(rated(0, 0, 0));
    let mut s = sim.open(0, &mut rng());
    let mut wire: Vec<u8> = (0..500).flat_map(|i| publish(&format!("p{i}"), "1")).collect();
    wire.extend((0..50).flat_map(|_| client(OP_PING, b"")));
    assert_eq!(feed(&mut s, &sim.at(1), &wire).len(), 500);
    assert_eq!(frames(&write_all(&mut s, 1)).len(), 50, "50 pongs");
    assert!(s.limiter.is_none());
}
