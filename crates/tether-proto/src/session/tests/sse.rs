//! The SSE transport: events instead of frames, comment heartbeats reaped by an unread queue,
//! closes as `event: close` and FIN, client bytes end the stream.

use super::*;

impl Sim {
    /// An SSE stream started at `now`, its head already written.
    fn stream(&self, now: Tick, rng: &mut StdRng) -> Session {
        let mut s = Session::new(now, &self.cfg);
        s.start_sse(&self.at(now), None, rng);
        let head = write_all(&mut s, now);
        assert!(head.starts_with(b"HTTP/1.1 200 OK\r\n"));
        s
    }
}

/// Runs the stream's next heartbeat deadline; returns its tick.
fn beat(s: &mut Session, sim: &Sim, rng: &mut StdRng) -> Tick {
    let due = s.poll_timeout();
    s.handle_timeout(&sim.at(due), None, rng);
    due
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).expect("UTF-8 stream")
}

#[test]
fn a_stream_counts_as_a_connection_and_writes_events() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.stream(0, &mut rng);
    assert!(s.is_upgraded() && s.is_sse());
    let ctx = sim.at(1);
    let ev = crate::sse::msg_from_frame(&msg("c", 1), "e").unwrap();
    assert!(s.enqueue(&ctx, ev, 0, Some(Overflow::Disconnect)));
    // Replies become their events or nothing.
    let unsub = crate::protocol::unsubscribed_json("c");
    assert!(!s.reply(&ctx, crate::ws::codec::text_frame(&unsub)));
    let err = crate::protocol::error_json("limit", "x", None);
    assert!(s.reply(&ctx, crate::ws::codec::text_frame(&err)));
    let out = text(&write_all(&mut s, 1));
    assert!(out.starts_with("event: msg\nid: c:e:1\ndata: {\"op\":\"msg\""), "{out}");
    assert!(out.contains("\n\nevent: error\ndata: {\"op\":\"error\",\"code\":\"limit\""), "{out}");
    assert!(!out.contains("unsubscribed"));
}

#[test]
fn heartbeat_is_a_comment_and_a_reading_peer_stays() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.stream(0, &mut rng);
    for _ in 0..5 {
        let d = beat(&mut s, &sim, &mut rng);
        assert_eq!(write_all(&mut s, d), b":\n");
        // The comment was written: no pong is awaited, its deadline passes quietly and the
        // next look is the next heartbeat.
        assert!(!s.flags.has(Flags::AWAIT_PONG));
        assert_eq!(beat(&mut s, &sim, &mut rng), d + 20);
        assert_eq!((s.state(), s.poll_timeout()), (State::Open, d + 100));
    }
    assert_eq!(sim.metric(r#"tether_pings_sent_total{core="0"}"#), 5);
}

#[test]
fn a_peer_that_takes_no_bytes_is_reaped_at_the_pong_deadline() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.stream(0, &mut rng);
    let d = beat(&mut s, &sim, &mut rng);
    // The socket takes nothing: the comment stays queued until the pong deadline.
    assert!(write(&mut s, 0, d).is_empty());
    assert_eq!(beat(&mut s, &sim, &mut rng), d + 20);
    assert_eq!((s.state(), s.reap_reason()), (State::Closed, Some(ReapReason::PongTimeout)));
}

#[test]
fn drain_ends_the_stream_with_a_spread_retry_then_fin() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut retries = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let mut s = sim.stream(0, &mut rng);
        s.start_drain(5);
        s.handle_timeout(&sim.at(5), Some(CloseCode::Restart), &mut rng);
        let out = text(&write_all(&mut s, 5));
        assert!(out.starts_with("event: close\ndata: {\"op\":\"close\",\"code\":1012,"), "{out}");
        let retry: u64 = out.rsplit("retry: ").next().unwrap().trim().parse().unwrap();
        assert!((1000..=1000 + DRAIN_RETRY_SPREAD_MS).contains(&retry), "{retry}");
        retries.insert(retry);
        assert!(s.poll_fin(&sim.at(5)), "FIN follows the close event");
        assert_eq!(s.state(), State::Lingering);
    }
    assert!(retries.len() > 25, "retries are spread: {retries:?}");
}

#[test]
fn overflow_disconnect_ends_the_stream_and_drops_the_queue() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 4, ..cfg() });
    let mut rng = rng();
    let mut s = sim.stream(0, &mut rng);
    let ctx = sim.at(1);
    for seq in 1..=5 {
        let ev = crate::sse::msg_from_frame(&msg("c", seq), "e").unwrap();
        s.enqueue(&ctx, ev, 0, Some(Overflow::Disconnect));
    }
    let out = text(&write_all(&mut s, 1));
    assert!(out.starts_with("event: close\ndata: {\"op\":\"close\",\"code\":1013,"), "{out}");
    assert!(out.contains("retry: 2000\n\n"), "{out}");
    assert!(!out.contains("event: msg"));
    assert_eq!(s.reap_reason(), Some(ReapReason::Overflow));
    assert!(s.poll_fin(&sim.at(1)));
}

#[test]
fn client_bytes_end_the_stream() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.stream(0, &mut rng);
    feed(&mut s, &sim.at(1), &[]);
    assert_eq!(s.state(), State::Open);
    feed(&mut s, &sim.at(1), b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(s.state(), State::Finishing);
    assert!(!s.has_input());
    assert!(s.poll_fin(&sim.at(1)));
}

#[test]
fn replay_converts_history_and_evictions() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.stream(0, &mut rng);
    let ctx = sim.at(1);
    let f = s.start_replay(&ctx, 0, "c".into(), "ep".into(), 2, history("c", 3..=4), 6);
    let f = f.expect("a fetch for 5..=6");
    assert!(s.replay_batch(&ctx, &f.ch, Vec::new(), Some(6)).is_none());
    let out = text(&write_all(&mut s, 1));
    let ids: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("id: ")).collect();
    assert_eq!(ids, ["c:ep:3", "c:ep:4", "c:ep:6"], "the reset names where it leaves the client");
    assert!(
        out.contains("event: reset\nid: c:ep:6\ndata: {\"op\":\"reset\",\"ch\":\"c\",\"seq\":6,\"epoch\":\"ep\""),
        "{out}"
    );
}

#[test]
fn the_record_does_not_grow() {
    assert!(std::mem::size_of::<Session>() <= 120);
}
