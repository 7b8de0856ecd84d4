//! The memory broker's store of the channels whose home is this core: sequence numbers,
//! epoch, history ring, publish dedup and which cores have subscribers. Sans-IO: the memory
//! broker feeds it and routes what it returns. Which epoch a channel gets and where its
//! numbering starts when it is created again is [`super::epoch`]'s.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use bytes::Bytes;

use super::cap::ChannelCap;
use super::epoch::Numbering;
use crate::protocol::ResetReason;
use crate::server::bus::{Fence, Resume};

/// Home core of a channel: FNV-1a of its name modulo the core count. Deterministic, so every
/// core computes the same home without asking.
pub fn home_of(ch: &str, cores: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in ch.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % cores as u64) as usize
}

/// History frames handed out per replay batch: a resume streams history in batches as the
/// subscriber drains, never the whole history into one queue.
pub const REPLAY_BATCH: usize = 512;

/// Feeds whose fencing tokens one channel keeps at most (memory broker): a channel is the
/// target of one feed, or a few during a migration; a fenced publish of a further feed is
/// refused with `limit`.
pub const MAX_FEEDS_PER_CHANNEL: usize = 16;

/// How a fenced publish's token compares with what its channel's home has seen for its feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceCheck {
    /// The token is the highest seen for the feed (or equal to it): the publish may go on,
    /// and the token is now the feed's highest.
    Accepted,
    /// A higher token was seen for the feed: the publish must be refused (`fenced`).
    Fenced {
        /// The highest token seen for the feed.
        highest: u64,
    },
    /// The channel already keeps [`MAX_FEEDS_PER_CHANNEL`] other feeds: refused (`limit`).
    TooManyFeeds,
}

/// One channel at its home.
pub struct HomeChannel {
    /// Channel name, shared with every message that names it.
    pub name: Arc<str>,
    /// Opaque epoch string, fixed for the channel's life in the table (see [`super::epoch`]).
    pub epoch: Arc<str>,
    /// Seq of the last published message (0 before any, or its tombstone's head).
    pub head: u64,
    /// The head it was created with: while `head` is still this, nothing was published in
    /// this incarnation and forgetting it loses nothing.
    base: u64,
    /// The last `history_cap` frames, oldest first; the front has seq `head - len + 1`.
    history: VecDeque<Bytes>,
    history_cap: usize,
    /// Subscriptions per core (index = core).
    interest: Vec<u32>,
    /// When the last message was published (ms on the core's clock).
    last_publish_ms: u64,
    /// The highest fencing token seen per feed publishing here (feed id, token); at most
    /// [`MAX_FEEDS_PER_CHANNEL`] entries, empty (no allocation) for a channel no feed fences.
    fences: Vec<(Box<str>, u64)>,
}

impl HomeChannel {
    /// Oldest seq still in history (head + 1 when history is empty).
    pub fn oldest(&self) -> u64 {
        self.head + 1 - self.history.len() as u64
    }

    /// Up to [`REPLAY_BATCH`] history frames with seqs `after+1 ..= until`; the caller has
    /// checked that `after + 1 >= oldest()`.
    pub fn batch(&self, after: u64, until: u64) -> Vec<Bytes> {
        let skip = (after + 1 - self.oldest()) as usize;
        let n = (until.saturating_sub(after) as usize).min(REPLAY_BATCH);
        self.history.iter().skip(skip).take(n).cloned().collect()
    }

    /// Cores with at least one subscription.
    pub fn interested(&self) -> impl Iterator<Item = usize> + '_ {
        self.interest.iter().enumerate().filter(|(_, n)| **n > 0).map(|(c, _)| c)
    }
}

/// Publish ids remembered for `dedup.window_ms`, bounded to `max_entries` (the oldest is
/// forgotten early when full). Keys are a 128-bit hash of (channel, id). Each id costs about
/// 103 bytes (a 32-byte table slot plus control byte at the table's power-of-two size, and a
/// 32-byte expiry entry; measured by `tests/dedup_memory_per_id.rs`, see
/// `config::DEDUP_BYTES_PER_ID`), so the default 1,000,000 entries cost about 103 MB per
/// process.
pub struct Dedup {
    seen: HashMap<u128, u64>,
    expiry: VecDeque<(u64, u128)>,
    window_ms: u64,
    max_entries: usize,
    k1: std::collections::hash_map::RandomState,
    k2: std::collections::hash_map::RandomState,
}

impl Dedup {
    /// A dedup window of `window_ms` milliseconds holding at most `max_entries` ids.
    pub fn new(window_ms: u64, max_entries: usize) -> Dedup {
        Dedup {
            seen: HashMap::new(),
            expiry: VecDeque::new(),
            window_ms,
            max_entries: max_entries.max(1),
            k1: Default::default(),
            k2: Default::default(),
        }
    }

    fn key(&self, ch: &str, id: &str) -> u128 {
        let h = |s: &std::collections::hash_map::RandomState| {
            let mut h = s.build_hasher();
            ch.hash(&mut h);
            id.hash(&mut h);
            h.finish()
        };
        ((h(&self.k1) as u128) << 64) | h(&self.k2) as u128
    }

    fn expire(&mut self, now_ms: u64) {
        while let Some(&(t, k)) = self.expiry.front() {
            if t > now_ms && self.seen.len() < self.max_entries {
                break;
            }
            self.expiry.pop_front();
            self.seen.remove(&k);
        }
    }

    /// The seq stored for (ch, id) within the window.
    pub fn get(&mut self, ch: &str, id: &str, now_ms: u64) -> Option<u64> {
        self.expire(now_ms);
        self.seen.get(&self.key(ch, id)).copied()
    }

    /// Remembers (ch, id) → seq until `now_ms + window_ms`.
    pub fn insert(&mut self, ch: &str, id: &str, seq: u64, now_ms: u64) {
        let k = self.key(ch, id);
        self.seen.insert(k, seq);
        self.expiry.push_back((now_ms + self.window_ms, k));
        self.expire(now_ms);
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// What a publish at home produced.
pub struct Published {
    /// The message's seq (the original one for a duplicate id).
    pub seq: u64,
    /// `Some(frame)` when newly published: the encoded `msg` frame to fan out.
    pub frame: Option<Bytes>,
}

/// All channels homed on one core.
pub struct Homes {
    cores: usize,
    chans: HashMap<Arc<str>, HomeChannel>,
    /// The process-wide channel count (`limits.max_channels`): a slot per channel in `chans`.
    cap: Arc<ChannelCap>,
    /// Publish dedup for the channels homed here.
    pub dedup: Dedup,
    /// The epoch new channels get and the tombstones of forgotten ones.
    numbering: Numbering,
}

impl Homes {
    /// Empty home table for a process of `cores` cores, creating channels under `numbering`
    /// as long as `cap` (shared by every core's table) has room.
    pub fn new(cores: usize, dedup: Dedup, numbering: Numbering, cap: Arc<ChannelCap>) -> Homes {
        Homes { cores, chans: HashMap::new(), cap, dedup, numbering }
    }

    /// Channel `ch`, created when absent; `None` when creating it would pass
    /// `limits.max_channels`.
    fn channel(&mut self, ch: &str, history_cap: usize) -> Option<&mut HomeChannel> {
        if !self.chans.contains_key(ch) {
            if !self.cap.try_acquire() {
                return None;
            }
            let name: Arc<str> = ch.into();
            let (epoch, head) = self.numbering.start(ch);
            self.chans.insert(
                name.clone(),
                HomeChannel {
                    name,
                    epoch,
                    head,
                    base: head,
                    history: VecDeque::new(),
                    history_cap,
                    interest: vec![0; self.cores],
                    last_publish_ms: 0,
                    fences: Vec::new(),
                },
            );
        }
        self.chans.get_mut(ch)
    }

    /// Looks a channel up without creating it.
    pub fn get(&self, ch: &str) -> Option<&HomeChannel> {
        self.chans.get(ch)
    }

    /// Checks the fence of a publish to `ch` (creating the channel when absent) and, when
    /// accepted, raises the highest token kept for `fence.feed` to `fence.token`. The memory
    /// broker calls it and then [`Homes::publish`] in one step on the home core, so nothing
    /// comes between the check and the publish. `None` when `ch` does not exist and
    /// `limits.max_channels` channels do (nothing is kept).
    ///
    /// The tokens live as long as the channel stays in the table: a channel forgotten by
    /// [`Homes::sweep`] (idle, no subscriber) forgets them too (docs/feeds.md "Fencing").
    pub fn fence(&mut self, ch: &str, fence: &Fence, history_cap: usize) -> Option<FenceCheck> {
        let c = self.channel(ch, history_cap)?;
        let full = c.fences.len() >= MAX_FEEDS_PER_CHANNEL;
        let check = match c.fences.iter_mut().find(|(f, _)| **f == *fence.feed) {
            Some((_, highest)) if *highest > fence.token => FenceCheck::Fenced { highest: *highest },
            Some((_, highest)) => {
                *highest = fence.token;
                FenceCheck::Accepted
            }
            None if full => FenceCheck::TooManyFeeds,
            None => {
                c.fences.push((fence.feed.clone(), fence.token));
                FenceCheck::Accepted
            }
        };
        Some(check)
    }

    /// Publishes `data` (raw JSON) on `ch`: assigns the next seq, encodes the frame once,
    /// keeps it in history. A publish `id` seen within the dedup window returns its original
    /// seq and no frame. `None` when `ch` does not exist and `limits.max_channels` channels
    /// do (nothing is published).
    pub fn publish(
        &mut self,
        ch: &str,
        id: Option<&str>,
        data: &[u8],
        history_cap: usize,
        now_ms: u64,
    ) -> Option<(Published, Arc<str>)> {
        if let Some(id) = id {
            if let Some(seq) = self.dedup.get(ch, id, now_ms) {
                let name = self.channel(ch, history_cap)?.name.clone();
                return Some((Published { seq, frame: None }, name));
            }
        }
        let c = self.channel(ch, history_cap)?;
        c.last_publish_ms = now_ms;
        c.head += 1;
        let seq = c.head;
        let frame = msg_frame(&c.name, seq, data);
        if c.history_cap > 0 {
            if c.history.len() == c.history_cap {
                c.history.pop_front();
            }
            c.history.push_back(frame.clone());
        }
        let name = c.name.clone();
        if let Some(id) = id {
            self.dedup.insert(ch, id, seq, now_ms);
        }
        Some((Published { seq, frame: Some(frame) }, name))
    }

    /// Registers one subscription of core `core` to `ch` and resolves its resume point.
    /// Returns (name, head, epoch, resume); `None` (nothing registered) when `ch` does not
    /// exist and `limits.max_channels` channels do.
    pub fn subscribe(
        &mut self,
        ch: &str,
        core: usize,
        from: Option<u64>,
        epoch: Option<&str>,
        history_cap: usize,
    ) -> Option<(Arc<str>, u64, Arc<str>, Resume)> {
        let c = self.channel(ch, history_cap)?;
        c.interest[core] += 1;
        let resume = match from {
            None => Resume::Live,
            Some(_) if epoch.is_some_and(|e| e != &*c.epoch) => {
                Resume::Reset { reason: ResetReason::Epoch, oldest: c.oldest() }
            }
            Some(f) if f > c.head => Resume::Ahead,
            Some(f) if f + 1 < c.oldest() => Resume::Reset { reason: ResetReason::Evicted, oldest: c.oldest() },
            Some(f) => Resume::Recovered { from: f, frames: c.batch(f, c.head), until: c.head },
        };
        Some((c.name.clone(), c.head, c.epoch.clone(), resume))
    }

    /// The next replay batch for a resuming subscriber: frames after `after`, or `Err(oldest)`
    /// when they were evicted meanwhile.
    pub fn replay_batch(&self, ch: &str, after: u64, until: u64) -> Result<Vec<Bytes>, u64> {
        let Some(c) = self.chans.get(ch) else { return Err(1) };
        if after + 1 < c.oldest() {
            return Err(c.oldest());
        }
        Ok(c.batch(after, until))
    }

    /// Drops one subscription of core `core` to `ch`. A channel that nothing was published
    /// to since it was created and that has no subscriber left is forgotten at once: created
    /// again, it gets the same epoch (unless this core rotated meanwhile) and the same head,
    /// so a subscriber's position in it stays valid.
    pub fn unsubscribe(&mut self, ch: &str, core: usize) {
        if let Some(c) = self.chans.get_mut(ch) {
            c.interest[core] = c.interest[core].saturating_sub(1);
            if c.head == c.base && c.interest.iter().all(|n| *n == 0) {
                if let Some(c) = self.chans.remove(ch) {
                    self.numbering.forget(&c.name, &c.epoch, c.head);
                    self.cap.release();
                }
            }
        }
    }

    /// Forgets channels without subscribers whose last publish is older than `idle_ms`.
    /// Their history goes; their numbering does not: each leaves a tombstone (its head), so
    /// when it is created again its seqs continue under the same epoch, and a resume from
    /// inside the forgotten range gets `reset` (`evicted`), never a gap or a reused seq. When
    /// the tombstones are full the core rotates its epoch instead ([`super::epoch`]). Keeps
    /// memory bounded when clients use many short-lived channel names, and gives their
    /// `limits.max_channels` slots back. Returns how many were dropped.
    pub fn sweep(&mut self, now_ms: u64, idle_ms: u64) -> usize {
        let before = self.chans.len();
        let (numbering, cap) = (&mut self.numbering, &self.cap);
        self.chans.retain(|_, c| {
            let keep = c.interest.iter().any(|n| *n > 0) || now_ms.saturating_sub(c.last_publish_ms) < idle_ms;
            if !keep {
                numbering.forget(&c.name, &c.epoch, c.head);
                cap.release();
            }
            keep
        });
        before - self.chans.len()
    }

    /// Whether any channel is homed here (something for [`Homes::sweep`] to look at).
    pub fn has_channels(&self) -> bool {
        !self.chans.is_empty()
    }

    /// The epoch and tombstones of this core.
    pub fn numbering(&self) -> &Numbering {
        &self.numbering
    }
}

/// The `msg` frame of one message: a complete unmasked text frame, built once per publish.
pub fn msg_frame(ch: &str, seq: u64, data: &[u8]) -> Bytes {
    crate::protocol::msg_frame(ch, seq, std::str::from_utf8(data).unwrap_or("null"))
}

#[cfg(test)]
mod tests {
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
        let Resume::Recovered { frames, until, .. } = subscribe(&mut h, "a", 0, Some(0), None, 5000).3 else {
            panic!()
        };
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
}
