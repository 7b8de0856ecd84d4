//! The readiness source of one core and the one task that turns readiness into work.
//!
//! Every socket of a core is registered with one readiness source the core owns ([`Reactor`]),
//! with the connection's slab key + generation ([`ConnId`]) as the registration's user data,
//! for input, output and the peer's half-close (`io.readiness`, docs/architecture.md,
//! "Readiness"):
//! - `epoll` (default): one epoll set, edge-triggered;
//! - `io_uring`: one multishot poll per socket (`IORING_POLL_ADD_MULTI`) on a ring of the
//!   core's own ([`PollRing`]).
//!
//! The reactor task ([`run`]) awaits the source's descriptor on the core's monoio runtime (a
//! one-shot `IORING_OP_POLL_ADD` on the io_uring driver, the driver's own epoll on the legacy
//! one), takes what is ready (the ring's completions, or `epoll_wait`) and hands it to the
//! sessions through the core ([`CoreState::on_readable`], [`CoreState::flush`]). So an idle
//! connection costs its slab slot, its subscription entries, its timer-wheel entry and one
//! kernel registration: no task, no future, no waker and no heap allocation.
//!
//! Both sources report a socket when its wait queue is woken, not while it stays ready
//! (edge-triggered), so the core remembers what it did not consume: an input report on a
//! connection whose reads are held (answers owed, a request awaiting
//! another core, a publisher held by an overload), or one whose read budget ran out, sets
//! [`IoFlags::READ_PENDING`], and the connection is revisited through the core's ready list
//! ([`Reactor::schedule`]) when the hold clears or on the next pass. A held connection is never
//! revisited while it stays held, so it cannot spin. An output edge flushes a connection that
//! waits for the socket ([`IoFlags::WANT_WRITE`]) and is ignored otherwise.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::pin;
use std::rc::Rc;
use std::task::{Poll, Waker};

use super::conn::{Conn, ConnId, IoFlags};
use super::core::CoreState;
use super::io::poll_ring::{PollRing, Report};
use super::yielding::yield_now;
use crate::config;
use crate::session::{ReapReason, State};

/// Reports taken from the readiness source per pass (an epoll event is 12 bytes, a report 16).
pub const EVENTS_PER_WAIT: usize = 1024;

/// Interest of every epoll registration: input, output and the peer's half-close,
/// edge-triggered.
const INTEREST: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

/// The user data of a registration: generation in the high half, slab key in the low half.
fn token(id: ConnId) -> u64 {
    (u64::from(id.gen) << 32) | u64::from(id.key)
}

fn conn_of(token: u64) -> ConnId {
    ConnId { key: token as u32, gen: (token >> 32) as u32 }
}

/// Where a core learns that its sockets are ready.
enum Source {
    /// One multishot poll per socket on the core's readiness ring.
    Ring(Box<PollRing>),
    /// One edge-triggered registration per socket in the core's epoll set, and the buffer
    /// `epoll_wait` fills.
    Epoll { epoll: OwnedFd, events: Vec<libc::epoll_event> },
}

/// One core's readiness source and the connections its reactor task must look at again.
pub struct Reactor {
    source: Source,
    /// Connections to revisit on the reactor's next pass (each listed once, [`IoFlags::READY`]):
    /// closed ones to tear down, ones whose read hold cleared, ones with input left after their
    /// read budget.
    ready: Vec<ConnId>,
    /// The reactor task's waker, woken when the ready list stops being empty.
    waker: Option<Waker>,
}

impl Reactor {
    /// The readiness source `io.readiness` asks for. A ring that cannot be created (`ENOMEM`,
    /// `EPERM`) is logged and replaced by an epoll set. Errors: `epoll_create1` failed
    /// (`EMFILE`, `ENOMEM`).
    pub fn new(choice: config::Readiness) -> io::Result<Reactor> {
        let ring = choice == config::Readiness::IoUring;
        let source = match ring.then(PollRing::new) {
            Some(Ok(r)) => Source::Ring(Box::new(r)),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot create the readiness ring; using an epoll set");
                Reactor::epoll()?
            }
            None => Reactor::epoll()?,
        };
        Ok(Reactor { source, ready: Vec::new(), waker: None })
    }

    fn epoll() -> io::Result<Source> {
        // SAFETY: plain system call; the descriptor it returns is owned below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let epoll = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
        Ok(Source::Epoll { epoll, events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT] })
    }

    /// The source's name, as `io.readiness` spells it: `io_uring` or `epoll`.
    pub fn kind(&self) -> &'static str {
        match self.source {
            Source::Ring(_) => "io_uring",
            Source::Epoll { .. } => "epoll",
        }
    }

    /// Whether the source is a ring with deferred task work (`IORING_SETUP_DEFER_TASKRUN`,
    /// Linux 6.1: a socket's wake-up only queues work that the reactor runs when it drains).
    pub fn deferred(&self) -> bool {
        matches!(&self.source, Source::Ring(r) if r.deferred())
    }

    /// Registers the socket `fd` of connection `id` (input, output, half-close). Errors: the
    /// registration failed (`ENOSPC`: `fs.epoll.max_user_watches` reached, `ENOMEM`, `EBUSY`
    /// with the ring's completions overflowing).
    pub fn register(&mut self, fd: RawFd, id: ConnId) -> io::Result<()> {
        match &mut self.source {
            Source::Ring(r) => r.register(fd, token(id)),
            Source::Epoll { epoll, .. } => {
                let mut ev = libc::epoll_event { events: INTEREST, u64: token(id) };
                // SAFETY: both descriptors are open; `ev` is valid for the call.
                if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }
        }
    }

    /// Releases the registration of connection `id`, whose socket the caller closes next: a
    /// ring's multishot poll is cancelled (it holds a reference to the socket, which would
    /// otherwise stay open). An epoll registration needs no call: closing the only descriptor
    /// of a socket removes it from every epoll set (epoll(7), "Q6"), and the core never
    /// duplicates one, so the `EPOLL_CTL_DEL` would be one more system call per connection for
    /// nothing. A report already taken for the old socket names its [`ConnId`], whose
    /// generation no later connection in that slot shares.
    pub fn deregister(&mut self, id: ConnId) {
        if let Source::Ring(r) = &mut self.source {
            r.deregister(token(id));
        }
    }

    /// Lists `id` (record `c`) for the reactor's next pass, once, and wakes the reactor.
    pub fn schedule(&mut self, id: ConnId, c: &mut Conn) {
        if c.io.has(IoFlags::READY) {
            return;
        }
        c.io.set(IoFlags::READY);
        self.ready.push(id);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Takes what is ready without blocking into `out` (cleared first); returns whether more
    /// may be ready ([`EVENTS_PER_WAIT`] taken). An `epoll_wait` error other than `EINTR`
    /// (which cannot happen with a valid set) counts as nothing ready.
    fn take(&mut self, out: &mut Vec<Report>) -> bool {
        let (epoll, events) = match &mut self.source {
            Source::Ring(r) => return r.drain(out, EVENTS_PER_WAIT),
            Source::Epoll { epoll, events } => (epoll, events),
        };
        out.clear();
        let n = loop {
            // SAFETY: `events` is valid for `len` entries; a zero timeout never blocks.
            let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, 0) };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                tracing::warn!(error = %e, "epoll_wait failed");
                break 0;
            }
        };
        // Copied out: the kernel's struct is packed.
        out.extend(events[..n].iter().map(|ev| Report { token: ev.u64, bits: ev.events, ended: false }));
        n == events.len()
    }

    /// Submits what the ring's submission queue kept (a submit that met `EAGAIN`/`EBUSY`).
    fn submit_pending(&mut self) {
        if let Source::Ring(r) = &mut self.source {
            if r.has_unsubmitted() {
                if let Err(e) = r.submit() {
                    tracing::warn!(error = %e, "readiness ring submit failed");
                }
            }
        }
    }

    /// A handle the core's monoio runtime can await readability on (readable: a report waits
    /// in the ring or an event in the set). monoio awaits readiness only on its own socket
    /// types, so a duplicate of the source's descriptor is wrapped as one; no socket call is
    /// ever made on it (both are pollable like a socket: `POLLIN` while something is ready).
    /// Errors: the descriptor cannot be duplicated or registered with the driver.
    fn handle(&self) -> io::Result<monoio::net::UnixStream> {
        let fd = match &self.source {
            Source::Ring(r) => r.fd(),
            Source::Epoll { epoll, .. } => epoll.as_raw_fd(),
        };
        // SAFETY: the source's descriptor is open while the reactor lives; the borrow ends here.
        let dup = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
        monoio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(dup))
    }
}

/// Whether the reads of `id` are held now: answers owed on `/echo` or HTTP (not bounded by
/// the queue limits, so a peer that never reads them must not make us read more), a request
/// awaiting another core, or a publisher while the server is overloaded (listed in the core's
/// held list, which the clock releases when the overload clears).
pub(super) fn read_held(st: &mut CoreState, id: ConnId) -> bool {
    let Some(c) = st.conns.get(id) else { return true };
    let http = matches!(c.session.state(), State::Http(_));
    let owed = c.io.has(IoFlags::WANT_WRITE) && (c.session.is_echo() || http);
    if owed || c.session.awaiting().is_some() {
        return true;
    }
    if c.io.has(IoFlags::PUBLISHER) && st.router.overloaded() {
        if !c.io.has(IoFlags::HELD) {
            c.io.set(IoFlags::HELD);
            st.conns.held.push(id);
            // The clock checks every tick whether the overload cleared.
            super::tick::nudge();
        }
        return true;
    }
    false
}

/// Readiness `bits` (`EPOLL*`) reported for connection `id`; `ended`: the ring's poll of the
/// connection ended with this report and is armed again (a connection whose poll cannot be
/// armed again is ended as reset: it would never be read again). A stale event (the
/// connection is gone, or its slab key was reused: another generation) is ignored.
fn on_event(st: &mut CoreState, id: ConnId, bits: u32, ended: bool) {
    let Some(c) = st.conns.get(id) else { return };
    if ended {
        let fd = c.fd;
        if let Err(e) = st.reactor.register(fd, id) {
            tracing::warn!(fd, error = %e, "cannot arm a socket's poll again; closing it");
            st.end(id, ReapReason::Reset);
            service(st, id);
            return;
        }
    }
    let Some(c) = st.conns.get(id) else { return };
    let broken = bits & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
    if broken || bits & libc::EPOLLRDHUP as u32 != 0 {
        // The peer's FIN (or an error) may come in the same report as its last bytes.
        c.io.set(IoFlags::INPUT_ENDED);
        c.io.set(IoFlags::READ_PENDING);
    } else if bits & libc::EPOLLIN as u32 != 0 {
        c.io.set(IoFlags::READ_PENDING);
    }
    if (broken || bits & libc::EPOLLOUT as u32 != 0) && c.io.has(IoFlags::WANT_WRITE) {
        c.io.clear(IoFlags::WANT_WRITE);
        // A broken socket fails the write, which reaps the connection.
        st.flush(id);
        // Pipelined requests wait while their answers do not drain.
        st.resume_http(id);
    }
    service(st, id);
}

/// Does what connection `id` is waiting for: reads pending input unless its reads are held,
/// and tears it down once its session is over.
fn service(st: &mut CoreState, id: ConnId) {
    let Some(c) = st.conns.get(id) else { return };
    c.io.clear(IoFlags::READY);
    if !c.session.is_closed() && c.io.has(IoFlags::READ_PENDING) && !read_held(st, id) {
        if let Some(c) = st.conns.get(id) {
            c.io.clear(IoFlags::READ_PENDING);
        }
        st.on_readable(id);
    }
    if st.conns.get(id).is_some_and(|c| c.session.is_closed()) {
        st.teardown(id);
    }
}

/// Serves the readiness of one core's connections until the runtime stops: one task for all
/// of them. Between passes with work left (a full batch of events, connections to revisit) it
/// yields, so the processor and the clock run.
pub async fn run(core: Rc<RefCell<CoreState>>) {
    let handle = match core.borrow().reactor.handle() {
        Ok(h) => h,
        Err(e) => {
            // Without it no connection of this core is served; accepting goes on, and the
            // handshake deadlines reap them.
            tracing::error!(core = core.borrow().me, error = %e, "cannot await the core's readiness source");
            return;
        }
    };
    let mut reports = Vec::with_capacity(EVENTS_PER_WAIT);
    let mut readable = pin!(handle.readable(false));
    // A full batch was taken: more may be ready without a new edge of the set.
    let mut more = false;
    loop {
        // Whether the set's readiness fired (then its wait is armed again), and whether to take
        // events from it on this pass.
        let (fired, take) = if more {
            (false, true)
        } else {
            let fired = poll_fn(|cx| {
                if let Poll::Ready(r) = readable.as_mut().poll(cx) {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "waiting on the core's readiness source failed");
                    }
                    return Poll::Ready(true);
                }
                let mut st = core.borrow_mut();
                if !st.reactor.ready.is_empty() {
                    return Poll::Ready(false);
                }
                if !st.reactor.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    st.reactor.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            })
            .await;
            (fired, fired)
        };
        if fired {
            readable.set(handle.readable(false));
        }
        let busy = {
            let mut guard = core.borrow_mut();
            let st = &mut *guard;
            more = false;
            if take {
                more = st.reactor.take(&mut reports);
                for r in &reports {
                    on_event(st, conn_of(r.token), r.bits, r.ended);
                }
            }
            let mut ready = std::mem::take(&mut st.reactor.ready);
            for &id in &ready {
                service(st, id);
            }
            if st.reactor.ready.is_empty() {
                // Given back to keep its capacity.
                ready.clear();
                st.reactor.ready = ready;
            }
            st.reactor.submit_pending();
            more || !st.reactor.ready.is_empty()
        };
        if busy {
            yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_carries_slab_key_and_generation() {
        for id in [ConnId { key: 0, gen: 0 }, ConnId { key: 7, gen: u32::MAX }, ConnId { key: u32::MAX, gen: 1 }] {
            assert_eq!(conn_of(token(id)), id);
        }
    }
}
