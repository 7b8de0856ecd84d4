//! Non-readers for `tether load fanout --non-readers N` (docs/operations.md, slow subscribers):
//! subscribers that connect with a small `SO_RCVBUF`, complete the handshake, subscribe, and
//! then never read while the run publishes, so their outbound queue on the server fills.
//!
//! They are kept out of the fan-out figures (latency, deliveries, loss). Once the publishing is
//! over they read what is left, to learn what the server did with them: closed them (a close
//! frame, e.g. 1013 under the `disconnect` policy, or EOF / reset once the server gave up on
//! the close handshake), or kept them open (`drop-oldest`, `conflate`), in which case the seq
//! gaps they then see are the messages the server dropped for them.
//!
//! Report fields (only when N > 0): `non_readers`, `non_readers_subscribed`,
//! `non_readers_closed`, `non_readers_open`, `non_reader_close_kinds` (`{"closed_1013":n,…}`),
//! `non_reader_received` (messages read at the end), `non_reader_lost` (seqs never received by
//! the non-readers still open, up to the final seq).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use super::fanout::{Shared, Subscriber};
use super::report::{Errors, Report};
use super::seq::{SeqTally, SeqTracker};
use super::sse::SubConn;
use super::wire::{scan_str, scan_u64, ConnError};

/// While draining at the end, a quiet spell this long means the server kept the connection
/// open and has nothing more queued for it.
const QUIET: Duration = Duration::from_millis(500);
/// Longest drain of one non-reader (a non-reader whose server neither closes it nor stops
/// sending counts as open).
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// What the non-readers of one worker thread saw.
#[derive(Debug, Default)]
pub struct NonReaderTally {
    /// Subscribed before the publishing started.
    pub subscribed: u64,
    /// Could not connect or subscribe.
    pub failed: u64,
    /// Closed by the server (close frame, EOF or reset) by the end of the drain.
    pub closed: u64,
    /// Still open at the end of the drain.
    pub open: u64,
    /// Why the closed ones ended ([`ConnError::kind`]: `closed_1013`, `eof`, `reset`, …), plus
    /// the setup failures.
    pub kinds: Errors,
    /// Loss accounting of the non-readers still open (final seq known) and of the closed ones
    /// (gaps only).
    pub seqs: SeqTally,
}

impl NonReaderTally {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &NonReaderTally) {
        self.subscribed += other.subscribed;
        self.failed += other.failed;
        self.closed += other.closed;
        self.open += other.open;
        self.kinds.merge(&other.kinds);
        self.seqs.add(&other.seqs);
    }

    /// Appends the report fields listed in the module docs for `count` non-readers.
    pub fn report(&self, count: usize, r: &mut Report) {
        r.set("non_readers", count)
            .set("non_readers_subscribed", self.subscribed)
            .set("non_readers_closed", self.closed)
            .set("non_readers_open", self.open)
            .set("non_reader_close_kinds", self.kinds.to_json())
            .set("non_reader_received", self.seqs.received)
            .set("non_reader_lost", self.seqs.lost);
    }
}

/// Runs one non-reader: subscribe (counted in `shared.nr_ready` / `nr_failed`), stay silent
/// until the run stops, then drain and record the outcome in `tally`.
pub(super) async fn run(
    sub: Subscriber,
    permit: OwnedSemaphorePermit,
    tally: Rc<RefCell<NonReaderTally>>,
    shared: Arc<Shared>,
) {
    let opened = sub.open().await;
    drop(permit);
    let (mut conn, head) = match opened {
        Ok(v) => v,
        Err(e) => {
            shared.nr_failed.fetch_add(1, Ordering::Relaxed);
            let mut t = tally.borrow_mut();
            t.failed += 1;
            t.kinds.add(format!("setup_{}", e.kind()));
            return;
        }
    };
    shared.nr_ready.fetch_add(1, Ordering::Relaxed);
    tally.borrow_mut().subscribed += 1;
    // Not reading is the point: the socket is left alone until the run is over.
    let mut stop = shared.stop.subscribe();
    // An error only means the sender is gone, i.e. the run is over too.
    let _ = stop.wait_for(|s| *s).await;
    let mut seqs = SeqTracker::starting_after(head);
    let ended = drain(&mut conn, &mut seqs).await;
    let mut t = tally.borrow_mut();
    match ended {
        Some(e) => {
            t.closed += 1;
            t.kinds.add(e.kind());
            // After a close the messages the server dropped with the queue are not loss.
            t.seqs.add(&seqs.tally(None));
        }
        None => {
            t.open += 1;
            let final_seq = shared.finals.get().and_then(|f| f.get(sub.ch).copied());
            t.seqs.add(&seqs.tally(final_seq));
        }
    }
}

/// Reads everything left (pings answered) until the server closes (`Some(why)`), goes quiet
/// for [`QUIET`] or [`DRAIN_LIMIT`] passes (`None`: still open).
async fn drain(conn: &mut SubConn, seqs: &mut SeqTracker) -> Option<ConnError> {
    let deadline = Instant::now() + DRAIN_LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let read = conn.recv(|m| {
            if scan_str(m, "op") == Some(b"msg") {
                if let Some(seq) = scan_u64(m, "seq") {
                    seqs.observe(seq);
                }
            }
        });
        match tokio::time::timeout(QUIET.min(left), read).await {
            Err(_) => return None,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Some(e),
        }
    }
}
