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
fn conflate_never_rewrites_the_partly_written_front_and_parks_the_newest() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 4, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    let mut out = queue_behind_partial_front(&sim, &mut s, &[("b", 1, 1), ("b", 1, 2), ("b", 1, 3)]);
    // The queue is full of another channel's frames and a1 is partly written: a2 waits
    // outside the queue, a3 replaces it there, and it goes out once a write makes room.
    assert!(s.enqueue(&sim.at(2), msg("a", 2), 0, Some(Overflow::Conflate)));
    assert!(s.enqueue(&sim.at(2), msg("a", 3), 0, Some(Overflow::Conflate)));
    out.extend(write_all(&mut s, 2));
    assert_eq!(msgs(&out), pairs(&[("a", 1), ("b", 1), ("b", 2), ("b", 3), ("a", 3)]));
}

#[test]
fn every_conflate_channel_gets_its_newest_value_however_many_there_are() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 4, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    // 10 conflate channels, 5 rounds of values, a queue of 4: each channel's newest value
    // arrives, once, after anything older of the same channel.
    let names: Vec<String> = (0..10).map(|c| format!("c{c}")).collect();
    for seq in 1..=5 {
        for (c, name) in names.iter().enumerate() {
            assert!(s.enqueue(&sim.at(1), msg(name, seq), c as u32, Some(Overflow::Conflate)));
        }
    }
    let got = msgs(&write_all(&mut s, 2));
    for name in &names {
        let seqs: Vec<u64> = got.iter().filter(|(c, _)| c == name).map(|&(_, q)| q).collect();
        assert_eq!(seqs.last(), Some(&5), "{name}: {seqs:?}");
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{name}: {seqs:?}");
    }
    // Unsubscribing forgets a parked value.
    for (c, name) in names.iter().enumerate() {
        assert!(s.enqueue(&sim.at(3), msg(name, 6), c as u32, Some(Overflow::Conflate)));
    }
    s.queue.release_channel(9);
    let got = msgs(&write_all(&mut s, 4));
    assert!(got.iter().all(|(c, _)| c != "c9"), "{got:?}");
    assert_eq!(got.len(), 9);
}

#[test]
fn reply_overflowing_the_byte_limit_closes_like_disconnect() {
    let sim = Sim::new(SessionConfig { queue_max_bytes: 100, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    // Two 40-byte msg frames of a `disconnect` channel leave 20 bytes: a 32-byte reply does
    // not fit, and nothing queued may be dropped for it.
    assert_eq!(msg("a", 1).len(), 40);
    assert!(s.enqueue(&sim.at(1), msg("a", 1), 0, Some(Overflow::Disconnect)));
    assert!(s.enqueue(&sim.at(1), msg("a", 2), 0, Some(Overflow::Disconnect)));
    assert!(!s.reply(&sim.at(1), codec::text_frame(&[b' '; 30])));
    assert_eq!(s.reap_reason(), Some(ReapReason::Overflow));
    let (code, reason) = only_close(&write_all(&mut s, 1));
    assert_eq!(code, 1013);
    assert!(reason.contains("queue_max_bytes=100"), "{reason}");
    assert_eq!(sim.metric(r#"tether_overflow_total{core="0",policy="disconnect"}"#), 1);
}

#[test]
fn a_reply_takes_the_place_of_drop_oldest_then_conflate_frames_never_of_others() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 5, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    // a1 partly written (disconnect), then c1 (conflate), d1 d2 (drop-oldest), a2: full.
    let mut out = queue_behind_partial_front(&sim, &mut s, &[]);
    assert!(s.enqueue(&sim.at(1), msg("c", 1), 2, Some(Overflow::Conflate)));
    assert!(s.enqueue(&sim.at(1), msg("d", 1), 1, Some(Overflow::DropOldest)));
    assert!(s.enqueue(&sim.at(1), msg("d", 2), 1, Some(Overflow::DropOldest)));
    assert!(s.enqueue(&sim.at(1), msg("a", 2), 0, Some(Overflow::Disconnect)));
    // A heartbeat-sized reply each: the oldest drop-oldest frame goes first, then the next,
    // then the conflate one; with only the front and `disconnect` frames left, it overflows.
    assert!(s.reply(&sim.at(1), codec::text_frame(b"{\"op\":\"r1\"}")));
    assert!(s.reply(&sim.at(1), codec::text_frame(b"{\"op\":\"r2\"}")));
    assert!(s.reply(&sim.at(1), codec::text_frame(b"{\"op\":\"r3\"}")));
    assert_eq!(s.state(), State::Open);
    assert_eq!(sim.metric(r#"tether_overflow_total{core="0",policy="drop-oldest"}"#), 2);
    assert_eq!(sim.metric(r#"tether_overflow_total{core="0",policy="conflate"}"#), 1);
    out.extend(write_all(&mut s, 2));
    // The conflate frame was the newest of its channel: it waited outside and comes last.
    assert_eq!(msgs(&out), pairs(&[("a", 1), ("a", 2), ("c", 1)]));
    let replies: Vec<String> = frames(&out)
        .iter()
        .filter(|(op, _)| *op == OP_TEXT)
        .map(|(_, p)| json(p))
        .filter(|v| v["op"] != "msg")
        .map(|v| v["op"].as_str().expect("op").to_string())
        .collect();
    assert_eq!(replies, ["r1", "r2", "r3"]);
    assert!(!s.reply(&sim.at(2), codec::text_frame(&[b' '; 1 << 16])));
    assert_eq!(s.reap_reason(), Some(ReapReason::Overflow));
}

#[test]
fn frames_of_an_ended_subscription_are_not_taken_for_the_next_channel_of_its_index() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 4, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    // x1..x3 of local channel 0 (`disconnect`) wait; the subscription ends and channel 0
    // becomes y (`conflate`): y's overflow must drop only y's own frames.
    assert!(s.enqueue(&sim.at(1), msg("x", 1), 0, Some(Overflow::Disconnect)));
    assert!(s.enqueue(&sim.at(1), msg("x", 2), 0, Some(Overflow::Disconnect)));
    assert!(s.enqueue(&sim.at(1), msg("x", 3), 0, Some(Overflow::Disconnect)));
    s.queue.release_channel(0);
    assert!(s.enqueue(&sim.at(1), msg("y", 1), 0, Some(Overflow::Conflate)));
    assert!(s.enqueue(&sim.at(1), msg("y", 2), 0, Some(Overflow::Conflate)));
    assert!(s.enqueue(&sim.at(1), msg("y", 3), 0, Some(Overflow::Conflate)));
    let out = write_all(&mut s, 1);
    assert_eq!(msgs(&out), pairs(&[("x", 1), ("x", 2), ("x", 3), ("y", 3)]));
}

// ---- resume replay ----
