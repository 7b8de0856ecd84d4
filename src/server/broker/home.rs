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
use super::{Fence, HistoryPage, Resume};
use crate::protocol::ResetReason;

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
        self.frames(after, until, REPLAY_BATCH).cloned().collect()
    }

    /// The history frames with seqs `after+1 ..= until`, at most `max`; `after + 1 >=
    /// oldest()`.
    fn frames(&self, after: u64, until: u64, max: usize) -> impl Iterator<Item = &Bytes> {
        let skip = (after + 1 - self.oldest()) as usize;
        let n = (until.saturating_sub(after) as usize).min(max);
        self.history.iter().skip(skip).take(n)
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

    /// A page of `ch`'s history, read from the ring a resume replays (docs/api.md): the
    /// messages after `from` that are still kept (the newest `limit` when `from` is `None`),
    /// at most `limit`. A channel not in the table (never used, or forgotten) has no history;
    /// its head and epoch are those it would be created with.
    pub fn history(&self, ch: &str, from: Option<u64>, limit: usize) -> HistoryPage {
        let Some(c) = self.chans.get(ch) else {
            let (epoch, head) = self.numbering.start(ch);
            return HistoryPage { epoch, head, oldest: head + 1, messages: Vec::new() };
        };
        let (oldest, head) = (c.oldest(), c.head);
        let after = match from {
            Some(f) => f.max(oldest - 1),
            None => head.saturating_sub(limit as u64).max(oldest - 1),
        };
        let until = head.min(after.saturating_add(limit as u64));
        let messages = if after >= head {
            Vec::new()
        } else {
            super::within_page_bytes(c.frames(after, until, limit).zip(after + 1..).map(|(f, seq)| (seq, msg_data(f))))
        };
        HistoryPage { epoch: c.epoch.clone(), head, oldest, messages }
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

    /// Gives back the spare capacity of the channel map when it is mostly spare
    /// (`server::reclaim`); returns whether it shrank.
    pub fn shrink_if_spare(&mut self) -> bool {
        let spare = crate::server::reclaim::spare(self.chans.len(), self.chans.capacity());
        if spare {
            self.chans.shrink_to_fit();
        }
        spare
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

/// The `data` of a frame built by [`msg_frame`], shared with it (no copy): the payload after
/// the frame header (RFC 6455 §5.2: 2, 4 or 10 bytes for an unmasked frame) is
/// `{"op":"msg","ch":CH,"seq":N,"data":DATA}`, and a valid channel name holds no `"`, so
/// the first `,"data":` starts DATA, which runs to the closing brace.
pub fn msg_data(frame: &Bytes) -> Bytes {
    let header = match frame.get(1).map(|b| b & 0x7f) {
        Some(126) => 4,
        Some(127) => 10,
        _ => 2,
    };
    let payload = frame.get(header..frame.len().saturating_sub(1)).unwrap_or_default();
    const KEY: &[u8] = b",\"data\":";
    match payload.windows(KEY.len()).position(|w| w == KEY) {
        Some(at) => frame.slice(header + at + KEY.len()..frame.len() - 1),
        None => Bytes::from_static(b"null"),
    }
}

#[cfg(test)]
mod tests;
