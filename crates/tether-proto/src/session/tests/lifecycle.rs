//! HTTP deadlines, the lifecycle helpers, and what WebSocket input becomes.

use super::*;

#[test]
fn never_upgraded_connection_dies_at_the_handshake_timeout() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = Session::new(1000, &sim.cfg);
    // A trickled request head must not buy more time (slowloris).
    feed(&mut s, &sim.at(1010), b"GET / HTTP/1.1\r\n");
    assert_eq!(s.poll_timeout(), 1030);
    s.handle_timeout(&sim.at(1029), None, &mut rng);
    assert!(matches!(s.state(), State::Http(_)));
    s.handle_timeout(&sim.at(1030), None, &mut rng);
    assert_eq!(s.state(), State::Closed);
    assert_eq!(s.reap_reason(), Some(ReapReason::HandshakeTimeout));
    assert_eq!(sim.metric(r#"tether_handshake_failures_total{core="0",reason="timeout"}"#), 1);
}

#[test]
fn keep_alive_http_connection_dies_idle_one_handshake_timeout_after_its_answer() {
    let sim = Sim::new(cfg());
    let mut rng = rng();
    let mut s = Session::new(0, &sim.cfg);
    feed(&mut s, &sim.at(10), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(matches!(s.next_request(&sim.cfg), Some(Ok(_))));
    s.respond(&sim.at(20), b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(), true);
    assert!(write_all(&mut s, 20).starts_with(b"HTTP/1.1 200 OK"));
    assert_eq!(s.poll_timeout(), 50);
    // The accept's handshake deadline (30) no longer applies once a request was served.
    s.handle_timeout(&sim.at(30), None, &mut rng);
    s.handle_timeout(&sim.at(49), None, &mut rng);
    assert!(matches!(s.state(), State::Http(_)));
    s.handle_timeout(&sim.at(50), None, &mut rng);
    assert_eq!(s.state(), State::Closed);
    assert_eq!(s.reap_reason(), Some(ReapReason::Eof));
    assert_eq!(sim.metric(r#"tether_handshake_failures_total{core="0",reason="timeout"}"#), 0);
}

#[test]
fn http_answer_without_keep_alive_finishes_once_written() {
    let sim = Sim::new(cfg());
    let mut s = Session::new(0, &sim.cfg);
    s.respond(&sim.at(5), b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(), false);
    assert_eq!(s.state(), State::Finishing);
    assert!(!s.poll_fin(&sim.at(5)), "no FIN before the answer is out");
    write_all(&mut s, 6);
    assert!(s.poll_fin(&sim.at(6)));
    assert_eq!(s.state(), State::Lingering);
}

// ---- heartbeat ----

#[test]
fn client_ping_is_answered_with_a_pong_of_its_payload_even_split_across_reads() {
    let sim = Sim::new(cfg());
    let mut s = sim.open(0, &mut rng());
    let ping = client(OP_PING, b"hi");
    feed(&mut s, &sim.at(1), &ping[..3]);
    assert!(s.queue.is_empty(), "a short read is not a frame");
    feed(&mut s, &sim.at(2), &ping[3..]);
    let out = frames(&write_all(&mut s, 2));
    assert_eq!(out, [(OP_PONG, Bytes::from_static(b"hi"))]);
    assert!(!s.has_pending_input());
}

#[test]
fn requests_are_handed_up_and_malformed_ones_answered_with_an_error() {
    let sim = Sim::new(cfg());
    let mut s = sim.open(0, &mut rng());
    let mut input = client(OP_TEXT, br#"{"op":"sub","ch":"a"}"#);
    input.extend(client(OP_TEXT, br#"{"op":"nope"}"#));
    let requests = feed(&mut s, &sim.at(1), &input);
    assert!(matches!(&requests[..], [ClientOp::Sub { ch, from: None, .. }] if ch == "a"), "{requests:?}");
    let out = frames(&write_all(&mut s, 1));
    assert_eq!(out.len(), 1);
    assert_eq!(json(&out[0].1)["op"], "error");
    assert_eq!(s.state(), State::Open);
}

// ---- close handshake ----

#[test]
fn only_http_open_and_closing_by_us_read_input() {
    let http = State::Http(HttpPhase::default());
    let reads =
        [http, State::Open, State::ClosingByUs, State::Finishing, State::Lingering, State::Closed].map(State::can_read);
    assert_eq!(reads, [true, true, true, false, false, false]);
}

#[test]
fn only_open_writes_new_frames() {
    let http = State::Http(HttpPhase { served: true, keep_alive: true, ..HttpPhase::default() });
    let writes = [http, State::Open, State::ClosingByUs, State::Finishing, State::Lingering, State::Closed]
        .map(State::can_write);
    assert_eq!(writes, [false, true, false, false, false, false]);
}

#[test]
fn flags_set_clear_and_has_every_bit() {
    let mut f = Flags::default();
    assert!(!f.has(Flags::TURN_ENDED));
    f.set(Flags::TURN_ENDED);
    f.set(Flags::AWAIT_PONG);
    assert!(f.has(Flags::TURN_ENDED) && f.has(Flags::AWAIT_PONG));
    assert!(!f.has(Flags::DRAIN));
    // `has` of several bits asks for all of them.
    assert!(f.has(Flags(Flags::TURN_ENDED.0 | Flags::AWAIT_PONG.0)));
    assert!(!f.has(Flags(Flags::TURN_ENDED.0 | Flags::DRAIN.0)));
    f.clear(Flags::TURN_ENDED);
    assert!(!f.has(Flags::TURN_ENDED));
    assert!(f.has(Flags::AWAIT_PONG), "clear touches only its own bits");
    f.clear(Flags::TURN_ENDED);
    assert_eq!(f, Flags::AWAIT_PONG);
}
