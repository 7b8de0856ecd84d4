//! Resume replay paced by the queue, and live frames held behind it (the seam).

use super::*;

#[test]
fn replay_fills_at_most_half_the_queue_by_messages_and_refills_as_it_drains() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 8, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    assert_eq!(start(&mut s, &sim.at(1), 0, history("a", 1..=10), 10), None);
    assert_eq!(s.queue.len(), 4);
    // The other half is room for replies.
    assert!(s.reply(&sim.at(1), codec::text_frame(b"{}")));
    let mut out = write_all(&mut s, 2);
    assert_eq!(s.pump_replay(&sim.at(2)), (true, None));
    assert_eq!(s.queue.len(), 4);
    out.extend(write_all(&mut s, 3));
    assert_eq!(s.pump_replay(&sim.at(3)), (true, None));
    assert_eq!(s.queue.len(), 2);
    assert!(!s.replaying());
    out.extend(write_all(&mut s, 4));
    assert_eq!(seqs_of(&out, "a"), (1..=10).collect::<Vec<_>>());
}

#[test]
fn replay_fills_at_most_half_the_queue_by_bytes() {
    let len = msg("a", 1).len();
    let sim = Sim::new(SessionConfig { queue_max_bytes: 4 * len + len / 2, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    start(&mut s, &sim.at(1), 0, history("a", 1..=5), 5);
    assert_eq!(s.queue.len(), 2);
}

#[test]
fn replay_frame_larger_than_half_the_queue_still_goes_out_one_at_a_time() {
    let len = msg("a", 1).len();
    let sim = Sim::new(SessionConfig { queue_max_bytes: len, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    start(&mut s, &sim.at(1), 0, history("a", 1..=3), 3);
    assert_eq!(s.queue.len(), 1, "an empty queue takes one frame, however large");
    assert_eq!(s.pump_replay(&sim.at(1)), (false, None));
    write_all(&mut s, 2);
    assert_eq!(s.pump_replay(&sim.at(2)), (true, None));
    assert_eq!(s.queue.len(), 1);
}

#[test]
fn replay_asks_for_the_next_batch_once_and_continues_with_it() {
    let sim = Sim::new(cfg());
    let mut s = sim.open(0, &mut rng());
    let f = start(&mut s, &sim.at(1), 0, history("a", 1..=3), 9);
    assert_eq!(f, Some(Fetch { ch: Arc::from("a"), after: 3, until: 9 }));
    let mut out = write_all(&mut s, 2);
    assert_eq!(s.pump_replay(&sim.at(2)), (false, None), "one fetch in flight at a time");
    let f = s.replay_batch(&sim.at(3), "a", history("a", 4..=6), None);
    assert_eq!(f, Some(Fetch { ch: Arc::from("a"), after: 6, until: 9 }));
    assert_eq!(s.replay_batch(&sim.at(4), "a", history("a", 7..=9), None), None);
    assert!(!s.replaying());
    out.extend(write_all(&mut s, 5));
    assert_eq!(seqs_of(&out, "a"), (1..=9).collect::<Vec<_>>());
}

#[test]
fn evicted_history_sends_a_reset_then_the_held_live_frames() {
    let sim = Sim::new(cfg());
    let mut s = sim.open(0, &mut rng());
    assert!(start(&mut s, &sim.at(1), 0, history("a", 1..=2), 10).is_some());
    assert!(s.enqueue(&sim.at(2), msg("a", 11), 0, Some(Overflow::Disconnect)));
    assert!(s.enqueue(&sim.at(2), msg("a", 12), 0, Some(Overflow::Disconnect)));
    assert_eq!(s.replay_batch(&sim.at(3), "a", Vec::new(), Some(7)), None);
    assert!(!s.replaying());
    let out = write_all(&mut s, 4);
    let texts: Vec<_> = frames(&out).iter().map(|(_, p)| json(p)).collect();
    let ops: Vec<_> = texts.iter().map(|v| v["op"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(ops, ["msg", "msg", "reset", "msg", "msg"]);
    let reset = &texts[2];
    assert_eq!(
        (reset["reason"].as_str(), reset["seq"].as_u64(), reset["oldest"].as_u64()),
        (Some("evicted"), Some(10), Some(7))
    );
    assert_eq!(seqs_of(&out, "a"), [1, 2, 11, 12]);
}

#[test]
fn batch_answered_after_our_close_queues_no_data_frame() {
    // RFC 6455 §5.5.1: no data frame may follow our close frame, even when the home's answer
    // to a fetch sent before the close arrives after it.
    let sim = Sim::new(cfg());
    let mut s = sim.open(0, &mut rng());
    assert!(start(&mut s, &sim.at(1), 0, history("a", 1..=2), 10).is_some());
    write_all(&mut s, 1);
    s.close(&sim.at(2), CloseCode::Normal, "bye", ReapReason::Close);
    assert_eq!(s.replay_batch(&sim.at(3), "a", history("a", 3..=4), None), None);
    assert_eq!(s.replay_batch(&sim.at(3), "a", Vec::new(), Some(7)), None);
    assert_eq!(only_close(&write_all(&mut s, 4)), (1000, "bye".to_string()));
}

// ---- the hold-behind-replay seam ----

#[test]
fn live_frames_wait_behind_the_replay_and_follow_it_without_gap_or_duplicate() {
    // Room for every live frame held here: this test is about order, not overflow.
    let sim = Sim::new(SessionConfig { queue_max_messages: 16, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    let mut in_flight = start(&mut s, &sim.at(1), 0, history("a", 1..=3), 10);
    let mut out = Vec::new();
    let mut live = 11;
    for now in 2..200 {
        // One live message arrives per step while the replay runs, and a few after it.
        if live <= 18 {
            let queued_before = s.queue.len();
            let replaying = s.replaying();
            assert!(s.enqueue(&sim.at(now), msg("a", live), 0, Some(Overflow::Disconnect)));
            if replaying {
                assert_eq!(s.queue.len(), queued_before, "live seq {live} jumped the replay");
            }
            live += 1;
        }
        out.extend(write(&mut s, 50, now));
        let (_, f) = s.pump_replay(&sim.at(now));
        if f.is_some() {
            assert!(in_flight.is_none(), "second fetch while one is in flight");
            in_flight = f;
        }
        if now % 3 == 0 {
            // The home answers batches of at most three, some steps later.
            if let Some(f) = in_flight.take() {
                let batch = history("a", f.after + 1..=f.until.min(f.after + 3));
                in_flight = s.replay_batch(&sim.at(now), &f.ch, batch, None);
            }
        }
        if live > 18 && !s.replaying() && s.queue.is_empty() {
            break;
        }
    }
    assert!(!s.replaying() && in_flight.is_none());
    assert_eq!(seqs_of(&out, "a"), (1..=18).collect::<Vec<_>>());
}

#[test]
fn live_frames_of_another_channel_are_not_held() {
    let sim = Sim::new(cfg());
    let mut s = sim.open(0, &mut rng());
    start(&mut s, &sim.at(1), 0, history("a", 1..=2), 10);
    assert!(s.enqueue(&sim.at(2), msg("a", 11), 0, Some(Overflow::Disconnect)));
    assert!(s.enqueue(&sim.at(2), msg("b", 5), 1, Some(Overflow::Disconnect)));
    assert_eq!(msgs(&write_all(&mut s, 3)), pairs(&[("a", 1), ("a", 2), ("b", 5)]));
}

#[test]
fn held_frames_overflowing_under_disconnect_close_with_1013() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 4, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    start(&mut s, &sim.at(1), 0, history("a", 1..=2), 10);
    for seq in 11..=14 {
        assert!(s.enqueue(&sim.at(2), msg("a", seq), 0, Some(Overflow::Disconnect)));
    }
    assert!(!s.enqueue(&sim.at(2), msg("a", 15), 0, Some(Overflow::Disconnect)));
    assert_eq!(s.state(), State::ClosingByUs);
    assert_eq!(s.reap_reason(), Some(ReapReason::Overflow));
    // The replayed frames still queued are dropped: the close goes out first.
    let (code, reason) = only_close(&write_all(&mut s, 2));
    assert_eq!(code, 1013);
    assert!(reason.contains(r#""reason":"slow""#) && reason.contains("replay backlog"), "{reason}");
    assert_eq!(sim.metric(r#"tether_overflow_total{core="0",policy="disconnect"}"#), 1);
}

#[test]
fn held_frames_under_drop_oldest_keep_the_newest() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 2, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    assert!(start(&mut s, &sim.at(1), 0, history("a", 1..=1), 5).is_some());
    for seq in 6..=8 {
        assert!(s.enqueue(&sim.at(2), msg("a", seq), 0, Some(Overflow::DropOldest)));
    }
    s.replay_batch(&sim.at(3), "a", history("a", 2..=5), None);
    let mut out = Vec::new();
    for now in 4..20 {
        out.extend(write_all(&mut s, now));
        s.pump_replay(&sim.at(now));
    }
    assert_eq!(seqs_of(&out, "a"), [1, 2, 3, 4, 5, 7, 8]);
}

// ---- drain ----

#[test]
fn held_frames_under_conflate_keep_only_the_newest() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 2, ..cfg() });
    let mut s = sim.open(0, &mut rng());
    assert!(start(&mut s, &sim.at(1), 0, history("a", 1..=1), 5).is_some());
    for seq in 6..=8 {
        assert!(s.enqueue(&sim.at(2), msg("a", seq), 0, Some(Overflow::Conflate)));
    }
    s.replay_batch(&sim.at(3), "a", history("a", 2..=5), None);
    let mut out = Vec::new();
    for now in 4..20 {
        out.extend(write_all(&mut s, now));
        s.pump_replay(&sim.at(now));
    }
    // History in full, then only the newest live value once the held ones overflowed.
    assert_eq!(seqs_of(&out, "a"), [1, 2, 3, 4, 5, 8]);
}
