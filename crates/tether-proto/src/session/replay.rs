//! Resume replay, paced by the subscriber's queue: history comes from the channel's home in
//! batches and moves into the outbound queue only as fast as the socket drains it, so a long
//! replay neither trips the slow-subscriber policy nor copies the history into one queue.
//!
//! Live frames that arrive meanwhile wait behind the replay. They all have seqs above the
//! replay's end, because the broker orders its `Subscribed` answer before the deliveries that
//! follow it, so the seam has no gap and no duplicate.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use super::{Ctx, Frame, Overflow, Session};
use crate::protocol::{self, ResetReason};
use crate::ws::codec;

/// One channel being replayed to one connection.
#[derive(Debug)]
pub struct Replay {
    /// Local channel index.
    pub chan: u32,
    /// Channel name.
    pub ch: Arc<str>,
    /// Channel epoch (for a `reset` if history is evicted mid-replay).
    pub epoch: Arc<str>,
    /// History frames fetched and not yet queued.
    backlog: VecDeque<Bytes>,
    /// Seq of the last history frame fetched.
    fetched: u64,
    /// Last seq to replay from history (the head when the subscription began).
    until: u64,
    /// A fetch is on its way to the home.
    fetching: bool,
    /// Live frames (seq > `until`) that arrived during the replay, in order.
    live: VecDeque<Frame>,
    /// Bytes in `live`.
    live_bytes: usize,
}

/// A request for the next history batch of `ch`: seqs `after+1 ..= until` (the home answers
/// with at most one batch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// Channel name.
    pub ch: Arc<str>,
    /// Last seq already fetched.
    pub after: u64,
    /// Last seq of the replay.
    pub until: u64,
}

/// What `Session::hold_for_replay` did with a live frame.
pub enum Held {
    /// Held behind the replay, to follow it in order.
    Queued,
    /// The held frames are full under the `disconnect` policy: close with 1013.
    Overflow,
    /// No replay of this channel is in progress: queue normally.
    NotReplaying,
}

impl Session {
    /// Whether a replay is in progress.
    pub fn replaying(&self) -> bool {
        self.replays.is_some()
    }

    /// Holds a live frame of `chan` behind a replay of it in progress. The held frames are
    /// bounded like the queue (`queue_max_bytes`, `queue_max_messages`), under the channel's
    /// overflow policy.
    pub(super) fn hold_for_replay(&mut self, ctx: &Ctx, chan: u32, frame: &Frame, policy: Option<Overflow>) -> Held {
        let Some(r) = self.replays.as_mut().and_then(|rs| rs.iter_mut().find(|r| r.chan == chan)) else {
            return Held::NotReplaying;
        };
        let (max_msgs, max_bytes) = (ctx.cfg.queue_max_messages, ctx.cfg.queue_max_bytes);
        let full = |r: &Replay| r.live.len() >= max_msgs || r.live_bytes + frame.len() > max_bytes;
        if full(r) {
            // The held frames are all of this channel: drop the oldest until the new one fits
            // (`drop-oldest`), or keep none but the new one (`conflate`).
            match policy.unwrap_or(Overflow::Disconnect) {
                Overflow::Disconnect => return Held::Overflow,
                Overflow::DropOldest => {
                    while full(r) {
                        let Some(f) = r.live.pop_front() else { break };
                        r.live_bytes -= f.len();
                    }
                }
                Overflow::Conflate => {
                    r.live.clear();
                    r.live_bytes = 0;
                }
            }
        }
        r.live_bytes += frame.len();
        r.live.push_back(frame.clone());
        Held::Queued
    }

    /// Begins replaying `ch` (local channel `chan`): `frames` are seqs `from+1 ..`, up to
    /// `until`. Returns a fetch for the next batch when the first one does not reach `until`.
    #[allow(clippy::too_many_arguments)]
    pub fn start_replay(
        &mut self,
        ctx: &Ctx,
        chan: u32,
        ch: Arc<str>,
        epoch: Arc<str>,
        from: u64,
        frames: Vec<Bytes>,
        until: u64,
    ) -> Option<Fetch> {
        let fetched = from + frames.len() as u64;
        let r = Replay {
            chan,
            ch,
            epoch,
            backlog: frames.into(),
            fetched,
            until,
            fetching: false,
            live: VecDeque::new(),
            live_bytes: 0,
        };
        self.replays.get_or_insert_with(Default::default).push(r);
        self.pump_replay(ctx).1
    }

    /// Moves replay frames into the outbound queue while it has room; asks for the next batch
    /// when the backlog runs out. Returns (whether anything was queued, the fetch to send).
    ///
    /// The replay fills the queue only halfway: the other half is room for pings, acks and
    /// replies, which would otherwise find the queue full and close the connection.
    pub fn pump_replay(&mut self, ctx: &Ctx) -> (bool, Option<Fetch>) {
        let (max_bytes, max_msgs) = ((ctx.cfg.queue_max_bytes / 2).max(1), (ctx.cfg.queue_max_messages / 2).max(1));
        if !self.state.can_write() {
            return (false, None);
        }
        let sse = self.is_sse();
        let Some(rs) = self.replays.as_mut() else { return (false, None) };
        let q = &mut self.queue;
        let mut queued = false;
        let mut fetch = None;
        while let Some(r) = rs.first_mut() {
            while let Some(f) = r.backlog.front() {
                if !q.has_room(f.len(), max_msgs, max_bytes) {
                    break;
                }
                let f = r.backlog.pop_front().expect("front checked");
                // History is stored as WebSocket frames: an SSE stream takes each as its
                // event, converted as it is replayed.
                if !sse {
                    q.push(f, r.chan);
                } else if let Some(ev) = crate::sse::msg_from_frame(&f, &r.epoch) {
                    q.push(ev, r.chan);
                }
                queued = true;
            }
            if !r.backlog.is_empty() {
                break;
            }
            if r.fetched < r.until {
                if !r.fetching {
                    r.fetching = true;
                    fetch = Some(Fetch { ch: r.ch.clone(), after: r.fetched, until: r.until });
                }
                break;
            }
            while let Some(f) = r.live.front() {
                if !q.has_room(f.len(), max_msgs, max_bytes) {
                    break;
                }
                let f = r.live.pop_front().expect("front checked");
                r.live_bytes -= f.len();
                q.push(f, r.chan);
                queued = true;
            }
            if !r.live.is_empty() {
                break;
            }
            rs.remove(0);
        }
        if rs.is_empty() {
            self.replays = None;
        }
        (queued, fetch)
    }

    /// The home sent the next batch of `ch` (or found that part of history evicted:
    /// `evicted = Some(oldest)`, answered with a `reset` and a live continuation). Returns the
    /// next fetch, if any.
    pub fn replay_batch(&mut self, ctx: &Ctx, ch: &str, frames: Vec<Bytes>, evicted: Option<u64>) -> Option<Fetch> {
        // A batch answering a fetch sent before our close (or the peer's) must not put a data
        // frame (the `reset`) behind the close frame (RFC 6455 §5.5.1).
        if !self.state.can_write() {
            return None;
        }
        let r = self.replays.as_mut()?.iter_mut().find(|r| &*r.ch == ch)?;
        r.fetching = false;
        match evicted {
            Some(oldest) => {
                // The rest of the resume point is gone: say so, then continue live after
                // `until`, which is exactly where the held live frames begin.
                r.backlog.clear();
                r.fetched = r.until;
                let json = protocol::reset_json(ch, r.until, &r.epoch, ResetReason::Evicted, oldest);
                let frame = if self.flags.has(super::Flags::SSE) {
                    crate::sse::reset_event(&json)
                } else {
                    codec::text_frame(&json)
                };
                self.queue.push(frame, super::NO_CHAN);
            }
            None => {
                r.fetched += frames.len() as u64;
                if frames.is_empty() {
                    r.fetched = r.until;
                }
                r.backlog.extend(frames);
            }
        }
        self.pump_replay(ctx).1
    }

    /// Stops replaying local channel `chan` (unsubscribed).
    pub fn cancel_replay(&mut self, chan: u32) {
        if let Some(rs) = self.replays.as_mut() {
            rs.retain(|r| r.chan != chan);
            if rs.is_empty() {
                self.replays = None;
            }
        }
    }
}
