//! The process-wide channel count against `limits.max_channels` (docs/security.md,
//! "Per-connection limits"): unique channel names cannot grow memory without bound.
//!
//! Whoever creates a channel's per-process state acquires a slot first and releases it when
//! that state is dropped: the memory broker's homes (a channel's seq, epoch, history), the
//! Redis broker's thread (a channel's task while it has subscribers on this node). One atomic
//! shared by every core, touched only when a channel is created or forgotten, never per
//! message.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::server::tick::SWEEP_MS;

/// `retry_after_ms` of a refusal by `max_channels`, in milliseconds: idle channels are
/// forgotten by a sweep every [`SWEEP_MS`] (5 s), so a slot may free up by then.
pub const MAX_CHANNELS_RETRY_MS: u64 = SWEEP_MS;

/// Channels held by this process, bounded by `max`.
#[derive(Debug)]
pub struct ChannelCap {
    max: usize,
    count: AtomicUsize,
}

impl ChannelCap {
    /// An empty count bounded by `max` channels (`limits.max_channels`).
    pub fn new(max: usize) -> ChannelCap {
        ChannelCap { max, count: AtomicUsize::new(0) }
    }

    /// Takes one slot for a new channel; `false` (nothing taken) when `max` are held. Exact
    /// under concurrent callers: the count never exceeds `max`.
    pub fn try_acquire(&self) -> bool {
        self.count.fetch_update(Relaxed, Relaxed, |n| (n < self.max).then_some(n + 1)).is_ok()
    }

    /// Gives back the slot of a channel that was dropped.
    pub fn release(&self) {
        // Saturating: a release without its acquire must not wrap the gauge.
        let _ = self.count.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }

    /// Channels held now.
    pub fn count(&self) -> usize {
        self.count.load(Relaxed)
    }

    /// The bound (`limits.max_channels`).
    pub fn max(&self) -> usize {
        self.max
    }

    /// The `error` `limit` answer to a `sub` or publish refused because `max` channels are
    /// held, with `retry_after_ms` [`MAX_CHANNELS_RETRY_MS`].
    pub fn refusal(&self) -> crate::protocol::RequestError {
        crate::protocol::RequestError::limit(
            format!("max_channels ({}) reached: no new channel can be created now", self.max),
            Some(MAX_CHANNELS_RETRY_MS),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn never_exceeds_max_and_frees_on_release() {
        let cap = ChannelCap::new(2);
        assert!(cap.try_acquire() && cap.try_acquire());
        assert!(!cap.try_acquire());
        assert_eq!(cap.count(), 2);
        cap.release();
        assert!(cap.try_acquire());
        cap.release();
        cap.release();
        cap.release();
        assert_eq!(cap.count(), 0, "an unmatched release does not wrap");
    }

    #[test]
    fn concurrent_acquires_stop_exactly_at_max() {
        let cap = Arc::new(ChannelCap::new(1000));
        let won: usize = (0..4)
            .map(|_| {
                let cap = cap.clone();
                std::thread::spawn(move || (0..600).filter(|_| cap.try_acquire()).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .sum();
        assert_eq!((won, cap.count()), (1000, 1000));
    }
}
