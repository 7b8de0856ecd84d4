//! A connection's outbound queue: shared frames (each encoded once for every subscriber), the
//! written part of the front one, and the overflow policies that keep it bounded
//! (docs/operations.md, "Slow subscribers").

use std::collections::VecDeque;
use std::io::IoSlice;
use std::ops::Deref;
use std::rc::Rc;

use bytes::Bytes;

use super::Ctx;
use crate::config::Overflow;

/// Frames handed to one `sendmsg` at most.
pub const MAX_IOV: usize = 64;

/// A complete encoded frame as queued: one thin pointer, so a queue entry ([`Out`]) is 16 bytes.
///
/// A fan-out frame is made once per core ([`Frame::local`]) and shared by that core's
/// subscribers with a reference count that is not atomic. Queuing it to a subscriber is then a
/// plain increment and an 8-byte store; with [`Bytes`] it is a locked increment, which waits for
/// every store before it, those into thousands of other subscribers' queues (measured with
/// `perf record` at 1,000 msg/s to 10,000 subscribers, bench-peers: a quarter of the server's
/// time at 7.5–7.8 M deliveries/s on 2 cores, whether the `Bytes` was shared by both cores or
/// copied per core), and a 32-byte store. Replies, history and HTTP answers are
/// wrapped as they come ([`From<Bytes>`]).
#[derive(Debug, Clone)]
pub struct Frame(Rc<Body>);

#[derive(Debug)]
enum Body {
    /// A copy owned by this core.
    Local(Box<[u8]>),
    /// Owned, static, or shared across cores (history).
    Shared(Bytes),
}

impl Frame {
    /// A copy of `bytes` to share between this core's subscribers.
    pub fn local(bytes: &[u8]) -> Frame {
        Frame(Rc::new(Body::Local(bytes.into())))
    }
}

impl Deref for Frame {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &*self.0 {
            Body::Local(b) => b,
            Body::Shared(b) => b,
        }
    }
}

impl From<Bytes> for Frame {
    fn from(b: Bytes) -> Frame {
        Frame(Rc::new(Body::Shared(b)))
    }
}

/// One queued outbound frame and the local channel it belongs to (for overflow policies).
#[derive(Debug)]
pub struct Out {
    /// The complete encoded frame, shared with every other subscriber.
    pub frame: Frame,
    /// Local channel index, or [`NO_CHAN`](super::NO_CHAN).
    pub chan: u32,
}

/// What [`OutQueue::offer`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Queued (after dropping or replacing older frames of its channel, by policy).
    Queued,
    /// Not queued: the policy found nothing of its channel to make room (`drop-oldest`,
    /// `conflate`); the subscriber sees the seq gap.
    Dropped,
    /// Full under `disconnect` (or a reply): the connection must close with 1013.
    Overflow,
}

/// The queue. Bounded by the caller's limits, except for HTTP answers and `/echo` frames,
/// which are pushed directly (the reader stops reading while they wait instead).
#[derive(Debug, Default)]
pub struct OutQueue {
    frames: VecDeque<Out>,
    /// Bytes queued, minus the written part of the front frame.
    bytes: u32,
    /// Bytes of the front frame already written.
    offset: u32,
}

impl OutQueue {
    /// Bytes not yet written.
    pub fn bytes(&self) -> usize {
        self.bytes as usize
    }

    /// Frames queued (the front one may be partly written).
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether everything was written.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Appends a frame without limit checks.
    pub fn push(&mut self, frame: impl Into<Frame>, chan: u32) {
        let frame = frame.into();
        self.bytes += frame.len() as u32;
        self.frames.push_back(Out { frame, chan });
    }

    /// Whether `extra` more bytes in one more frame stay within the limits.
    fn fits(&self, ctx: &Ctx, extra: usize) -> bool {
        self.frames.len() < ctx.cfg.queue_max_messages && self.bytes() + extra <= ctx.cfg.queue_max_bytes
    }

    /// Queues `frame` of local channel `chan` within `limits.queue_max_bytes` and
    /// `limits.queue_max_messages`, applying `policy` when it does not fit (`None`: a reply,
    /// which overflows like `disconnect`). Counts overflows in `tether_overflow_total`.
    pub fn offer(&mut self, ctx: &Ctx, frame: Frame, chan: u32, policy: Option<Overflow>) -> Offer {
        if !self.fits(ctx, frame.len()) {
            match policy.unwrap_or(Overflow::Disconnect) {
                Overflow::Disconnect => {
                    ctx.metrics.overflow(0, self.bytes as u64);
                    return Offer::Overflow;
                }
                Overflow::DropOldest => {
                    ctx.metrics.overflow(1, self.bytes as u64);
                    // The front may be partly written: never drop it.
                    self.remove_of_channel(chan, 1, |q| q.fits(ctx, frame.len()));
                    if !self.fits(ctx, frame.len()) {
                        return Offer::Dropped;
                    }
                }
                Overflow::Conflate => {
                    ctx.metrics.overflow(2, self.bytes as u64);
                    // Only the newest message of the channel is worth sending: every older one
                    // still queued goes (the partly written front stays: cutting it would
                    // corrupt the stream).
                    self.remove_of_channel(chan, usize::from(self.offset > 0), |_| false);
                    if !self.fits(ctx, frame.len()) {
                        return Offer::Dropped;
                    }
                }
            }
        }
        self.push(frame, chan);
        Offer::Queued
    }

    /// Removes the frames of local channel `chan` from index `from` on, oldest first, until
    /// `enough` says so.
    fn remove_of_channel(&mut self, chan: u32, from: usize, enough: impl Fn(&Self) -> bool) {
        let mut i = from;
        while i < self.frames.len() && !enough(self) {
            if self.frames[i].chan == chan {
                let o = self.frames.remove(i).expect("index checked");
                self.bytes -= o.frame.len() as u32;
            } else {
                i += 1;
            }
        }
    }

    /// Drops every queued frame except the unwritten rest of a partly written front frame
    /// (cutting a frame in half would corrupt the stream).
    pub fn clear(&mut self) {
        let keep = if self.offset > 0 { self.frames.pop_front() } else { None };
        self.frames.clear();
        self.bytes = 0;
        if let Some(f) = keep {
            self.bytes = f.frame.len() as u32 - self.offset;
            self.frames.push_back(f);
        }
    }

    /// Gives an empty queue's memory back (when it drains, and at each heartbeat).
    pub fn shrink_idle(&mut self) {
        if self.frames.is_empty() && self.frames.capacity() > 0 {
            self.frames = VecDeque::new();
        }
    }

    /// Room for `n` more frames without reaching `max_msgs`/`max_bytes`, for a frame of
    /// `len` bytes; an empty queue always takes one frame, however large.
    pub fn has_room(&self, len: usize, max_msgs: usize, max_bytes: usize) -> bool {
        self.frames.is_empty() || (self.frames.len() < max_msgs && self.bytes() + len <= max_bytes)
    }

    /// Fills `iov` with the unwritten bytes, front first; returns the slices filled.
    pub fn fill<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (i, o) in self.frames.iter().take(iov.len()).enumerate() {
            let skip = if i == 0 { self.offset as usize } else { 0 };
            iov[i] = IoSlice::new(&o.frame[skip..]);
            n += 1;
        }
        n
    }

    /// `written` bytes from the front were sent.
    pub fn advance(&mut self, mut written: usize) {
        self.bytes -= written as u32;
        while written > 0 {
            let front_left = self.frames[0].frame.len() - self.offset as usize;
            if written >= front_left {
                written -= front_left;
                self.frames.pop_front();
                self.offset = 0;
            } else {
                self.offset += written as u32;
                written = 0;
            }
        }
    }
}
