//! The send path of a core: writing what the sessions queued (docs/architecture.md, "The send
//! path").
//!
//! [`CoreState::flush`] writes one connection at once (an answer, a replay batch, an output
//! edge); [`CoreState::flush_some`] writes connections of the dirty list, either with one
//! `sendmsg(2)` per connection (`io.send_batch = "sendmsg"`) or, with `"io_uring"`, by
//! submitting the first send of up to [`BATCH`] connections together on the core's send ring
//! ([`SendBatch`]) and then finishing each connection exactly as [`CoreState::flush`] does,
//! starting from the batched send's result. Either way one function acts on a send's result
//! (bytes → [`Session::transmitted`](crate::session::Session::transmitted), a full socket →
//! [`IoFlags::WANT_WRITE`], an error → the connection is reaped), so ordering, replay pumping,
//! the FIN and the queue rules are the same.

use std::io::{self, IoSlice};

use super::conn::{Conn, ConnId, IoFlags};
use super::core::{arm, conn, notice, CoreState};
use super::io::batch::{SendBatch, BATCH, SLOT_IOV};
use super::io::{self as sock};
use crate::config;
use crate::session::queue::MAX_IOV;
use crate::session::replay::Fetch;
use crate::session::{Ctx, ReapReason};
use crate::tick::Tick;

/// The core's send ring when `io.send_batch = "io_uring"` and one could be created, else `None`
/// (the reason is logged: the core sends with `sendmsg(2)`).
pub fn send_ring(core: usize, mode: config::SendBatch) -> Option<SendBatch> {
    match mode {
        config::SendBatch::Sendmsg => None,
        config::SendBatch::IoUring => match SendBatch::new() {
            Ok(b) => {
                tracing::info!(core, "send ring ready (io.send_batch = \"io_uring\")");
                Some(b)
            }
            Err(e) => {
                tracing::warn!(core, error = %e, "cannot create the send ring; this core sends with sendmsg");
                None
            }
        },
    }
}

impl CoreState {
    /// Writes what `id` has queued, refilling from a resume replay as the socket takes it;
    /// half-closes TCP when the session is finishing. On a full socket the connection waits for
    /// writability ([`IoFlags::WANT_WRITE`], flushed again on the reactor's output edge); on an
    /// error the connection is reaped.
    pub fn flush(&mut self, id: ConnId) {
        let now = self.clock.now();
        self.flush_at(id, now, None);
    }

    /// [`CoreState::flush`] at a tick read once for a whole pass of flushes. `first` is the
    /// result of a send of what the session offered that was already made (batched), acted on
    /// before anything more is sent; `None`: nothing was sent yet.
    fn flush_at(&mut self, id: ConnId, now: Tick, first: Option<io::Result<usize>>) {
        let mut fetch = None;
        let ctx = Ctx {
            now,
            cfg: &self.clock.cfg,
            stats: &self.shared.metrics[self.me].session,
            deflate: &self.clock.deflate,
        };
        let Some(c) = conn(&mut self.conns.slab, id) else { return };
        if !c.session.state().can_write() && !c.subs.is_empty() {
            // The connection is closing (our close frame is queued, or the peer's came): no
            // message can reach it any more, so it leaves its channels (and their presence,
            // whose members see the leave) now, not when the peer answers or the close
            // times out. Whatever was queued still goes out.
            for e in std::mem::take(&mut c.subs) {
                self.drop_sub(id, e);
            }
            return self.flush_at(id, now, first);
        }
        c.io.clear(IoFlags::DIRTY);
        if first.is_none() && c.io.has(IoFlags::WANT_WRITE) {
            return;
        }
        if c.io.has(IoFlags::TLS) {
            // Its state is out while its records are read (`tls::io`): the read flushes after.
            let Some(t) = self.tls.get(id.key) else { return };
            super::tls::io::transmit(t, c, &ctx, &mut fetch);
        } else {
            send_plain(c, &ctx, first, &mut fetch, &mut self.gather);
        }
        // With the record in hand: no second slab lookup per delivery.
        arm(&mut self.clock.wheel, self.clock.heartbeat_slack, id, c);
        notice(&mut self.reactor, id, c);
        if let Some(f) = fetch {
            self.fetch(id, f);
        }
    }

    /// Flushes every connection queued to so far (not those queued to while flushing: a replay
    /// refill lists its connection again), in chunks on the send ring when the core has one,
    /// else one [`CoreState::flush`] each.
    pub fn flush_dirty(&mut self) {
        let n = self.conns.dirty.len();
        self.flush_some(n);
    }

    /// Flushes the first `limit` connections of the dirty list (fewer when it is shorter);
    /// returns whether any are left. The processor writes a long list this way, a chunk
    /// between messages, so what arrives while it writes joins the queues of the connections
    /// not yet written and leaves with them (processor.rs).
    pub fn flush_some(&mut self, limit: usize) -> bool {
        let n = limit.min(self.conns.dirty.len());
        // Taken out (and given back, to keep its capacity) because flushing may queue more.
        let mut ids = std::mem::take(&mut self.conns.flushing);
        ids.extend(self.conns.dirty.drain(..n));
        let now = self.clock.now();
        match self.sends.take() {
            Some(mut batch) => {
                for chunk in ids.chunks(BATCH) {
                    self.flush_chunk(&mut batch, chunk, now);
                }
                if batch.is_broken() {
                    tracing::warn!(core = self.me, "the send ring failed; this core sends with sendmsg from now on");
                } else {
                    self.sends = Some(batch);
                }
            }
            None => {
                for &id in &ids {
                    self.flush_at(id, now, None);
                }
            }
        }
        ids.clear();
        self.conns.flushing = ids;
        !self.conns.dirty.is_empty()
    }

    /// One chunk of [`CoreState::flush_some`] on the send ring: the first send of every
    /// connection that has bytes to send and is not waiting for writability goes out in one
    /// submission, then each connection of the chunk is finished by [`CoreState::flush_at`]
    /// from its send's result (the rest of a long queue, a replay, the FIN, its deadline).
    fn flush_chunk(&mut self, batch: &mut SendBatch, chunk: &[ConnId], now: Tick) {
        // Slot of each connection's staged send, if one was staged.
        let mut staged = [usize::MAX; BATCH];
        for (k, &id) in chunk.iter().enumerate() {
            let Some(c) = conn(&mut self.conns.slab, id) else { continue };
            // An id listed twice (flushed in between, then queued to again) is staged once:
            // its second listing finds DIRTY clear and is flushed after the first.
            // A ring that broke in an earlier chunk of this pass is not used again: the
            // connections of this one are flushed with `sendmsg` below.
            // A TLS connection encrypts first: `flush_at` writes it below.
            if !c.io.has(IoFlags::DIRTY) || c.io.has(IoFlags::WANT_WRITE) || c.io.has(IoFlags::TLS) || batch.is_broken()
            {
                continue;
            }
            c.io.clear(IoFlags::DIRTY);
            let mut iov = [IoSlice::new(&[]); SLOT_IOV];
            let n = c.session.poll_transmit(&mut iov);
            if n > 0 {
                // SAFETY: the iovecs point into frames held by the session's queue, and `fd` is
                // the session's open socket; no session is touched (nor torn down) until
                // `submit` below has returned, with every staged send completed.
                staged[k] = unsafe { batch.stage(c.fd, &iov[..n]) };
            }
        }
        let results = if batch.is_empty() { &mut [][..] } else { batch.submit() };
        for (k, &id) in chunk.iter().enumerate() {
            let first = results.get_mut(staged[k]).and_then(Option::take);
            self.flush_at(id, now, first);
        }
    }
}

/// Writes what plain connection `c`'s session offers until it is all written or the socket is
/// full, acting first on `first` (a send already made); a resume replay refills the queue as
/// it drains (its next batch to fetch goes to `fetch`). Half-closes TCP when the session is
/// finishing. A full socket sets [`IoFlags::WANT_WRITE`]; an error reaps the connection.
fn send_plain(
    c: &mut Conn,
    ctx: &Ctx,
    mut first: Option<io::Result<usize>>,
    fetch: &mut Option<Fetch>,
    gather: &mut sock::Gather,
) {
    let (s, fd) = (&mut c.session, c.fd);
    loop {
        let written = match first.take() {
            Some(r) => r,
            None => {
                if !s.has_output() {
                    // Everything is written: a resume replay refills the queue.
                    let (queued, f) = s.pump_replay(ctx);
                    *fetch = fetch.take().or(f);
                    if queued {
                        continue;
                    }
                    break;
                }
                // Filled only when there is something to offer: the MAX_IOV slots are 4 KiB of
                // stores, which a connection written once per pass paid twice (the second time to
                // learn that its queue was empty).
                let mut iov = [IoSlice::new(&[]); MAX_IOV];
                let n = s.poll_transmit(&mut iov);
                gather.send(fd, &iov[..n])
            }
        };
        match written {
            Ok(n) => s.transmitted(n, ctx.now),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The send that failed armed the socket's next output edge.
                c.io.set(IoFlags::WANT_WRITE);
                break;
            }
            Err(_) => {
                s.kill(ReapReason::Reset);
                break;
            }
        }
    }
    if c.session.poll_fin(ctx) {
        sock::shutdown_write(fd);
    }
}
