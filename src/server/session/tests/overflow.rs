//! The overflow policies of the outbound queue.

use super::*;

#[test]
fn disconnect_overflow_keeps_the_partly_written_front_and_closes_with_1013() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 4, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    let mut out = queue_behind_partial_front(&sim, &mut s, &[("a", 0, 2), ("b", 1, 1), ("a", 0, 3)]);
    assert!(!s.enqueue(&sim.at(2), msg("a", 4), 0, Some(Overflow::Disconnect)));
    assert_eq!(s.state(), State::ClosingByUs);
    assert_eq!(s.reap_reason(), Some(ReapReason::Overflow));
    out.extend(write_all(&mut s, 2));
    // Cutting a1 would corrupt the stream; the rest of the queued data is dropped.
    let f = frames(&out);
    assert_eq!(msgs(&out), pairs(&[("a", 1)]));
    assert_eq!(f.len(), 2);
    let (code, reason) = close_of(&f[1].1);
    assert_eq!(code, 1013);
    assert!(reason.contains(r#""reason":"slow""#) && reason.contains(r#""retry_after_ms":"#), "{reason}");
    assert_eq!(
        CloseReason::parse(&reason).and_then(|r| r.limit).as_deref(),
        Some("queue_max_bytes=65536,queue_max_messages=4")
    );
    assert_eq!(sim.metric(r#"tether_overflow_total{core="0",policy="disconnect"}"#), 1);
    assert_eq!(sim.metric(r#"tether_closes_total{core="0",code="1013"}"#), 1);
}

#[test]
fn drop_oldest_drops_the_channels_oldest_frame_but_never_the_front() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 4, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    let mut out = queue_behind_partial_front(&sim, &mut s, &[("a", 0, 2), ("b", 1, 1), ("a", 0, 3)]);
    assert!(s.enqueue(&sim.at(2), msg("a", 4), 0, Some(Overflow::DropOldest)));
    out.extend(write_all(&mut s, 2));
    assert_eq!(msgs(&out), pairs(&[("a", 1), ("b", 1), ("a", 3), ("a", 4)]));
    assert_eq!(s.state(), State::Open);
    assert_eq!(sim.metric(r#"tether_overflow_total{core="0",policy="drop-oldest"}"#), 1);
    assert_eq!(sim.metric(r#"tether_overflow_total{core="0",policy="disconnect"}"#), 0);
}

#[test]
fn drop_oldest_with_no_older_frame_of_the_channel_drops_the_new_one() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 4, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    let mut out = queue_behind_partial_front(&sim, &mut s, &[("b", 1, 1), ("b", 1, 2), ("b", 1, 3)]);
    assert!(!s.enqueue(&sim.at(2), msg("a", 2), 0, Some(Overflow::DropOldest)));
    assert_eq!(s.state(), State::Open);
    out.extend(write_all(&mut s, 2));
    assert_eq!(msgs(&out), pairs(&[("a", 1), ("b", 1), ("b", 2), ("b", 3)]));
}

#[test]
fn conflate_keeps_only_the_newest_frame_of_the_channel() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 4, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    let mut out = queue_behind_partial_front(&sim, &mut s, &[("a", 0, 2), ("b", 1, 1), ("a", 0, 3)]);
    assert!(s.enqueue(&sim.at(2), msg("a", 4), 0, Some(Overflow::Conflate)));
    out.extend(write_all(&mut s, 2));
    // Every older queued frame of `a` is gone, not just the newest one: a ticker that starts
    // reading again gets the current value, not a backlog of stale ones.
    assert_eq!(msgs(&out), pairs(&[("a", 1), ("b", 1), ("a", 4)]));
    assert_eq!(sim.metric(r#"tether_overflow_total{core="0",policy="conflate"}"#), 1);
}

#[test]
fn conflate_never_rewrites_the_partly_written_front() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 4, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    let mut out = queue_behind_partial_front(&sim, &mut s, &[("b", 1, 1), ("b", 1, 2), ("b", 1, 3)]);
    assert!(!s.enqueue(&sim.at(2), msg("a", 2), 0, Some(Overflow::Conflate)));
    out.extend(write_all(&mut s, 2));
    assert_eq!(msgs(&out), pairs(&[("a", 1), ("b", 1), ("b", 2), ("b", 3)]));
}

#[test]
fn reply_overflowing_the_byte_limit_closes_like_disconnect() {
    let sim = Sim::new(SessionConfig { queue_max_bytes: 100, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    // Two 40-byte msg frames leave 20 bytes: a 32-byte reply does not fit, whatever the
    // channel's policy.
    assert_eq!(msg("a", 1).len(), 40);
    assert!(s.enqueue(&sim.at(1), msg("a", 1), 0, Some(Overflow::DropOldest)));
    assert!(s.enqueue(&sim.at(1), msg("a", 2), 0, Some(Overflow::DropOldest)));
    assert!(!s.reply(&sim.at(1), codec::text_frame(&[b' '; 30])));
    assert_eq!(s.reap_reason(), Some(ReapReason::Overflow));
    let (code, reason) = only_close(&write_all(&mut s, 1));
    assert_eq!(code, 1013);
    assert!(reason.contains("queue_max_bytes=100"), "{reason}");
    assert_eq!(sim.metric(r#"tether_overflow_total{core="0",policy="disconnect"}"#), 1);
}

// ---- resume replay ----
