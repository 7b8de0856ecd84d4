//! A batch of deliveries as this core's subscribers take them: for each [`Encoding`] a
//! subscriber of the batch negotiated, one local copy of each message's frame in it
//! ([`Frame::local`], shared without atomics), made when the first such subscriber is met.
//! A batch nobody takes compressed costs nothing for compression; the encoding itself is made
//! once for the whole process ([`Published::encoded`]), here by whichever core needs it first.

use std::sync::Arc;

use bytes::Bytes;

use crate::published::{Encoding, Published};
use crate::session::queue::Frame;
use crate::session::Ctx;

/// Consecutive messages of one channel, and this core's copies of them per encoding.
pub struct Batch<'a> {
    msgs: &'a [Arc<Published>],
    /// The channel's epoch as this core knows it (`LocalChannel::epoch`), which SSE event ids
    /// name; the same on every core for a given message, so whichever core makes the event
    /// first makes it right for all.
    epoch: Option<Arc<str>>,
    /// Local subscribers of the channel: a local copy is made when it costs at most 64 bytes
    /// of copying per subscriber (else the shared `Bytes` is queued).
    subs: usize,
    frames: [Option<Vec<Frame>>; Encoding::COUNT],
}

impl<'a> Batch<'a> {
    /// The batch of `msgs` (one channel, in seq order) for a channel with `subs` local
    /// subscribers.
    pub fn new(msgs: &'a [Arc<Published>], subs: usize) -> Batch<'a> {
        Batch { msgs, epoch: None, subs, frames: Default::default() }
    }

    /// The batch of a channel whose epoch is `epoch` (for [`Encoding::Sse`]).
    pub fn with_epoch(mut self, epoch: Option<Arc<str>>) -> Batch<'a> {
        self.epoch = epoch;
        self
    }

    /// The frames of the batch in encoding `enc`, made (and the encoding, if no core made it
    /// yet) on the first call for `enc`. An encoding that fell back to the plain frame shares
    /// the plain copy.
    pub fn frames(&mut self, enc: Encoding, ctx: &Ctx) -> &[Frame] {
        if self.frames[enc.index()].is_none() {
            let epoch = self.epoch.clone();
            let made: Vec<Frame> = (0..self.msgs.len())
                .map(|i| {
                    let p = &self.msgs[i];
                    let bytes = p.encoded(enc, |p| make(enc, p, epoch.as_deref(), ctx));
                    if enc != Encoding::Plain && p.is_plain(bytes) {
                        self.plain(i)
                    } else {
                        self.copy(bytes)
                    }
                })
                .collect();
            self.frames[enc.index()] = Some(made);
        }
        self.frames[enc.index()].as_deref().unwrap_or_default()
    }

    /// The plain frame of message `i`, as copied for this batch (copied now if not yet).
    fn plain(&mut self, i: usize) -> Frame {
        if self.frames[Encoding::Plain.index()].is_none() {
            let made = self.msgs.iter().map(|p| self.copy(p.frame())).collect();
            self.frames[Encoding::Plain.index()] = Some(made);
        }
        self.frames[Encoding::Plain.index()]
            .as_ref()
            .map(|f| f[i].clone())
            .unwrap_or_else(|| self.copy(self.msgs[i].frame()))
    }

    fn copy(&self, bytes: &Bytes) -> Frame {
        if self.subs.saturating_mul(64) >= bytes.len() {
            Frame::local(bytes)
        } else {
            Frame::from(bytes.clone())
        }
    }
}

/// Makes message `p` in encoding `enc` (called at most once per message and encoding for the
/// whole process, by [`Published::encoded`]); `epoch` is its channel's, for an SSE event id.
fn make(enc: Encoding, p: &Published, epoch: Option<&str>, ctx: &Ctx) -> Bytes {
    match enc {
        // No epoch only before the channel's first subscription answer on this core, when no
        // subscriber of it is active; an id with "-" would resume as a reset, never a gap.
        // Published frames are `msg` frames; were one not, a comment line keeps the stream whole.
        Encoding::Sse => {
            crate::sse::msg_from_frame(p.frame(), epoch.unwrap_or("-")).unwrap_or_else(|| crate::sse::HEARTBEAT.clone())
        }
        Encoding::Plain => p.frame().clone(),
        // Under `compression.min_bytes`, or not smaller compressed: the plain frame itself.
        Encoding::Deflate => {
            let deflated = ctx.deflate.deflate_frame(p.frame());
            ctx.stats.deflate.count(p.frame().len(), deflated.as_ref().map(|f| f.len()));
            deflated.unwrap_or_else(|| p.frame().clone())
        }
    }
}
