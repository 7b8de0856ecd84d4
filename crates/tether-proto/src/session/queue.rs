//! A connection's outbound queue: shared frames (each encoded once for every subscriber), the
//! written part of the front one, and the overflow policies that keep it bounded
//! (docs/operations.md, "Slow subscribers").

use std::collections::VecDeque;
use std::io::IoSlice;
use std::ops::Deref;
use std::rc::Rc;

use bytes::Bytes;
use serde::Deserialize;

use super::Ctx;

/// What a full outbound queue does to a subscriber (docs/operations.md, slow subscribers); the
/// `overflow` key of a `[[channels]]` rule.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overflow {
    /// Close with 1013 Try Again Later; the client reconnects and resumes from its last
    /// processed seq. For ordered streams. TOML `"disconnect"`.
    Disconnect,
    /// Drop the oldest queued messages of the channel; the client sees a seq gap.
    /// TOML `"drop-oldest"`.
    DropOldest,
    /// Keep only the latest queued message of the channel (tickers, cursors).
    /// TOML `"conflate"`.
    Conflate,
}

impl Overflow {
    /// The TOML spelling: `disconnect`, `drop-oldest`, `conflate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::Disconnect => "disconnect",
            Overflow::DropOldest => "drop-oldest",
            Overflow::Conflate => "conflate",
        }
    }
}

/// Frames handed to one `sendmsg` at most.
pub const MAX_IOV: usize = 256;

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

/// One queued outbound frame, the local channel it belongs to and its channel's overflow
/// policy (for the policies, and for making room for a reply). 16 bytes.
#[derive(Debug)]
pub struct Out {
    /// The complete encoded frame, shared with every other subscriber.
    pub frame: Frame,
    /// Local channel index while the connection is subscribed, else
    /// [`NO_CHAN`](super::NO_CHAN) (replies, and a channel's frames still queued when its
    /// subscription ended: the index may then go to another channel).
    pub chan: u32,
    /// The channel's overflow policy; `Disconnect` (nothing may drop it) for a reply. Tells
    /// which frames a reply may push out of a full queue.
    policy: Overflow,
}

/// What [`OutQueue::offer`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Queued (after dropping or replacing older frames of its channel, by policy).
    Queued,
    /// Not queued: `drop-oldest` found nothing of its channel to make room; the subscriber
    /// sees the seq gap.
    Dropped,
    /// Full under `disconnect` (or a reply): the connection must close with 1013.
    Overflow,
}

/// The queue. Bounded by the caller's limits, except for HTTP answers and `/echo` frames,
/// which are pushed directly (the reader stops reading while they wait instead), and for the
/// parked frames of `conflate` channels (at most one per channel, outside the limits).
#[derive(Debug, Default)]
pub struct OutQueue {
    frames: VecDeque<Out>,
    /// Bytes queued, minus the written part of the front frame.
    bytes: u32,
    /// Bytes of the front frame already written.
    offset: u32,
    /// The newest message of each `conflate` channel that found no room in a full queue
    /// (none of its channel's frames to replace), oldest first; queued as writes make room
    /// ([`OutQueue::advance`]). So a subscriber that reads again gets the current value of every
    /// `conflate` channel, however many it holds. Boxed and usually absent: 8 bytes.
    parked: Option<Box<Parked>>,
}

/// The parked frames of a queue ([`OutQueue::parked`]) and the limits they wait to fit.
#[derive(Debug)]
struct Parked {
    /// At most one per channel, oldest first.
    frames: Vec<Out>,
    /// `limits.queue_max_messages`.
    max_messages: usize,
    /// `limits.queue_max_bytes`.
    max_bytes: usize,
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

    /// Appends a frame without limit checks (nothing may drop it).
    pub fn push(&mut self, frame: impl Into<Frame>, chan: u32) {
        self.push_as(frame.into(), chan, Overflow::Disconnect);
    }

    fn push_as(&mut self, frame: Frame, chan: u32, policy: Overflow) {
        self.bytes += frame.len() as u32;
        self.frames.push_back(Out { frame, chan, policy });
    }

    /// The address the next [`OutQueue::offer`] stores its entry at (one past the back of the
    /// queue's buffer; past its end when the buffer is full or wraps, which is harmless): a
    /// fan-out prefetches it a few subscribers ahead, because once subscribers fall behind their
    /// queues outgrow the caches and that store missed on every delivery (`perf annotate` of
    /// a saturated core: 76 % of `offer`). Never read through.
    #[inline]
    pub fn next_slot(&self) -> *const u8 {
        let (front, back) = self.frames.as_slices();
        let last = if back.is_empty() { front } else { back };
        last.as_ptr_range().end.cast()
    }

    /// Whether `extra` more bytes in one more frame stay within the limits.
    fn fits(&self, ctx: &Ctx, extra: usize) -> bool {
        self.frames.len() < ctx.cfg.queue_max_messages && self.bytes() + extra <= ctx.cfg.queue_max_bytes
    }

    /// Queues `frame` of local channel `chan` within `limits.queue_max_bytes` and
    /// `limits.queue_max_messages`, applying `policy` when it does not fit. `None` is a reply
    /// (a pong, a heartbeat ping, an ack, an error): when it does not fit it takes the place of
    /// the oldest queued messages of `drop-oldest` channels, then of `conflate` channels, which
    /// those policies allow to drop, and overflows like `disconnect` only when that is not
    /// enough. So a subscriber whose queue a `drop-oldest` channel keeps full is not closed by
    /// the server's own ping. Counts overflows in `tether_overflow_total`.
    pub fn offer(&mut self, ctx: &Ctx, frame: Frame, chan: u32, policy: Option<Overflow>) -> Offer {
        if policy.is_none() && !self.fits(ctx, frame.len()) {
            // The front may be partly written: never drop it.
            let from = usize::from(self.offset > 0);
            let mut dropped = 0;
            self.remove_where(
                from,
                |o| o.policy == Overflow::DropOldest,
                |q| q.fits(ctx, frame.len()),
                |_| dropped += 1,
            );
            if dropped > 0 {
                ctx.stats.overflow(1, self.bytes as u64);
            }
            // A conflate channel's newest value waits beside the queue rather than being lost.
            let mut conflated = Vec::new();
            self.remove_where(
                from,
                |o| o.policy == Overflow::Conflate,
                |q| q.fits(ctx, frame.len()),
                |o| conflated.push(o),
            );
            if !conflated.is_empty() {
                ctx.stats.overflow(2, self.bytes as u64);
            }
            for o in conflated {
                self.park(ctx, o);
            }
        }
        if !self.fits(ctx, frame.len()) {
            match policy.unwrap_or(Overflow::Disconnect) {
                Overflow::Disconnect => {
                    ctx.stats.overflow(0, self.bytes as u64);
                    return Offer::Overflow;
                }
                Overflow::DropOldest => {
                    ctx.stats.overflow(1, self.bytes as u64);
                    // The front may be partly written: never drop it.
                    self.remove_where(1, |o| o.chan == chan, |q| q.fits(ctx, frame.len()), drop);
                    if !self.fits(ctx, frame.len()) {
                        return Offer::Dropped;
                    }
                }
                Overflow::Conflate => {
                    ctx.stats.overflow(2, self.bytes as u64);
                    // Only the newest message of the channel is worth sending: every older one
                    // still queued goes (the partly written front stays: cutting it would
                    // corrupt the stream).
                    self.remove_where(usize::from(self.offset > 0), |o| o.chan == chan, |_| false, drop);
                    if !self.fits(ctx, frame.len()) {
                        // No room left by other channels: it waits, replacing an older one.
                        self.park(ctx, Out { frame, chan, policy: Overflow::Conflate });
                        return Offer::Queued;
                    }
                }
            }
        }
        let policy = policy.unwrap_or(Overflow::Disconnect);
        if policy == Overflow::Conflate {
            self.unpark_channel(chan);
        }
        self.push_as(frame, chan, policy);
        Offer::Queued
    }

    /// Parks `o`, the newest frame of its `conflate` channel, replacing an older parked one.
    fn park(&mut self, ctx: &Ctx, o: Out) {
        let (max_messages, max_bytes) = (ctx.cfg.queue_max_messages, ctx.cfg.queue_max_bytes);
        let p = self.parked.get_or_insert_with(|| Box::new(Parked { frames: Vec::new(), max_messages, max_bytes }));
        p.frames.retain(|q| q.chan != o.chan);
        p.frames.push(o);
    }

    /// Forgets the parked frame of `chan` (a newer one was queued, or the channel left).
    fn unpark_channel(&mut self, chan: u32) {
        if let Some(p) = self.parked.as_mut() {
            p.frames.retain(|o| o.chan != chan);
            if p.frames.is_empty() {
                self.parked = None;
            }
        }
    }

    /// Queues the parked frames, oldest first, while they fit the limits (after a write made
    /// room).
    fn unpark(&mut self) {
        let Some(mut p) = self.parked.take() else { return };
        while let Some(len) = p.frames.first().map(|o| o.frame.len()) {
            if self.frames.len() >= p.max_messages || self.bytes() + len > p.max_bytes {
                break;
            }
            let o = p.frames.remove(0);
            self.push_as(o.frame, o.chan, o.policy);
        }
        if !p.frames.is_empty() {
            self.parked = Some(p);
        }
    }

    /// The connection's subscription to local channel `chan` ended: its frames still queued
    /// are sent as they are, but no longer belong to `chan`, whose index may go to another
    /// channel (whose overflow policy must not remove them); its parked frame, if any, is
    /// forgotten (the client asked to stop).
    pub fn release_channel(&mut self, chan: u32) {
        for o in self.frames.iter_mut().filter(|o| o.chan == chan) {
            o.chan = super::NO_CHAN;
        }
        self.unpark_channel(chan);
    }

    /// Removes the frames `which` selects from index `from` on, oldest first, until `enough`
    /// says so, handing each to `removed`.
    fn remove_where(
        &mut self,
        from: usize,
        which: impl Fn(&Out) -> bool,
        enough: impl Fn(&Self) -> bool,
        mut removed: impl FnMut(Out),
    ) {
        let mut i = from;
        while i < self.frames.len() && !enough(self) {
            if which(&self.frames[i]) {
                let o = self.frames.remove(i).expect("index checked");
                self.bytes -= o.frame.len() as u32;
                removed(o);
            } else {
                i += 1;
            }
        }
    }

    /// Drops every queued frame except the unwritten rest of a partly written front frame
    /// (cutting a frame in half would corrupt the stream).
    pub fn clear(&mut self) {
        self.parked = None;
        let keep = if self.offset > 0 { self.frames.pop_front() } else { None };
        self.frames.clear();
        self.bytes = 0;
        if let Some(f) = keep {
            self.bytes = f.frame.len() as u32 - self.offset;
            self.frames.push_back(f);
        }
    }

    /// Drops the queued deliveries (frames of a channel) not yet begun, keeping replies and
    /// the unwritten rest of a partly written front frame: the peer sent its close frame, so
    /// our answer goes out as soon as practical (RFC 6455 §5.5.1) instead of behind a backlog
    /// the close deadline might not let it reach. A client that wants them resumes by seq.
    pub fn drop_deliveries(&mut self) {
        self.parked = None;
        let from = usize::from(self.offset > 0);
        self.remove_where(from, |o| o.chan != super::NO_CHAN, |_| false, |_| {});
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

    /// `written` bytes from the front were sent; parked frames take the room it made.
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
        if self.parked.is_some() {
            self.unpark();
        }
    }
}
