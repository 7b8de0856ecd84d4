//! Resume replay, paced by the subscriber's queue: history is fetched from the home core in
//! batches and moved into the outbound queue only as fast as the socket drains it, so a long
//! replay neither trips the slow-subscriber policy nor copies the history into one queue.
//! Live messages that arrive meanwhile wait behind the replay (they all have seqs above the
//! replay's end, because the home core orders its `Subscribed` reply before later
//! deliveries), so the seam has no gap and no duplicate.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use super::bus::{ConnRef, CoreMsg};
use super::conn_state::*;
use super::core::CoreState;
use crate::config::Overflow;
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
    pub backlog: VecDeque<Bytes>,
    /// Seq of the last history frame fetched.
    pub fetched: u64,
    /// Last seq to replay from history (the head when the subscription began).
    pub until: u64,
    /// A fetch is on its way to the home core.
    pub fetching: bool,
    /// Live frames (seq > `until`) that arrived during the replay, in order.
    pub live: VecDeque<Bytes>,
    /// Bytes in `live`.
    pub live_bytes: usize,
}

/// What [`hold_for_replay`] did with a live frame.
pub enum Held {
    /// Held behind the replay, to follow it in order.
    Queued,
    /// The held frames are full under the `disconnect` policy: close with 1013.
    Overflow,
}

/// Holds a live frame of `chan` behind a replay of it in progress on `c`; `None` if there is
/// none (the caller queues normally). The held frames are bounded like the queue
/// (`max_bytes`, `max_msgs`), under the channel's overflow policy.
pub fn hold_for_replay(c: &mut Conn, chan: u32, frame: &Bytes, policy: Overflow, max_bytes: usize, max_msgs: usize) -> Option<Held> {
    let r = c.replays.as_mut()?.iter_mut().find(|r| r.chan == chan)?;
    if r.live.len() >= max_msgs || r.live_bytes + frame.len() > max_bytes {
        let dropped = match policy {
            Overflow::Disconnect => return Some(Held::Overflow),
            Overflow::DropOldest => r.live.pop_front(),
            Overflow::Conflate => r.live.pop_back(),
        };
        if let Some(f) = dropped {
            r.live_bytes -= f.len();
        }
    }
    r.live_bytes += frame.len();
    r.live.push_back(frame.clone());
    Some(Held::Queued)
}

impl CoreState {
    /// Begins replaying `ch` to `id`: `frames` are seqs `from+1 ..`, up to `until`.
    pub fn start_replay(&mut self, id: ConnId, chan: u32, ch: Arc<str>, epoch: Arc<str>, from: u64, frames: Vec<Bytes>, until: u64) {
        let Some(c) = self.conn(id) else { return };
        let fetched = from + frames.len() as u64;
        let r = Replay { chan, ch, epoch, backlog: frames.into(), fetched, until, fetching: false, live: VecDeque::new(), live_bytes: 0 };
        c.replays.get_or_insert_with(Default::default).push(r);
        self.pump_replay(id);
    }

    /// Moves replay frames into the outbound queue while it has room; asks the home core for
    /// the next batch when the backlog runs out. Returns whether anything was queued.
    pub fn pump_replay(&mut self, id: ConnId) -> bool {
        let limits = &self.shared.config.limits;
        // Replay fills the queue only halfway: the other half is room for pings, acks and
        // replies, which would otherwise find the queue full and close the connection.
        let (max_bytes, max_msgs) = ((limits.queue_max_bytes / 2).max(1), (limits.queue_max_messages / 2).max(1));
        let me = self.me;
        let mut fetch = None;
        let mut queued = false;
        {
            let Some(c) = self.conns.get_mut(id.key as usize).filter(|c| c.gen == id.gen) else { return false };
            if !c.phase.can_write() {
                return false;
            }
            let Some(rs) = c.replays.as_mut() else { return false };
            // An empty queue always takes one frame, however large.
            let fits = |out: usize, bytes: usize, len: usize| out == 0 || (out < max_msgs && bytes + len <= max_bytes);
            while let Some(r) = rs.first_mut() {
                while let Some(f) = r.backlog.front() {
                    if !fits(c.out.len(), c.out_bytes, f.len()) {
                        break;
                    }
                    let f = r.backlog.pop_front().expect("front checked");
                    c.out_bytes += f.len();
                    c.out.push_back(Out { frame: f, chan: r.chan });
                    queued = true;
                }
                if !r.backlog.is_empty() {
                    break;
                }
                if r.fetched < r.until {
                    if !r.fetching {
                        r.fetching = true;
                        fetch = Some((r.ch.clone(), r.fetched, r.until));
                    }
                    break;
                }
                while let Some(f) = r.live.front() {
                    if !fits(c.out.len(), c.out_bytes, f.len()) {
                        break;
                    }
                    let f = r.live.pop_front().expect("front checked");
                    r.live_bytes -= f.len();
                    c.out_bytes += f.len();
                    c.out.push_back(Out { frame: f, chan: r.chan });
                    queued = true;
                }
                if !r.live.is_empty() {
                    break;
                }
                rs.remove(0);
            }
            if rs.is_empty() {
                c.replays = None;
            }
            if queued && c.flags & DIRTY == 0 {
                c.flags |= DIRTY;
                self.dirty.push(id);
            }
        }
        if let Some((ch, after, until)) = fetch {
            let home = self.home(&ch);
            self.route(home, CoreMsg::ReplayFetch { ch, conn: ConnRef { core: me as u16, id }, after, until });
        }
        queued
    }

    /// The home core sent the next batch (or found that part of history evicted).
    pub fn replay_batch(&mut self, id: ConnId, ch: &str, frames: Vec<Bytes>, evicted: Option<u64>) {
        let Some(c) = self.conn(id) else { return };
        let Some(r) = c.replays.as_mut().and_then(|rs| rs.iter_mut().find(|r| &*r.ch == ch)) else { return };
        r.fetching = false;
        let reset = match evicted {
            Some(oldest) => {
                // The rest of the resume point is gone: say so, then continue live after
                // `until`, which is exactly where the held live frames begin.
                r.backlog.clear();
                r.fetched = r.until;
                Some(protocol::reset_json(ch, r.until, &r.epoch, ResetReason::Evicted, oldest))
            }
            None => {
                r.fetched += frames.len() as u64;
                if frames.is_empty() {
                    r.fetched = r.until;
                }
                r.backlog.extend(frames);
                None
            }
        };
        if let Some(json) = reset {
            c.push(codec::encode_frame(0x1, &json), NO_CHAN);
        }
        self.pump_replay(id);
        self.flush(id);
    }
}
