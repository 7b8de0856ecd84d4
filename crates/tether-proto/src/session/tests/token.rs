//! The token deadline folded into the one deadline: `token_expired`, the refresh grace, 4001.

use super::*;

/// The text frames in `bytes`, as JSON.
fn texts(bytes: &[u8]) -> Vec<serde_json::Value> {
    frames(bytes).iter().filter(|(op, _)| *op == OP_TEXT).map(|(_, p)| json(p)).collect()
}

/// A session opened at 0 holding grant 7 that expires at tick 30; pings far away (first one
/// after tick 500), so every deadline before that is the token's.
fn authenticated() -> (Sim, StdRng, Session) {
    let sim = Sim::new(SessionConfig { ping_interval: 1000, ..cfg() });
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    s.authenticate(7, 30);
    (sim, rng, s)
}

#[test]
fn expiry_warns_then_closes_4001_after_the_grace() {
    let (sim, mut rng, mut s) = authenticated();
    assert_eq!(s.grant(), Some(7));
    assert_eq!(s.poll_timeout(), 30, "the token expires before the first ping");
    s.handle_timeout(&sim.at(29), None, &mut rng);
    assert!(write_all(&mut s, 29).is_empty());

    s.handle_timeout(&sim.at(30), None, &mut rng);
    let sent = texts(&write_all(&mut s, 30));
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!((sent[0]["op"].as_str(), sent[0]["code"].as_str()), (Some("error"), Some("token_expired")));
    assert!(sent[0]["reason"].as_str().is_some_and(|r| r.contains("within 500 ms")), "{}", sent[0]);
    assert!(s.token_expired());
    assert_eq!(s.state(), State::Open, "deliveries go on during the grace");
    assert_eq!(s.poll_timeout(), 80, "grace of 50 ticks");

    s.handle_timeout(&sim.at(80), None, &mut rng);
    assert_eq!(s.state(), State::ClosingByUs);
    assert_eq!(s.reap_reason(), Some(ReapReason::TokenExpired));
    let (code, reason) = only_close(&write_all(&mut s, 80));
    assert_eq!((code, reason.as_str()), (4001, r#"{"reason":"token_expired"}"#));
    assert_eq!(sim.metric(r#"tether_closes_total{core="0",code="4001"}"#), 1);
}

#[test]
fn refresh_in_the_grace_moves_the_expiry_and_keeps_the_connection() {
    let (sim, mut rng, mut s) = authenticated();
    s.handle_timeout(&sim.at(30), None, &mut rng);
    write_all(&mut s, 30);
    assert_eq!(s.refresh(8, 200), Some(7), "the old grant goes back to the core");
    assert!(!s.token_expired());
    assert_eq!(s.grant(), Some(8));
    // The deadline filed for the grace's end only wakes the session early.
    let d = s.poll_timeout();
    s.handle_timeout(&sim.at(d), None, &mut rng);
    assert_eq!(s.state(), State::Open);
    assert!(write_all(&mut s, d).is_empty(), "no close, no error at the old grace end");
    assert_eq!(s.poll_timeout(), 200);
    s.handle_timeout(&sim.at(200), None, &mut rng);
    let sent = texts(&write_all(&mut s, 200));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["code"], "token_expired", "the new token expires in its turn");
}

#[test]
fn heartbeats_and_the_token_share_the_one_deadline() {
    let sim = Sim::new(SessionConfig { ping_interval: 20, pong_timeout: 10, ..cfg() });
    let mut rng = rng();
    let mut s = sim.open(0, &mut rng);
    s.authenticate(1, 45);
    let (mut pings, mut warned_at) = (0, None);
    let mut now = 0;
    while s.state() == State::Open {
        let d = s.poll_timeout();
        assert!(d > now || now == 0, "deadline {d} at {now}");
        now = d;
        assert!(now <= 200, "still open at {now}");
        s.handle_timeout(&sim.at(now), None, &mut rng);
        for (op, payload) in frames(&write_all(&mut s, now)) {
            match op {
                OP_PING => {
                    pings += 1;
                    // The peer answers every ping at once.
                    feed(&mut s, &sim.at(now), &client(OP_PONG, &[]));
                }
                OP_TEXT if json(&payload)["code"] == "token_expired" => warned_at = Some(now),
                OP_CLOSE => assert_eq!(close_of(&payload).0, 4001),
                _ => {}
            }
        }
    }
    assert_eq!(warned_at, Some(45), "token_expired exactly at the expiry");
    assert_eq!(now, 95, "closed exactly at the end of the grace");
    assert!(pings >= 3, "heartbeats continued around the token deadline ({pings} pings)");
    assert_eq!(s.reap_reason(), Some(ReapReason::TokenExpired));
}

#[test]
fn the_drain_close_comes_before_the_token_expiry() {
    let (sim, mut rng, mut s) = authenticated();
    s.start_drain(20);
    assert_eq!(s.poll_timeout(), 20);
    s.handle_timeout(&sim.at(20), Some(CloseCode::Restart), &mut rng);
    assert_eq!(only_close(&write_all(&mut s, 20)).0, 1012, "the drain's close, not token_expired");
}

#[test]
fn token_due_rounds_up_and_caps_far_expiries() {
    assert_eq!(token_due(100, 0), 100);
    assert_eq!(token_due(100, 1), 101);
    assert_eq!(token_due(100, 2000), 300);
    assert_eq!(token_due(u32::MAX - 5, 100), 4, "wraps like every tick");
    assert_eq!(token_due(0, u64::MAX), MAX_TOKEN_TICKS);
}
