//! The io_uring readiness source of one core: a ring of the core's own on which every socket
//! of the core holds one multishot poll (`IORING_OP_POLL_ADD` with `IORING_POLL_ADD_MULTI`,
//! Linux 5.13), whose user data is the connection's slab key + generation
//! (docs/architecture.md, "Readiness").
//!
//! A multishot poll stays armed and posts a completion each time the socket's wait queue is
//! woken with an event it asked for (input, output, the peer's half-close, an error), carrying
//! the mask that holds then: the same reports as an edge-triggered epoll registration. The
//! kernel may end a multishot poll (a completion without `IORING_CQE_F_MORE`, e.g. when the
//! completion queue overflowed); [`PollRing::drain`] says so and the caller arms it again with
//! [`PollRing::register`], whose first check reports what holds at once, so no edge is lost.
//!
//! A poll request holds a reference to its socket, so closing the descriptor alone would not
//! release the socket: [`PollRing::deregister`] cancels the poll (`IORING_OP_ASYNC_CANCEL`, by
//! user data; not `IORING_OP_POLL_REMOVE`, which fails while the poll's task work is queued)
//! and submits it at once, before the caller closes the descriptor.
//!
//! A poll's completion is posted by task work in the core's thread. Where the kernel allows it
//! (Linux 6.1), the ring defers that work (`IORING_SETUP_DEFER_TASKRUN` with
//! `IORING_SETUP_SINGLE_ISSUER`): a socket's wake-up only queues it, and [`PollRing::drain`]
//! runs all of it in one `io_uring_enter(IORING_ENTER_GETEVENTS)`; the ring signals an eventfd
//! when work is queued into an empty list, and the core's monoio runtime awaits that eventfd.
//! Elsewhere the work interrupts the thread once per wake-up, and the runtime awaits the ring's
//! own descriptor (readable while completions wait). Both are awaited on either monoio driver.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

/// Submission queue entries. Registrations and removals are submitted as they are made, so
/// the queue holds only what one `io_uring_enter` could not take; when it is full it is
/// submitted before the next entry is written.
const SQ_ENTRIES: u32 = 256;

/// Completion queue entries (16 B each, so 512 KiB per core): room for one report from each of
/// 32,768 connections between two drains. Past it the kernel keeps completions on its overflow
/// list, or ends a multishot poll, which the reactor arms again.
const CQ_ENTRIES: u32 = 32_768;

/// User data of the removals, whose completions are posted only on failure (the poll had
/// ended already) and ignored. No connection has it: slab keys stay far below `u32::MAX`.
pub const REMOVE: u64 = u64::MAX;

/// `IORING_ENTER_GETEVENTS`: run queued task work and reap completions.
const GETEVENTS: u32 = 1;

/// Interest of every poll: input, output, the peer's half-close (errors and hang-ups are
/// always reported).
const INTEREST: u32 = (libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP) as u32;

/// One readiness report taken from the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// The poll's user data: the connection's token.
    pub token: u64,
    /// The ready mask (`POLL*`, same bits as `EPOLL*`); 0 when the poll failed.
    pub bits: u32,
    /// The poll ended with this report (no `IORING_CQE_F_MORE`): arm it again if the
    /// connection lives.
    pub ended: bool,
}

/// A core's readiness ring (see the module docs). Used from its core's thread only.
pub struct PollRing {
    ring: IoUring,
    /// The eventfd the ring signals when a completion's work is queued, with deferred task
    /// work (`IORING_SETUP_DEFER_TASKRUN`, Linux 6.1); `None` on a ring without it.
    wake: Option<OwnedFd>,
}

impl PollRing {
    /// A ring of `SQ_ENTRIES` submission and `CQ_ENTRIES` completion entries. Errors are
    /// those of `io_uring_setup(2)`: `ENOMEM`, `EPERM` / `ENOSYS` (io_uring disabled by
    /// `kernel.io_uring_disabled`, seccomp or an old kernel); the core then uses an epoll set.
    pub fn new() -> io::Result<PollRing> {
        PollRing::with_sizes(SQ_ENTRIES, CQ_ENTRIES)
    }

    fn with_sizes(sq: u32, cq: u32) -> io::Result<PollRing> {
        // Deferred task work: a socket's wake-up only queues the poll's work, and the core runs
        // all of it in one `io_uring_enter` when it drains ([`PollRing::drain`]), instead of
        // being interrupted once per wake-up to post each completion. The ring signals an
        // eventfd when work is queued, and that is what the core awaits.
        let deferred = IoUring::builder().setup_cqsize(cq).setup_single_issuer().setup_defer_taskrun().build(sq);
        if let Ok(ring) = deferred {
            // SAFETY: plain system call; the descriptor it returns is owned below.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd >= 0 {
                // SAFETY: `fd` is a fresh descriptor that nothing else owns.
                let wake = unsafe { OwnedFd::from_raw_fd(fd) };
                if ring.submitter().register_eventfd(fd).is_ok() {
                    return Ok(PollRing { ring, wake: Some(wake) });
                }
            }
        }
        let ring = IoUring::builder().setup_cqsize(cq).build(sq)?;
        Ok(PollRing { ring, wake: None })
    }

    /// The descriptor to await: readable while completions (or their queued work) wait.
    pub fn fd(&self) -> RawFd {
        self.wake.as_ref().map_or(self.ring.as_raw_fd(), |w| w.as_raw_fd())
    }

    /// Whether the ring defers its task work to [`PollRing::drain`] (Linux 6.1).
    pub fn deferred(&self) -> bool {
        self.wake.is_some()
    }

    /// Arms a multishot poll on socket `fd` with user data `token` and submits it. Errors: the
    /// submission failed (`ENOMEM`, `EBUSY` while the kernel's overflow list is full); the
    /// entry is then dropped and nothing is armed.
    pub fn register(&mut self, fd: RawFd, token: u64) -> io::Result<()> {
        let sqe = opcode::PollAdd::new(types::Fd(fd), INTEREST).multi(true).build().user_data(token);
        self.push(&sqe)?;
        self.submit()
    }

    /// Cancels the poll with user data `token` and submits the cancellation, so the socket is
    /// released when its descriptor is closed (at once, or at the next drain when the poll's
    /// task work was queued). A failure is logged: the poll then ends when
    /// the ring is dropped, and its reports are ignored as stale.
    pub fn deregister(&mut self, token: u64) {
        // A cancellation, not `IORING_OP_POLL_REMOVE`: a removal fails (`EALREADY`) while the
        // poll's own task work is queued (a wake-up since the last drain, such as the output
        // edge of an ACK), and the poll would then stay armed for good, holding the socket
        // open after its descriptor is closed (no FIN, the peer's side in `FIN_WAIT2`). A
        // cancellation marks such a poll, and its task work ends it at the next drain.
        let sqe = opcode::AsyncCancel::new(token).build().user_data(REMOVE).flags(squeue::Flags::SKIP_SUCCESS);
        if let Err(e) = self.push(&sqe).and_then(|()| self.submit()) {
            tracing::warn!(error = %e, "cannot remove a socket's poll from the readiness ring");
        }
    }

    /// Writes `sqe` into the submission queue, submitting what is there first when it is full.
    fn push(&mut self, sqe: &squeue::Entry) -> io::Result<()> {
        for _ in 0..2 {
            // SAFETY: poll entries point at no user memory; the socket stays open until its
            // poll is removed (`deregister` comes before the close).
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            self.submit()?;
        }
        Err(io::Error::new(io::ErrorKind::WouldBlock, "readiness ring's submission queue stays full"))
    }

    /// Submits what the queue holds without waiting. Retries `EINTR`; `EAGAIN` / `EBUSY`
    /// leave the entries queued for the next submit and count as success.
    pub fn submit(&mut self) -> io::Result<()> {
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether entries wait in the submission queue (a submit left them there).
    pub fn has_unsubmitted(&mut self) -> bool {
        !self.ring.submission().is_empty()
    }

    /// Moves up to `max` reports into `out` (cleared first), skipping the removals' own
    /// completions; returns whether more may wait (`max` taken).
    pub fn drain(&mut self, out: &mut Vec<Report>, max: usize) -> bool {
        out.clear();
        if let Some(wake) = &self.wake {
            // Reset the signal first: work queued from here on signals it again.
            let mut count = [0u8; 8];
            // SAFETY: reads 8 bytes into `count` from the owned, non-blocking eventfd.
            let _ = unsafe { libc::read(wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
            // Run the queued work, which posts the completions (and submits anything queued).
            let pending = self.ring.submission().len() as u32;
            // SAFETY: no argument is passed; entries queued point at no user memory.
            if let Err(e) = unsafe { self.ring.submitter().enter::<libc::sigset_t>(pending, 0, GETEVENTS, None) } {
                if e.kind() != io::ErrorKind::Interrupted
                    && !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY))
                {
                    tracing::warn!(error = %e, "readiness ring: io_uring_enter failed");
                }
            }
        }
        let mut taken = 0;
        for cqe in self.ring.completion() {
            taken += 1;
            let token = cqe.user_data();
            if token != REMOVE {
                let res = cqe.result();
                let bits = if res >= 0 { res as u32 } else { 0 };
                out.push(Report { token, bits, ended: !cqueue::more(cqe.flags()) });
            }
            if taken == max {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};

    /// Drains until a report for `token` arrives, within 5 s (reports for other tokens are
    /// dropped).
    fn report_for(ring: &mut PollRing, token: u64) -> Report {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut out = Vec::new();
        while Instant::now() < deadline {
            ring.drain(&mut out, 64);
            if let Some(r) = out.iter().find(|r| r.token == token) {
                return *r;
            }
            // Completions are posted by task work that runs on the next kernel entry.
            let _ = ring.ring.submit_and_wait(0);
            std::thread::yield_now();
        }
        panic!("no report for token {token} within 5 s");
    }

    #[test]
    fn multishot_poll_reports_each_arrival_and_ends_on_removal() {
        let Ok(mut ring) = PollRing::new() else { return };
        let (a, mut b) = UnixStream::pair().unwrap();
        ring.register(a.as_raw_fd(), 7).unwrap();
        // Writable at once: the first check reports what holds.
        let first = report_for(&mut ring, 7);
        assert!(first.bits & libc::POLLOUT as u32 != 0 && !first.ended, "{first:?}");
        b.write_all(b"x").unwrap();
        let second = report_for(&mut ring, 7);
        assert!(second.bits & libc::POLLIN as u32 != 0 && !second.ended, "{second:?}");
        b.write_all(b"y").unwrap();
        let third = report_for(&mut ring, 7);
        assert!(third.bits & libc::POLLIN as u32 != 0, "still armed: {third:?}");
        ring.deregister(7);
        let last = report_for(&mut ring, 7);
        assert!(last.ended, "removal ends the poll: {last:?}");
    }

    #[test]
    fn an_overflowed_poll_ends_and_arming_it_again_reports_what_holds() {
        let Ok(mut ring) = PollRing::with_sizes(4, 8) else { return };
        let pairs: Vec<_> = (0..64).map(|_| UnixStream::pair().unwrap()).collect();
        for (i, (a, _)) in pairs.iter().enumerate() {
            ring.register(a.as_raw_fd(), i as u64).unwrap();
        }
        // 64 first reports into a completion queue of 8: the kernel ends the polls it cannot
        // report on (their last report goes to its overflow list).
        let mut ended = std::collections::HashSet::new();
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.len() < pairs.len() && Instant::now() < deadline {
            let _ = ring.ring.submit_and_wait(0);
            ring.drain(&mut out, 1024);
            for r in &out {
                seen.insert(r.token);
                if r.ended {
                    ended.insert(r.token);
                }
            }
        }
        assert_eq!(seen.len(), pairs.len(), "every socket reported once at least");
        assert!(!ended.is_empty(), "an overflowing completion queue ends some multishot polls");
        // Arm the ended ones again, with data already waiting: reported at once.
        for &t in &ended {
            let (a, b) = &pairs[t as usize];
            (&*b).write_all(b"z").unwrap();
            ring.register(a.as_raw_fd(), t + 1000).unwrap();
        }
        let mut readable = std::collections::HashSet::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while readable.len() < ended.len() && Instant::now() < deadline {
            let _ = ring.ring.submit_and_wait(0);
            ring.drain(&mut out, 1024);
            readable.extend(
                out.iter().filter(|r| r.token >= 1000 && r.bits & libc::POLLIN as u32 != 0).map(|r| r.token - 1000),
            );
        }
        assert_eq!(readable, ended, "every poll armed again reports the waiting input");
    }

    /// Many sockets woken at once: whatever one drain leaves (the kernel runs at most about 20
    /// items of deferred task work per `io_uring_enter`, Linux 6.13) is either taken by that
    /// drain or still signalled on the descriptor the core awaits, so no report waits unseen.
    #[test]
    fn a_burst_of_wake_ups_is_drained_or_signalled() {
        let Ok(mut ring) = PollRing::new() else { return };
        let pairs: Vec<_> = (0..200).map(|_| UnixStream::pair().unwrap()).collect();
        for (i, (a, _)) in pairs.iter().enumerate() {
            ring.register(a.as_raw_fd(), i as u64).unwrap();
        }
        let mut out = Vec::new();
        // The first reports (writable), until none comes for 100 ms.
        let mut quiet = Instant::now();
        while quiet.elapsed() < Duration::from_millis(100) {
            ring.drain(&mut out, 1024);
            if !out.is_empty() {
                quiet = Instant::now();
            }
        }
        for (_, b) in &pairs {
            (&*b).write_all(b"x").unwrap();
        }
        let mut seen = std::collections::HashSet::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.len() < pairs.len() {
            assert!(Instant::now() < deadline, "{} of {} reports seen", seen.len(), pairs.len());
            // Drain only when the awaited descriptor says so, as the reactor does.
            let mut pfd = libc::pollfd { fd: ring.fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
            assert_eq!(n, 1, "reports left unsignalled: {} of {} seen", seen.len(), pairs.len());
            ring.drain(&mut out, 1024);
            seen.extend(out.iter().filter(|r| r.bits & libc::POLLIN as u32 != 0).map(|r| r.token));
        }
    }

    /// A poll whose task work is queued when it is removed (a wake-up since the last drain)
    /// still releases its socket: after the removal, the close and the next drains, the peer
    /// reads EOF. (`IORING_OP_POLL_REMOVE` fails on such a poll and left it armed for good.)
    #[test]
    fn a_poll_removed_with_its_work_queued_releases_the_socket() {
        let Ok(mut ring) = PollRing::new() else { return };
        if !ring.deferred() {
            return;
        }
        let (a, mut b) = UnixStream::pair().unwrap();
        ring.register(a.as_raw_fd(), 9).unwrap();
        assert!(report_for(&mut ring, 9).bits & libc::POLLOUT as u32 != 0);
        // A wake-up whose work waits for the next drain.
        b.write_all(b"x").unwrap();
        ring.deregister(9);
        drop(a);
        let mut out = Vec::new();
        for _ in 0..3 {
            ring.drain(&mut out, 64);
        }
        b.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut byte = [0u8; 1];
        // Released: EOF, or a reset for the byte it left unread; a timeout means still open.
        match std::io::Read::read(&mut b, &mut byte) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("the removed poll still holds the socket: {other:?}"),
        }
    }
}
