//! The close handshake, the fail path (RFC 6455 §7.1.7) and the drain close.

use super::*;

#[test]
fn our_close_queues_the_frame_and_ends_at_the_peers_close() {
    let sim = Sim::new(cfg());
    let mut s = sim.open(0, &mut rng());
    s.close(&sim.at(10), CloseCode::Normal, "bye", ReapReason::Close);
    assert_eq!(s.state(), State::ClosingByUs);
    assert_eq!(only_close(&write_all(&mut s, 10)), (1000, "bye".to_string()));
    // RFC 6455 §7.1.2: after our close, data is neither sent nor taken in.
    assert!(!s.reply(&sim.at(11), codec::text_frame(b"{}")));
    assert!(feed(&mut s, &sim.at(11), &client(OP_TEXT, br#"{"op":"sub","ch":"a"}"#)).is_empty());
    feed(&mut s, &sim.at(12), &client(OP_CLOSE, &1000u16.to_be_bytes()));
    assert_eq!(s.state(), State::Closed);
    assert_eq!(s.reap_reason(), Some(ReapReason::Close));
    assert_eq!(sim.metric(r#"tether_closes_total{core="0",code="1000"}"#), 1);
}

#[test]
fn our_close_ends_at_the_close_deadline_without_the_peers_close() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    s.close(&sim.at(10), CloseCode::Normal, "bye", ReapReason::Close);
    assert_eq!(s.poll_timeout(), 60);
    s.handle_timeout(&sim.at(59), None, &mut rng);
    assert_eq!(s.state(), State::ClosingByUs);
    s.handle_timeout(&sim.at(60), None, &mut rng);
    assert_eq!(s.state(), State::Closed);
    // The first reason decided wins: the close timeout does not relabel why we closed.
    assert_eq!(s.reap_reason(), Some(ReapReason::Close));
}

#[test]
fn peer_close_is_echoed_then_fin_then_linger_until_the_close_deadline() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    let mut payload = 1001u16.to_be_bytes().to_vec();
    payload.extend_from_slice(b"going");
    feed(&mut s, &sim.at(10), &client(OP_CLOSE, &payload));
    assert_eq!(s.state(), State::Finishing);
    assert!(!s.poll_fin(&sim.at(10)), "the echo is not written yet");
    assert_eq!(only_close(&write_all(&mut s, 11)), (1001, String::new()));
    assert!(s.poll_fin(&sim.at(11)));
    assert!(!s.poll_fin(&sim.at(12)), "FIN is sent once");
    assert_eq!(s.state(), State::Lingering);
    assert_eq!(s.poll_timeout(), 61);
    s.handle_timeout(&sim.at(60), None, &mut rng);
    assert_eq!(s.state(), State::Lingering);
    s.handle_timeout(&sim.at(61), None, &mut rng);
    assert_eq!(s.state(), State::Closed);
    assert_eq!(s.reap_reason(), Some(ReapReason::Close), "the handshake itself completed");
    assert_eq!(sim.metric(r#"tether_closes_total{core="0",code="1001"}"#), 1);
}

/// The peer's close is answered ahead of the deliveries still queued (RFC 6455 §5.5.1: as
/// soon as practical), so a client reading a backlog is not cut at the close deadline before
/// our close frame: the partly written front frame is finished (cutting it would corrupt the
/// stream) and replies stay; deliveries not begun are dropped.
#[test]
fn peer_close_is_answered_ahead_of_queued_deliveries_but_after_replies_and_the_front() {
    let sim = Sim::new(cfg());
    let mut s = sim.open(0, &mut rng());
    let mut out = queue_behind_partial_front(&sim, &mut s, &[("b", 1, 1), ("a", 0, 2)]);
    assert!(s.reply(&sim.at(2), codec::text_frame(br#"{"op":"pong"}"#)));
    assert!(s.enqueue(&sim.at(2), msg("b", 2), 1, Some(Overflow::Disconnect)));
    feed(&mut s, &sim.at(3), &client(OP_CLOSE, &1000u16.to_be_bytes()));
    assert_eq!(s.state(), State::Finishing);
    out.extend(write_all(&mut s, 3));
    let f = frames(&out);
    assert_eq!(msgs(&out), pairs(&[("a", 1)]), "only the front delivery is finished");
    assert_eq!(f.len(), 3, "front, the reply, the close: {f:?}");
    assert_eq!(f[1].1, br#"{"op":"pong"}"#.to_vec(), "the reply stays");
    assert_eq!(close_of(&f[2].1), (1000, String::new()));
    assert!(s.poll_fin(&sim.at(3)));
}

// ---- fail path (RFC 6455 §7.1.7) ----

#[test]
fn unmasked_client_frame_fails_with_1002() {
    let sim = Sim::new(cfg());
    let mut s = sim.open(0, &mut rng());
    feed(&mut s, &sim.at(3), &[0x81, 0x02, b'h', b'i']);
    assert_failed(&sim, &mut s, 3, 1002);
}

#[test]
fn invalid_utf8_text_fails_with_1007() {
    let sim = Sim::new(cfg());
    let mut s = sim.open(0, &mut rng());
    feed(&mut s, &sim.at(3), &client(OP_TEXT, &[b'{', 0xff, 0xfe, b'}']));
    assert_failed(&sim, &mut s, 3, 1007);
}

#[test]
fn oversize_message_fails_with_1009() {
    let sim = Sim::new(SessionConfig { max_message_bytes: 16, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    feed(&mut s, &sim.at(3), &client(OP_TEXT, &[b' '; 17]));
    assert_failed(&sim, &mut s, 3, 1009);
}

#[test]
fn failed_connection_lingers_after_fin_and_keeps_the_protocol_reason() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    feed(&mut s, &sim.at(3), &[0x81, 0x00]);
    write_all(&mut s, 3);
    assert!(s.poll_fin(&sim.at(4)));
    // Input after FIN is dropped, never parsed (it would fail the connection again).
    assert!(feed(&mut s, &sim.at(5), &client(OP_TEXT, br#"{"op":"sub","ch":"a"}"#)).is_empty());
    assert!(s.queue.is_empty());
    s.handle_timeout(&sim.at(54), None, &mut rng);
    assert_eq!(s.state(), State::Closed);
    assert_eq!(s.reap_reason(), Some(ReapReason::Protocol));
}

// ---- overflow policies ----

#[test]
fn drain_deadline_closes_with_1012_restart_and_a_retry_hint() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let (s, code, reason) = drain_close(&sim, &mut rng, CloseCode::Restart);
    assert_eq!(code, 1012);
    assert_eq!(reason.reason, "restart");
    assert!(reason.retry_after_ms.is_some_and(|ms| ms <= DRAIN_RETRY_SPREAD_MS), "{reason:?}");
    assert_eq!(s.state(), State::ClosingByUs);
    assert_eq!(s.reap_reason(), Some(ReapReason::Drain));
    assert!(!s.flags.has(Flags::DRAIN));
}

#[test]
fn drain_with_going_away_closes_with_1001_shutdown() {
    let sim = Sim::new(cfg());
    let (_, code, reason) = drain_close(&sim, &mut rng(), CloseCode::Away);
    assert_eq!((code, &*reason.reason), (1001, "shutdown"));
}

#[test]
fn drain_retry_hints_differ_between_connections() {
    // A shared hint would bring every client back at the same moment.
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let hints: std::collections::BTreeSet<_> =
        (0..50).map(|_| drain_close(&sim, &mut rng, CloseCode::Restart).2.retry_after_ms.expect("hint")).collect();
    assert!(hints.len() >= 45, "{hints:?}");
}

#[test]
fn drain_is_scheduled_only_on_open_connections() {
    let sim = Sim::new(cfg());
    let mut s = Session::new(0, &sim.cfg);
    s.start_drain(5);
    assert_eq!(s.poll_timeout(), 30, "HTTP keeps its handshake deadline");
    assert!(!s.flags.has(Flags::DRAIN));
}

// ---- lifecycle ----
