//! Heartbeats: first-ping spreading, ping and pong deadlines, reaping silent peers.

use super::*;

#[test]
fn first_ping_lands_between_half_and_one_and_a_half_intervals() {
    // An odd interval checks the rounding at both ends: [503.5, 510.5) holds 504..=510.
    let sim = Sim::new(SessionConfig { ping_interval: 7, ..cfg() });
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let mut s = Session::new(500, &sim.cfg);
        s.upgrade(&sim.at(500), Vec::new(), false, false, &mut StdRng::seed_from_u64(seed));
        seen.insert(s.poll_timeout());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), (504..=510).collect::<Vec<_>>());
}

#[test]
fn first_pings_of_a_burst_spread_over_the_whole_interval() {
    let sim = Sim::new(SessionConfig { ping_interval: 1000, ..cfg() });
    let mut rng = rng();
    let mut buckets = [0u32; 20];
    for _ in 0..1000 {
        let mut s = Session::new(0, &sim.cfg);
        s.upgrade(&sim.at(0), Vec::new(), false, false, &mut rng);
        let d = s.poll_timeout();
        assert!((500..1500).contains(&d), "first ping at {d}");
        buckets[((d - 500) / 50) as usize] += 1;
    }
    // 50 expected per bucket; lock-step or half-interval bursts would leave buckets empty.
    assert!(buckets.iter().all(|&n| (30..=75).contains(&n)), "{buckets:?}");
}

#[test]
fn ping_is_queued_at_the_deadline_and_the_pong_deadline_comes_next() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    let d = s.poll_timeout();
    s.handle_timeout(&sim.at(d - 1), None, &mut rng);
    assert!(s.queue.is_empty(), "no ping before the deadline");
    s.handle_timeout(&sim.at(d), None, &mut rng);
    assert_eq!(write_all(&mut s, d), [0x89, 0x00]);
    assert!(s.flags.has(Flags::AWAIT_PONG));
    // pong (20) comes before the next ping (100)
    assert_eq!(s.poll_timeout(), d + 20);
    assert_eq!(sim.metric(r#"tether_pings_sent_total{core="0"}"#), 1);
}

#[test]
fn silent_peer_is_reaped_at_the_pong_deadline() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    let d = s.poll_timeout();
    s.handle_timeout(&sim.at(d), None, &mut rng);
    s.handle_timeout(&sim.at(d + 19), None, &mut rng);
    assert_eq!(s.state(), State::Open);
    s.handle_timeout(&sim.at(d + 20), None, &mut rng);
    assert_eq!(s.state(), State::Closed);
    assert_eq!(s.reap_reason(), Some(ReapReason::PongTimeout));
}

#[test]
fn pong_clears_the_wait_and_the_next_ping_comes_one_interval_after_the_last() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    let d = s.poll_timeout();
    s.handle_timeout(&sim.at(d), None, &mut rng);
    write_all(&mut s, d);
    feed(&mut s, &sim.at(d + 5), &client(OP_PONG, b""));
    assert!(!s.flags.has(Flags::AWAIT_PONG));
    s.handle_timeout(&sim.at(d + 20), None, &mut rng);
    assert_eq!(s.state(), State::Open);
    assert!(s.queue.is_empty(), "answered: no ping at the pong deadline");
    assert_eq!(s.poll_timeout(), d + 100);
    s.handle_timeout(&sim.at(d + 100), None, &mut rng);
    assert_eq!(write_all(&mut s, d + 100), [0x89, 0x00]);
    assert_eq!(s.poll_timeout(), d + 120);
}

#[test]
fn partial_frame_counts_as_liveness() {
    // A peer busy sending a large message may not get its pong through in time.
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    let d = s.poll_timeout();
    s.handle_timeout(&sim.at(d), None, &mut rng);
    let big = client(OP_TEXT, &[b' '; 1000]);
    feed(&mut s, &sim.at(d + 5), &big[..10]);
    s.handle_timeout(&sim.at(d + 20), None, &mut rng);
    assert_eq!(s.state(), State::Open);
}

#[test]
fn pong_timeout_longer_than_the_interval_waits_for_the_pong_not_a_second_ping() {
    let sim = Sim::new(SessionConfig { ping_interval: 20, pong_timeout: 50, ..cfg() });
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    let d = s.poll_timeout();
    s.handle_timeout(&sim.at(d), None, &mut rng);
    write_all(&mut s, d);
    assert_eq!(s.poll_timeout(), d + 20, "the ping time comes first");
    s.handle_timeout(&sim.at(d + 20), None, &mut rng);
    assert!(s.queue.is_empty(), "no second ping while one is unanswered");
    assert_eq!(s.poll_timeout(), d + 50);
    s.handle_timeout(&sim.at(d + 50), None, &mut rng);
    assert_eq!(s.reap_reason(), Some(ReapReason::PongTimeout));
}

#[test]
fn pong_within_the_interval_keeps_the_ping_rhythm_when_pong_timeout_is_longer() {
    let sim = Sim::new(SessionConfig { ping_interval: 20, pong_timeout: 50, ..cfg() });
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    let d = s.poll_timeout();
    s.handle_timeout(&sim.at(d), None, &mut rng);
    write_all(&mut s, d);
    feed(&mut s, &sim.at(d + 10), &client(OP_PONG, b""));
    s.handle_timeout(&sim.at(d + 20), None, &mut rng);
    assert_eq!(write_all(&mut s, d + 20), [0x89, 0x00]);
    assert_eq!(s.poll_timeout(), d + 40);
}

#[test]
fn heartbeat_deadlines_survive_the_clock_wrap() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let start = u32::MAX - 40;
    let mut s = sim.open(start, &mut rng);
    let d = s.poll_timeout();
    assert!(d < start, "first ping at {d} should have wrapped past 0");
    // Just before the wrapped deadline: a naive `now >= deadline` would ping here.
    s.handle_timeout(&sim.at(u32::MAX), None, &mut rng);
    assert!(s.queue.is_empty());
    s.handle_timeout(&sim.at(d), None, &mut rng);
    assert_eq!(write_all(&mut s, d), [0x89, 0x00]);
    assert_eq!(s.poll_timeout(), d + 20);
}

#[test]
fn ping_into_a_full_queue_closes_with_1013() {
    let sim = Sim::new(SessionConfig { queue_max_messages: 2, ..cfg() });
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    let d = s.poll_timeout();
    assert!(s.enqueue(&sim.at(1), msg("a", 1), 0, Some(Overflow::Disconnect)));
    assert!(s.enqueue(&sim.at(1), msg("a", 2), 0, Some(Overflow::Disconnect)));
    s.handle_timeout(&sim.at(d), None, &mut rng);
    assert_eq!(s.state(), State::ClosingByUs);
    // The close deadline, not a pong deadline, is what the timer must hold now.
    assert_eq!(s.poll_timeout(), d + 50);
    assert_eq!(only_close(&write_all(&mut s, d)).0, 1013);
}

// ---- Input that arrived but is not read yet ----

#[test]
fn only_deadlines_that_judge_the_peer_silent_read_waiting_input_first() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    // HTTP, never served: the handshake timeout waits for a request head.
    let http = Session::new(0, &sim.cfg);
    let h = http.poll_timeout();
    assert!(!http.timeout_awaits_input(h - 1));
    assert!(http.timeout_awaits_input(h));

    let mut s = sim.open(0, &mut rng);
    let d = s.poll_timeout();
    // The ping time judges nothing.
    assert!(!s.timeout_awaits_input(d));
    s.handle_timeout(&sim.at(d), None, &mut rng);
    write_all(&mut s, d);
    // The pong deadline does, once it is reached.
    assert_eq!(s.poll_timeout(), d + 20);
    assert!(!s.timeout_awaits_input(d + 19));
    assert!(s.timeout_awaits_input(d + 20));
    // Input read in time clears the wait: the deadline is the next ping time again.
    feed(&mut s, &sim.at(d + 20), &client(OP_PONG, b""));
    assert!(!s.timeout_awaits_input(d + 20));
    s.handle_timeout(&sim.at(d + 20), None, &mut rng);
    assert_eq!(s.state(), State::Open);

    // Our close waits for the peer's close frame or FIN.
    s.close(&sim.at(d + 30), CloseCode::Normal, "bye", ReapReason::Close);
    let c = s.poll_timeout();
    assert!(!s.timeout_awaits_input(c - 1));
    assert!(s.timeout_awaits_input(c));
}

#[test]
fn input_waiting_unread_keeps_a_pinged_peer_alive_but_no_other_state() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    let d = s.poll_timeout();
    s.handle_timeout(&sim.at(d), None, &mut rng);
    write_all(&mut s, d);
    assert!(s.timeout_awaits_input(d + 20));
    // Its reads are held (an overloaded server), but its bytes wait in the socket.
    s.input_waits();
    assert!(!s.timeout_awaits_input(d + 20));
    s.handle_timeout(&sim.at(d + 20), None, &mut rng);
    assert_eq!(s.state(), State::Open, "a peer whose input waits unread was reaped");
    assert_eq!(s.poll_timeout(), d + 100, "the next ping time");

    // A close we started still waits for the peer's close frame or FIN, not just any bytes.
    s.close(&sim.at(d + 30), CloseCode::Normal, "bye", ReapReason::Close);
    let c = s.poll_timeout();
    s.input_waits();
    assert!(s.timeout_awaits_input(c));
    assert_ne!(s.state(), State::Closed);
    s.handle_timeout(&sim.at(c), None, &mut rng);
    assert_eq!(s.state(), State::Closed, "the close timeout ended it");
}
