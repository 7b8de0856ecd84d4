//! Unit tests of [`super::Homes`]: numbering, history, dedup, fencing, sweeping, the channel cap.

use super::*;
use crate::server::broker::epoch::TOMBSTONES_PER_CORE;

const E: &str = "00000000000000e0";

fn homes(cores: usize) -> Homes {
    homes_with(cores, TOMBSTONES_PER_CORE)
}

fn homes_with(cores: usize, max_tombstones: usize) -> Homes {
    let cap = Arc::new(ChannelCap::new(usize::MAX));
    Homes::new(cores, Dedup::new(1000, 100), Numbering::new(E.into(), max_tombstones), cap)
}

/// [`Homes::publish`] well under `max_channels`.
fn publish(h: &mut Homes, ch: &str, id: Option<&str>, data: &[u8], cap: usize, now: u64) -> (Published, Arc<str>) {
    h.publish(ch, id, data, cap, now).expect("no channel cap in reach")
}

/// [`Homes::subscribe`] well under `max_channels`.
fn subscribe(
    h: &mut Homes,
    ch: &str,
    core: usize,
    from: Option<u64>,
    epoch: Option<&str>,
    cap: usize,
) -> (Arc<str>, u64, Arc<str>, Resume) {
    h.subscribe(ch, core, from, epoch, cap).expect("no channel cap in reach")
}

/// The seq a history frame carries.
fn seq_of(frame: &Bytes) -> u64 {
    let text = std::str::from_utf8(&frame[2..]).expect("a short text frame");
    let v: serde_json::Value = serde_json::from_str(text).expect("JSON");
    v["seq"].as_u64().expect("seq")
}

#[test]
fn seqs_start_at_one_and_history_is_bounded() {
    let mut h = homes(2);
    for i in 1..=5u64 {
        let (p, _) = publish(&mut h, "a", None, b"1", 3, 0);
        assert_eq!(p.seq, i);
    }
    let c = h.get("a").unwrap();
    assert_eq!((c.head, c.oldest()), (5, 3));
}

#[test]
fn duplicate_id_gets_original_seq_within_window_only() {
    let mut h = homes(1);
    let (p, _) = publish(&mut h, "a", Some("x"), b"1", 10, 0);
    assert!(p.frame.is_some());
    let (d, _) = publish(&mut h, "a", Some("x"), b"1", 10, 500);
    assert_eq!((d.seq, d.frame.is_none()), (1, true));
    let (other_ch, _) = publish(&mut h, "b", Some("x"), b"1", 10, 500);
    assert_eq!(other_ch.seq, 1);
    assert!(other_ch.frame.is_some());
    let (late, _) = publish(&mut h, "a", Some("x"), b"1", 10, 2000);
    assert_eq!(late.seq, 2);
}

/// A fenced publish as the memory broker makes it: the fence check, then the publish
/// when accepted; the seq, or the check that refused it.
fn fenced_publish(h: &mut Homes, ch: &str, feed: &str, token: u64, id: Option<&str>) -> Result<u64, FenceCheck> {
    let fence = Fence { feed: feed.into(), token };
    match h.fence(ch, &fence, 10).expect("no channel cap in reach") {
        FenceCheck::Accepted => Ok(publish(h, ch, id, b"1", 10, 0).0.seq),
        refused => Err(refused),
    }
}

#[test]
fn a_stale_fencing_token_is_refused_and_takes_no_seq() {
    let mut h = homes(1);
    assert_eq!(fenced_publish(&mut h, "a", "f", 1, Some("f:1")), Ok(1));
    assert_eq!(fenced_publish(&mut h, "a", "f", 2, Some("f:2")), Ok(2));
    assert_eq!(fenced_publish(&mut h, "a", "f", 2, Some("f:3")), Ok(3), "an equal token goes on");
    // The ex-owner (token 1) is fenced out: no seq, no history, no dedup record.
    assert_eq!(fenced_publish(&mut h, "a", "f", 1, Some("f:4")), Err(FenceCheck::Fenced { highest: 2 }));
    assert_eq!(h.get("a").unwrap().head, 3);
    assert_eq!(h.dedup.get("a", "f:4", 0), None);
    // The owner's next publish gets the next seq (no gap), even with the refused id.
    assert_eq!(fenced_publish(&mut h, "a", "f", 2, Some("f:4")), Ok(4));
    // Another feed on the same channel, and the same feed on another channel, are apart.
    assert_eq!(fenced_publish(&mut h, "a", "g", 1, None), Ok(5));
    assert_eq!(fenced_publish(&mut h, "b", "f", 1, None), Ok(1));
    // Unfenced publishes are not affected.
    assert_eq!(publish(&mut h, "a", None, b"1", 10, 0).0.seq, 6);
    // A takeover raises the highest: the old owner's token is refused from then on.
    assert_eq!(fenced_publish(&mut h, "a", "f", u64::MAX, None), Ok(7));
    assert_eq!(fenced_publish(&mut h, "a", "f", u64::MAX - 1, None), Err(FenceCheck::Fenced { highest: u64::MAX }));
}

#[test]
fn a_channel_keeps_the_tokens_of_a_bounded_number_of_feeds() {
    let mut h = homes(1);
    for i in 0..MAX_FEEDS_PER_CHANNEL as u64 {
        assert_eq!(fenced_publish(&mut h, "a", &format!("f{i}"), 1, None), Ok(i + 1));
    }
    assert_eq!(fenced_publish(&mut h, "a", "one.more", 1, None), Err(FenceCheck::TooManyFeeds));
    assert_eq!(h.get("a").unwrap().head, MAX_FEEDS_PER_CHANNEL as u64, "nothing stored");
    assert_eq!(fenced_publish(&mut h, "a", "f0", 1, None), Ok(MAX_FEEDS_PER_CHANNEL as u64 + 1));
}

#[test]
fn a_fence_check_over_max_channels_keeps_nothing() {
    let cap = Arc::new(ChannelCap::new(1));
    let mut h = Homes::new(1, Dedup::new(1000, 100), Numbering::new(E.into(), TOMBSTONES_PER_CORE), cap);
    publish(&mut h, "a", None, b"1", 10, 0);
    assert_eq!(h.fence("b", &Fence { feed: "f".into(), token: 1 }, 10), None);
    assert!(h.get("b").is_none());
}

#[test]
fn dedup_is_bounded() {
    let mut d = Dedup::new(1_000_000, 10);
    for i in 0..100 {
        d.insert("c", &i.to_string(), i, 0);
    }
    assert!(d.len() <= 10);
    assert_eq!(d.get("c", "99", 0), Some(99));
}

#[test]
fn resume_points() {
    let mut h = homes(1);
    for _ in 0..10 {
        publish(&mut h, "a", None, b"1", 4, 0);
    }
    let epoch = h.get("a").unwrap().epoch.clone();
    match subscribe(&mut h, "a", 0, Some(7), Some(&epoch), 4).3 {
        Resume::Recovered { from, frames, until } => assert_eq!((from, frames.len(), until), (7, 3, 10)),
        r => panic!("{r:?}"),
    }
    match subscribe(&mut h, "a", 0, Some(6), None, 4).3 {
        Resume::Recovered { frames, .. } => assert_eq!(frames.len(), 4),
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        subscribe(&mut h, "a", 0, Some(5), None, 4).3,
        Resume::Reset { reason: ResetReason::Evicted, oldest: 7 }
    ));
    assert!(matches!(
        subscribe(&mut h, "a", 0, Some(10), Some("other"), 4).3,
        Resume::Reset { reason: ResetReason::Epoch, .. }
    ));
    assert!(matches!(subscribe(&mut h, "a", 0, Some(11), None, 4).3, Resume::Ahead));
    assert!(
        matches!(subscribe(&mut h, "a", 0, Some(10), None, 4).3, Resume::Recovered { ref frames, .. } if frames.is_empty())
    );
}

#[test]
fn replay_comes_in_batches_and_notices_eviction() {
    let mut h = homes(1);
    for _ in 0..2000 {
        publish(&mut h, "a", None, b"1", 5000, 0);
    }
    let Resume::Recovered { frames, until, .. } = subscribe(&mut h, "a", 0, Some(0), None, 5000).3 else { panic!() };
    assert_eq!((frames.len(), until), (REPLAY_BATCH, 2000));
    let next = h.replay_batch("a", REPLAY_BATCH as u64, until).unwrap();
    assert_eq!(next.len(), REPLAY_BATCH);
    let tail = h.replay_batch("a", 1990, until).unwrap();
    assert_eq!(tail.len(), 10);
    let mut small = homes(1);
    for _ in 0..20 {
        publish(&mut small, "b", None, b"1", 10, 0);
    }
    assert_eq!(small.replay_batch("b", 5, 20), Err(11));
}

#[test]
fn idle_channels_are_forgotten() {
    let mut h = homes(1);
    subscribe(&mut h, "only-sub", 0, None, None, 10);
    h.unsubscribe("only-sub", 0);
    assert!(h.get("only-sub").is_none());
    publish(&mut h, "published", None, b"1", 10, 1_000);
    subscribe(&mut h, "watched", 0, None, None, 10);
    publish(&mut h, "watched", None, b"1", 10, 1_000);
    assert_eq!(h.sweep(2_000, 5_000), 0);
    assert_eq!(h.sweep(10_000, 5_000), 1);
    assert!(h.get("published").is_none());
    assert!(h.get("watched").is_some());
}

#[test]
fn unsubscribed_then_published_keeps_the_epoch_and_replays_everything() {
    let mut h = homes(2);
    let (_, head, epoch, resume) = subscribe(&mut h, "a", 1, None, None, 10);
    assert_eq!((head, &*epoch, matches!(resume, Resume::Live)), (0, E, true));
    h.unsubscribe("a", 1);
    assert!(h.get("a").is_none(), "a never-published channel is forgotten with its last subscriber");
    for seq in 1..=5 {
        assert_eq!(publish(&mut h, "a", None, b"1", 10, 1_000).0.seq, seq);
    }
    assert_eq!(&*h.get("a").unwrap().epoch, E);
    match subscribe(&mut h, "a", 0, Some(0), Some(&epoch), 10) {
        (_, 5, e, Resume::Recovered { from: 0, frames, until: 5 }) if e == epoch => {
            assert_eq!(frames.iter().map(seq_of).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        }
        (_, head, e, r) => panic!("head {head}, epoch {e}: {r:?}"),
    }
}

#[test]
fn swept_then_republished_continues_numbering_under_the_same_epoch() {
    let mut h = homes(1);
    for _ in 0..3 {
        publish(&mut h, "a", None, b"1", 10, 1_000);
    }
    assert_eq!(h.sweep(10_000, 5_000), 1);
    assert!(h.get("a").is_none());
    // Back by a resume: the old head under the old epoch, nothing in history.
    match subscribe(&mut h, "a", 0, Some(1), Some(E), 10) {
        (_, 3, e, Resume::Reset { reason: ResetReason::Evicted, oldest: 4 }) if &*e == E => {}
        (_, head, e, r) => panic!("head {head}, epoch {e}: {r:?}"),
    }
    assert!(matches!(
        subscribe(&mut h, "a", 0, Some(3), Some(E), 10).3,
        Resume::Recovered { ref frames, until: 3, .. } if frames.is_empty()
    ));
    assert!(matches!(subscribe(&mut h, "a", 0, Some(4), Some(E), 10).3, Resume::Ahead));
    // Forgotten again at once (nothing published since): the head survives that too.
    for _ in 0..3 {
        h.unsubscribe("a", 0);
    }
    assert!(h.get("a").is_none());
    let (p, _) = publish(&mut h, "a", None, b"1", 10, 20_000);
    assert_eq!((p.seq, &*h.get("a").unwrap().epoch), (4, E));
    match subscribe(&mut h, "a", 0, Some(3), Some(E), 10).3 {
        Resume::Recovered { frames, until: 4, .. } => {
            assert_eq!(frames.iter().map(seq_of).collect::<Vec<_>>(), [4])
        }
        r => panic!("{r:?}"),
    }
    // Forgotten a second time: numbering still goes up, never back.
    h.unsubscribe("a", 0);
    assert_eq!(h.sweep(40_000, 5_000), 1);
    assert_eq!(publish(&mut h, "a", None, b"1", 10, 41_000).0.seq, 5);
    assert_eq!(h.numbering().tombstones(), 1);
}

#[test]
fn tombstone_overflow_rotates_the_epoch() {
    let mut h = homes_with(1, 2);
    subscribe(&mut h, "watched", 0, None, None, 10);
    publish(&mut h, "watched", None, b"1", 10, 0);
    for ch in ["a", "b"] {
        publish(&mut h, ch, None, b"1", 10, 0);
    }
    assert_eq!(h.sweep(10_000, 5_000), 2);
    assert_eq!(h.numbering().tombstones(), 2);
    publish(&mut h, "c", None, b"1", 10, 10_000);
    publish(&mut h, "c", None, b"1", 10, 10_000);
    assert_eq!(h.sweep(20_000, 5_000), 1);
    assert_eq!((h.numbering().rotations(), h.numbering().tombstones()), (1, 0));
    let rotated = h.numbering().epoch().clone();
    assert_ne!(&*rotated, E);
    // Channels created from now on start over under the new epoch ...
    for ch in ["a", "c", "new"] {
        assert_eq!(publish(&mut h, ch, None, b"1", 10, 20_000).0.seq, 1, "{ch}");
        assert_eq!(h.get(ch).unwrap().epoch, rotated);
    }
    // ... so a position under the old one is a reset, never a silent gap.
    assert!(matches!(
        subscribe(&mut h, "c", 0, Some(2), Some(E), 10).3,
        Resume::Reset { reason: ResetReason::Epoch, oldest: 1 }
    ));
    // A channel that stayed in the table keeps its epoch and its numbering.
    assert_eq!(&*h.get("watched").unwrap().epoch, E);
    assert_eq!(publish(&mut h, "watched", None, b"1", 10, 20_000).0.seq, 2);
}

#[test]
fn max_channels_refuses_new_channels_only_and_frees_slots_when_channels_go() {
    // Two cores' tables sharing one cap of 3, as the cores of one process do.
    let cap = Arc::new(ChannelCap::new(3));
    let table = |cap: &Arc<ChannelCap>| {
        Homes::new(1, Dedup::new(1000, 100), Numbering::new(E.into(), TOMBSTONES_PER_CORE), cap.clone())
    };
    let (mut a, mut b) = (table(&cap), table(&cap));
    publish(&mut a, "p1", None, b"1", 10, 0);
    subscribe(&mut b, "s1", 0, None, None, 10);
    publish(&mut b, "p2", None, b"1", 10, 0);
    assert_eq!(cap.count(), 3);
    assert!(a.publish("new", Some("x"), b"1", 10, 0).is_none(), "a publish that would create a 4th");
    assert!(a.subscribe("new", 0, None, None, 10).is_none(), "a sub that would create a 4th");
    assert!(a.get("new").is_none() && a.dedup.is_empty(), "a refusal leaves nothing behind");
    // Existing channels go on, on either table.
    assert_eq!(publish(&mut a, "p1", None, b"1", 10, 0).0.seq, 2);
    assert_eq!(publish(&mut b, "s1", None, b"1", 10, 0).0.seq, 1);
    subscribe(&mut b, "p2", 0, None, None, 10);
    // A never-published channel frees its slot with its last subscriber ...
    let mut c = table(&cap);
    b.unsubscribe("p2", 0);
    assert_eq!(cap.count(), 3, "p2 was published to: it stays until swept");
    assert_eq!(a.sweep(10_000, 5_000), 1, "p1, idle past the window, is forgotten");
    assert_eq!(cap.count(), 2);
    subscribe(&mut c, "fresh", 0, None, None, 10);
    assert!(c.subscribe("other", 0, None, None, 10).is_none());
    c.unsubscribe("fresh", 0);
    assert_eq!(cap.count(), 2, "... at once");
    assert_eq!(publish(&mut c, "other", None, b"1", 10, 0).0.seq, 1);
}

#[test]
fn home_is_deterministic_and_spread() {
    let homes: std::collections::HashSet<usize> = (0..100).map(|i| home_of(&format!("ch{i}"), 4)).collect();
    assert_eq!(homes.len(), 4);
    assert_eq!(home_of("news", 2), home_of("news", 2));
}

#[test]
fn history_pages_are_the_ring_a_resume_replays() {
    let mut h = homes(1);
    let page = h.history("quiet", None, 10);
    assert_eq!((page.head, page.oldest, page.messages.len(), &*page.epoch), (0, 1, 0, E), "unknown channel");
    for i in 1..=5u64 {
        publish(&mut h, "c", None, format!("{{\"n\":{i}}}").as_bytes(), 3, 0);
    }
    // History keeps 3: seqs 3, 4, 5.
    let seqs = |p: &HistoryPage| p.messages.iter().map(|(s, _)| *s).collect::<Vec<_>>();
    let newest = h.history("c", None, 2);
    assert_eq!((newest.head, newest.oldest), (5, 3));
    assert_eq!(seqs(&newest), [4, 5], "without from: the newest `limit`");
    assert_eq!(&newest.messages[1].1[..], br#"{"n":5}"#, "data as published");
    assert_eq!(seqs(&h.history("c", Some(0), 10)), [3, 4, 5], "from before the oldest: what is kept");
    assert_eq!(seqs(&h.history("c", Some(3), 1)), [4]);
    assert!(h.history("c", Some(5), 10).messages.is_empty(), "from the head: nothing yet");
    assert!(h.history("c", Some(9), 10).messages.is_empty());
    // Every frame's data, header of any size.
    let (big, _) = publish(&mut h, "c", None, format!("\"{}\"", "x".repeat(70_000)).as_bytes(), 3, 0);
    assert_eq!(h.history("c", Some(5), 1).messages[0].1.len(), 70_002);
    assert_eq!(msg_data(&big.frame.unwrap()).len(), 70_002);
    let mid = msg_frame("c", 7, format!("[{}]", "1,".repeat(100).trim_end_matches(',')).as_bytes());
    assert_eq!(msg_data(&mid).len(), 201);
}
