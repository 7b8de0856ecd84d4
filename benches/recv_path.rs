//! The receive path alone (docs/architecture.md, "Readiness"): CPU time of the receiving
//! thread per small message on N loopback connections, learning readiness from an
//! edge-triggered epoll set (`io.readiness = "epoll"`) or from the core's readiness ring
//! (`server::io::poll_ring`, `io.readiness = "io_uring"`), each followed by `recv(2)` into one
//! scratch buffer, against one multishot `IORING_OP_RECV` per socket drawing on a ring of
//! provided buffers (the kernel picks a buffer only when data arrives).
//!
//! `cargo bench --bench recv_path`. Env: RECV_CONNS (2000 connections), RECV_PASSES (20 passes
//! over every connection per measurement), RECV_FRAME (`8,100`: frame sizes in bytes, a pong
//! and about a 64-byte `msg`), RECV_BUFS (1024 provided buffers, a power of two up to 32,768),
//! RECV_BUF_SIZE (4096 bytes per buffer), RECV_ROUNDS (3). Each round measures the three paths,
//! alternating, on the same connections, for each frame size.
//!
//! Pacing: a sender thread writes one frame to every connection in turn (a pass), then waits
//! until the receiver has consumed the whole pass before it starts the next. So the receiver is
//! woken while a pass arrives, for one or a few messages at a time (the table gives messages
//! per wake-up), never for a backlog of many passes. Receiver and sender are pinned to two
//! different CPUs when the process may use two.
//!
//! The figure is the receiving thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`) divided by the
//! messages, from its first wait to the last message of the last pass; registering the sockets
//! and tearing the registrations down are outside it. On loopback the sender's thread does the
//! TCP receive processing and the wake-up of the receiving socket's waiters (the epoll
//! callback, the queuing of the ring's task work), so that cost is in the sender's figure,
//! given beside; the ring's task work itself (the poll's report, the multishot's copy into a
//! buffer) runs in the receiver's thread and is in its figure.
//!
//! How each path reads and waits:
//! - `epoll`: `epoll_wait` (server's interest, edge-triggered), then per input report `recv`
//!   into the 64 KiB scratch buffer until a short read, as `CoreState::on_readable` does: on
//!   TCP a short read emptied the socket, so a later arrival is a new edge. An 8- or 100-byte
//!   frame takes one `recv` per report.
//! - `poll_ring`: `poll(2)` on `PollRing::fd`, then `PollRing::drain` and the same `recv`s; an
//!   ended poll is armed again first, as the reactor does. `poll(2)` stands for the core's
//!   runtime awaiting that descriptor; the ring has no blocking wait of its own.
//! - `recv_multishot`: `io_uring_enter` waiting for one completion (with a timeout), each
//!   completion's bytes read from its provided buffer, which goes back to the buffer ring after;
//!   a completion without `IORING_CQE_F_MORE` (e.g. `ENOBUFS`: the buffer ring ran empty) arms
//!   the socket's receive again. In the server this ring would be awaited through the core's
//!   runtime like the readiness ring (an eventfd: one more `poll` and `read` per wake-up), so
//!   its figure here is low by that wait.

use std::alloc::{self, Layout};
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::time::Duration;

use io_uring::{cqueue, opcode, types, IoUring};
use serde_json::json;
use tether::server::core::SCRATCH_BYTES;
use tether::server::io as sock;
use tether::server::io::poll_ring::{PollRing, Report};
use tether::server::reactor::EVENTS_PER_WAIT;

mod common;
use common::*;

/// The paths, in the order each round measures them.
const PATHS: [&str; 3] = ["epoll", "poll_ring", "recv_multishot"];

/// The byte every frame is made of; the receiver checks each byte it is handed.
const FILL: u8 = b'x';

/// Longest single wait of the receiver, in milliseconds.
const WAIT_MS: u64 = 1000;

/// Empty waits in a row (of [`WAIT_MS`] each) after which a measurement fails.
const STALL_WAITS: u32 = 10;

/// How long the sender waits for the receiver to consume a pass.
const PASS_LIMIT: Duration = Duration::from_secs(10);

/// Interest of every epoll registration: the server's (src/server/reactor.rs).
const EPOLL_INTEREST: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

/// Report bits that send a path to `recv`: input, the peer's half-close, an error (the `POLL*`
/// and `EPOLL*` values are the same).
const INPUT: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLERR | libc::EPOLLHUP) as u32;

/// Submission entries of the multishot ring: arming 2,000 sockets submits as it fills.
const SQ_ENTRIES: u32 = 256;

/// Completion entries of the multishot ring (16 B each), as the readiness ring's: more than a
/// pass's messages can post between two reaps.
const CQ_ENTRIES: u32 = 32_768;

/// The buffer group of the provided-buffer ring.
const BGID: u16 = 0;

/// The first two CPUs this process may run on (receiver, sender); `None` with fewer.
fn two_cpus() -> Option<(usize, usize)> {
    // SAFETY: cpu_set_t is plain data, filled by sched_getaffinity for this process.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is valid for its size.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return None;
    }
    // SAFETY: CPU_ISSET reads the set for CPU numbers below CPU_SETSIZE.
    let mut cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) });
    Some((cpus.next()?, cpus.next()?))
}

/// The receiver's count: bytes per connection and of the pass under way, wake-ups, re-arms.
/// Tells the sender when a pass is consumed.
struct Tally {
    /// Bytes received per connection.
    got: Vec<u64>,
    /// Bytes received of the pass under way.
    pass_bytes: usize,
    /// Bytes of a pass: connections × frame.
    pass_size: usize,
    /// Passes consumed, of `passes`.
    pass: usize,
    passes: usize,
    /// The sender's signal: one per consumed pass.
    consumed: SyncSender<()>,
    /// Waits in a row that returned nothing.
    idle: u32,
    counts: Counts,
}

/// What a path did besides receiving.
#[derive(Clone, Copy, Default)]
struct Counts {
    /// Waits that returned something.
    wakes: u64,
    /// Polls or receives armed again after they ended (no `IORING_CQE_F_MORE`).
    rearms: u64,
    /// Multishot completions with `ENOBUFS` (the buffer ring was empty).
    enobufs: u64,
    /// Most provided buffers held at once (all are given back after each wake-up).
    peak_bufs: u64,
}

impl Tally {
    fn new(conns: usize, frame: usize, passes: usize, consumed: SyncSender<()>) -> Tally {
        let (got, pass_size, counts) = (vec![0; conns], conns * frame, Counts::default());
        Tally { got, pass_bytes: 0, pass_size, pass: 0, passes, consumed, idle: 0, counts }
    }

    /// Bytes `data` read from connection `conn`: checked and counted.
    fn take(&mut self, conn: usize, data: &[u8]) {
        assert!(data.iter().all(|&b| b == FILL), "connection {conn}: a byte that was not sent");
        self.got[conn] += data.len() as u64;
        self.pass_bytes += data.len();
        assert!(self.pass_bytes <= self.pass_size, "pass {}: more bytes than were sent", self.pass);
        if self.pass_bytes == self.pass_size {
            self.pass += 1;
            self.pass_bytes = 0;
            // The channel holds a signal per pass, so this never blocks; a sender that is gone
            // has failed, and the scope reports its panic.
            let _ = self.consumed.send(());
        }
    }

    /// Whether the last pass is consumed.
    fn done(&self) -> bool {
        self.pass == self.passes
    }

    /// One wait of `path` returned, with something (`woke`) or nothing within [`WAIT_MS`];
    /// panics after [`STALL_WAITS`] empty waits in a row.
    fn waited(&mut self, path: &str, woke: bool) {
        if woke {
            self.counts.wakes += 1;
            self.idle = 0;
            return;
        }
        self.idle += 1;
        assert!(
            self.idle < STALL_WAITS,
            "{path}: nothing received for {} ms in pass {} of {} ({} of its {} bytes)",
            u64::from(self.idle) * WAIT_MS,
            self.pass + 1,
            self.passes,
            self.pass_bytes,
            self.pass_size
        );
    }
}

/// Reads connection `conn` (socket `fd`) as the core does (`CoreState::on_readable`): `recv`
/// into `scratch` until a short read (the socket is empty: a later arrival is a new edge) or
/// `EAGAIN`.
fn read_ready(fd: RawFd, conn: usize, scratch: &mut [u8], tally: &mut Tally) {
    loop {
        match sock::recv(fd, scratch) {
            Ok(0) => panic!("connection {conn}: EOF"),
            Ok(n) => {
                tally.take(conn, &scratch[..n]);
                if n < scratch.len() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("connection {conn}: recv: {e}"),
        }
    }
}

/// Path `epoll`: one edge-triggered registration per socket (token: its index) in an epoll set.
struct EpollPath {
    epoll: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl EpollPath {
    /// Registers every socket of `rx` and takes the first reports (every socket is writable).
    fn new(rx: &[RawFd]) -> EpollPath {
        // SAFETY: plain system call; the descriptor is owned below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(fd >= 0, "epoll_create1: {}", io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        for (i, &s) in rx.iter().enumerate() {
            let mut ev = libc::epoll_event { events: EPOLL_INTEREST, u64: i as u64 };
            // SAFETY: both descriptors are open; the kernel reads `ev` during the call.
            let r = unsafe { libc::epoll_ctl(fd, libc::EPOLL_CTL_ADD, s, &mut ev) };
            assert_eq!(r, 0, "epoll_ctl(EPOLL_CTL_ADD): {}", io::Error::last_os_error());
        }
        let mut path = EpollPath { epoll, events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT] };
        for _ in 0..=rx.len() {
            if path.wait(0) == 0 {
                return path;
            }
        }
        panic!("epoll: the first reports do not stop coming");
    }

    /// `epoll_wait` for up to `ms` milliseconds: the events taken (0 on a timeout or `EINTR`).
    fn wait(&mut self, ms: i32) -> usize {
        let (fd, len) = (self.epoll.as_raw_fd(), self.events.len() as i32);
        // SAFETY: `events` is valid for `len` entries.
        let n = unsafe { libc::epoll_wait(fd, self.events.as_mut_ptr(), len, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            assert_eq!(e.kind(), io::ErrorKind::Interrupted, "epoll_wait: {e}");
            return 0;
        }
        n as usize
    }

    fn receive(&mut self, rx: &[RawFd], scratch: &mut [u8], tally: &mut Tally) {
        while !tally.done() {
            let n = self.wait(WAIT_MS as i32);
            tally.waited("epoll", n > 0);
            for ev in &self.events[..n] {
                // Copied out: the kernel's struct is packed.
                let (token, bits) = (ev.u64 as usize, ev.events);
                if bits & INPUT != 0 {
                    read_ready(rx[token], token, scratch, tally);
                }
            }
        }
    }
}

/// Path `poll_ring`: tether's readiness ring, one multishot poll per socket (token: its index),
/// used as the reactor uses it.
struct PollRingPath {
    ring: PollRing,
    reports: Vec<Report>,
    /// Sockets registered (tokens `0..conns`), removed again on drop.
    conns: usize,
}

impl PollRingPath {
    /// Arms a poll on every socket of `rx` and takes the first reports (every socket is
    /// writable).
    fn new(rx: &[RawFd]) -> PollRingPath {
        let mut ring = PollRing::new().expect("io_uring readiness ring");
        for (i, &s) in rx.iter().enumerate() {
            ring.register(s, i as u64).expect("arm a socket's poll");
        }
        let mut path = PollRingPath { ring, reports: Vec::with_capacity(EVENTS_PER_WAIT), conns: rx.len() };
        for _ in 0..=rx.len() {
            let ready = path.poll(0);
            let more = path.ring.drain(&mut path.reports, EVENTS_PER_WAIT);
            for r in &path.reports {
                if r.ended {
                    path.ring.register(rx[r.token as usize], r.token).expect("arm a socket's poll again");
                }
            }
            if !ready && !more && path.reports.is_empty() {
                return path;
            }
        }
        panic!("poll_ring: the first reports do not stop coming");
    }

    /// `poll(2)` on the ring's descriptor for up to `ms` milliseconds: whether it is readable
    /// (false on a timeout or `EINTR`).
    fn poll(&self, ms: i32) -> bool {
        let mut pfd = libc::pollfd { fd: self.ring.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            assert_eq!(e.kind(), io::ErrorKind::Interrupted, "poll: {e}");
            return false;
        }
        n > 0
    }

    fn receive(&mut self, rx: &[RawFd], scratch: &mut [u8], tally: &mut Tally) {
        // A full batch was taken: more may wait without a new signal.
        let mut more = false;
        while !tally.done() {
            if !more {
                let ready = self.poll(WAIT_MS as i32);
                tally.waited("poll_ring", ready);
                if !ready {
                    continue;
                }
            }
            more = self.ring.drain(&mut self.reports, EVENTS_PER_WAIT);
            for r in &self.reports {
                let conn = r.token as usize;
                if r.ended {
                    self.ring.register(rx[conn], r.token).expect("arm a socket's poll again");
                    tally.counts.rearms += 1;
                }
                if r.bits & INPUT != 0 {
                    read_ready(rx[conn], conn, scratch, tally);
                }
            }
        }
    }
}

impl Drop for PollRingPath {
    fn drop(&mut self) {
        for token in 0..self.conns as u64 {
            self.ring.deregister(token);
        }
    }
}

/// A ring of provided buffers (`IORING_REGISTER_PBUF_RING`): `count` buffers of `size` bytes,
/// and the ring of `count` 16-byte entries, page-aligned, through which they are handed to the
/// kernel. Its tail is ours to advance; the kernel advances the head as it takes buffers.
struct BufRing {
    entries: NonNull<types::BufRingEntry>,
    entries_layout: Layout,
    data: NonNull<u8>,
    data_layout: Layout,
    count: u16,
    size: usize,
    /// Our copy of the tail, published by [`BufRing::publish`].
    tail: u16,
    /// The kernel may still hold the memory (its unregistration failed): never free it.
    leak: bool,
}

impl BufRing {
    /// A ring with all its buffers in it. `count`: a power of two up to 32,768.
    fn new(count: u16, size: usize) -> BufRing {
        let entries_layout =
            Layout::from_size_align(usize::from(count) * std::mem::size_of::<types::BufRingEntry>(), 4096).unwrap();
        let data_layout = Layout::from_size_align(usize::from(count) * size, 4096).unwrap();
        // SAFETY: both layouts have a non-zero size (count and size are checked at start).
        let (entries, data) = unsafe { (alloc::alloc_zeroed(entries_layout), alloc::alloc_zeroed(data_layout)) };
        let entries = NonNull::new(entries.cast()).expect("allocate the buffer ring");
        let data = NonNull::new(data).expect("allocate the provided buffers");
        let mut ring = BufRing { entries, entries_layout, data, data_layout, count, size, tail: 0, leak: false };
        for bid in 0..count {
            ring.give_back(bid);
        }
        ring.publish();
        ring
    }

    /// Puts buffer `bid` back at the tail; the kernel sees it after [`BufRing::publish`].
    fn give_back(&mut self, bid: u16) {
        let slot = usize::from(self.tail & (self.count - 1));
        // SAFETY: `slot` < count; the kernel reads the entries only inside this thread's
        // `io_uring_enter` calls (the ring's task work runs in this thread), never while this
        // reference lives, and the slot past the tail holds no buffer the kernel may take.
        let entry = unsafe { &mut *self.entries.as_ptr().add(slot) };
        // SAFETY: `bid` < count, so the buffer lies inside `data`.
        entry.set_addr(unsafe { self.data.as_ptr().add(usize::from(bid) * self.size) } as u64);
        entry.set_len(self.size as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Publishes the tail: the buffers given back since are the kernel's to take.
    fn publish(&self) {
        // SAFETY: the tail is the aligned `u16` in the first entry's reserved field, which the
        // kernel reads atomically; the release store orders the entries written before it.
        unsafe {
            let tail = types::BufRingEntry::tail(self.entries.as_ptr()) as *mut u16;
            AtomicU16::from_ptr(tail).store(self.tail, Ordering::Release);
        }
    }

    /// The first `len` bytes of buffer `bid`, which a completion handed to us.
    fn read(&self, bid: u16, len: usize) -> &[u8] {
        assert!(bid < self.count && len <= self.size, "buffer {bid} with {len} bytes");
        // SAFETY: in bounds (checked); the kernel wrote the buffer before posting the
        // completion and takes it again only after `give_back`, once this borrow has ended.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr().add(usize::from(bid) * self.size), len) }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        if !self.leak {
            // SAFETY: allocated in `new` with these layouts; unregistered from the kernel.
            unsafe {
                alloc::dealloc(self.entries.as_ptr().cast(), self.entries_layout);
                alloc::dealloc(self.data.as_ptr(), self.data_layout);
            }
        }
    }
}

/// Path `recv_multishot`: a ring of its own with one multishot `IORING_OP_RECV` per socket
/// (user data: the socket's index), drawing on a provided-buffer ring.
struct MultishotPath {
    ring: IoUring,
    /// Dropped after the ring.
    bufs: BufRing,
    /// Whether the ring defers task work to our `io_uring_enter` (Linux 6.1).
    deferred: bool,
    /// Completions reaped in a pass: user data, result, flags.
    cqes: Vec<(u64, i32, u32)>,
    /// Sockets whose receive ended, to arm again.
    rearm: Vec<usize>,
}

impl MultishotPath {
    /// A ring like the readiness ring (deferred task work where the kernel has it), `count`
    /// buffers of `size` bytes, a receive armed on every socket of `rx`.
    fn new(rx: &[RawFd], count: u16, size: usize) -> MultishotPath {
        let builder = || {
            let mut b = IoUring::builder();
            b.setup_cqsize(CQ_ENTRIES);
            b
        };
        let (ring, deferred) = match builder().setup_single_issuer().setup_defer_taskrun().build(SQ_ENTRIES) {
            Ok(ring) => (ring, true),
            Err(_) => (builder().build(SQ_ENTRIES).expect("io_uring ring"), false),
        };
        let bufs = BufRing::new(count, size);
        let addr = bufs.entries.as_ptr() as u64;
        // SAFETY: the ring's memory lives in `bufs` until it is unregistered (`drop`).
        unsafe { ring.submitter().register_buf_ring(addr, count, BGID) }
            .expect("register the provided-buffer ring (Linux 5.19)");
        let mut path = MultishotPath { ring, bufs, deferred, cqes: Vec::new(), rearm: Vec::new() };
        for (i, &s) in rx.iter().enumerate() {
            path.arm(s, i);
        }
        path.ring.submit().expect("submit the receives");
        // Nothing was sent yet: a completion now is a receive that failed to arm.
        path.reap();
        if let Some(&(token, res, _)) = path.cqes.first() {
            panic!("recv_multishot: connection {token}: arming failed: {}", io::Error::from_raw_os_error(-res));
        }
        path
    }

    /// Queues a multishot receive on socket `fd` of connection `conn` (submitted with the next
    /// `io_uring_enter`).
    fn arm(&mut self, fd: RawFd, conn: usize) {
        let sqe = opcode::RecvMulti::new(types::Fd(fd), BGID).build().user_data(conn as u64);
        for _ in 0..2 {
            // SAFETY: the entry points at no memory of ours (buffers come from the group,
            // registered until `drop`); the socket stays open until after the ring is dropped.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return;
            }
            self.ring.submit().expect("submit");
        }
        panic!("recv_multishot: the submission queue stays full");
    }

    /// Moves the completions into `cqes` (cleared first).
    fn reap(&mut self) {
        self.cqes.clear();
        self.cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result(), c.flags())));
    }

    fn receive(&mut self, rx: &[RawFd], tally: &mut Tally) {
        let ts = types::Timespec::from(Duration::from_millis(WAIT_MS));
        let args = types::SubmitArgs::new().timespec(&ts);
        while !tally.done() {
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                // Timed out, interrupted, or completions wait on the overflow list: reap.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => {}
                Err(e) => panic!("recv_multishot: io_uring_enter: {e}"),
            }
            self.reap();
            tally.waited("recv_multishot", !self.cqes.is_empty());
            let held = self.cqes.iter().filter(|c| cqueue::buffer_select(c.2).is_some()).count() as u64;
            tally.counts.peak_bufs = tally.counts.peak_bufs.max(held);
            for &(token, res, flags) in &self.cqes {
                let conn = token as usize;
                if let Some(bid) = cqueue::buffer_select(flags) {
                    if res > 0 {
                        tally.take(conn, self.bufs.read(bid, res as usize));
                    }
                    self.bufs.give_back(bid);
                }
                match res {
                    1.. => {}
                    0 => panic!("connection {conn}: EOF"),
                    r if r == -libc::ENOBUFS => tally.counts.enobufs += 1,
                    r => panic!("connection {conn}: multishot recv: {}", io::Error::from_raw_os_error(-r)),
                }
                if !cqueue::more(flags) {
                    self.rearm.push(conn);
                }
            }
            // Buffers first: a receive armed again takes what waits in its socket at once.
            self.bufs.publish();
            while let Some(conn) = self.rearm.pop() {
                self.arm(rx[conn], conn);
                tally.counts.rearms += 1;
            }
        }
    }
}

impl Drop for MultishotPath {
    fn drop(&mut self) {
        // Every receive ends before the buffers are unregistered and freed (`ENOENT`: none
        // was armed).
        let any = types::CancelBuilder::any();
        let cancelled = match self.ring.submitter().register_sync_cancel(Some(Duration::from_secs(1).into()), any) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(e) => {
                eprintln!("recv_multishot: cannot cancel the receives ({e}); leaking the buffers");
                false
            }
        };
        let unregistered = match self.ring.submitter().unregister_buf_ring(BGID) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("recv_multishot: cannot unregister the buffer ring ({e}); leaking the buffers");
                false
            }
        };
        self.bufs.leak = !(cancelled && unregistered);
    }
}

/// One receiver of [`PATHS`], its sockets registered.
enum Path {
    Epoll(EpollPath),
    PollRing(PollRingPath),
    Multishot(MultishotPath),
}

/// What one measurement saw: the receiver's and the sender's CPU per message (µs; the
/// sender's covers the send, the loopback TCP processing and the receiver's wake-up), the
/// messages, the path's counts, and whether its ring defers task work (rings only).
struct Sample {
    rx_us: f64,
    tx_us: f64,
    msgs: u64,
    counts: Counts,
    deferred: Option<bool>,
}

/// Sends `frame` once to every socket of `tx` in turn, `passes` times, waiting after each pass
/// until the receiver has consumed it (up to [`PASS_LIMIT`]); this thread's CPU ns.
fn send_passes(tx: &[RawFd], frame: &[u8], passes: usize, consumed: Receiver<()>, cpu: Option<usize>) -> u64 {
    if let Some(cpu) = cpu {
        pin_to(cpu);
    }
    let t0 = thread_cpu_ns();
    for pass in 1..=passes {
        for &fd in tx {
            let n = sock::send(fd, &[IoSlice::new(frame)]).expect("sendmsg");
            assert_eq!(n, frame.len());
        }
        if let Err(e) = consumed.recv_timeout(PASS_LIMIT) {
            panic!("pass {pass} of {passes} not consumed within {PASS_LIMIT:?}: {e}");
        }
    }
    thread_cpu_ns() - t0
}

/// One measurement of `path`: `passes` passes of `frame` over every connection, sent by a
/// thread of its own and received by this one. `bufs`: the provided buffers (count, bytes).
fn measure(
    path: &str,
    (rx, tx): (&[RawFd], &[RawFd]),
    frame: &[u8],
    passes: usize,
    bufs: (u16, usize),
    cpus: Option<(usize, usize)>,
    scratch: &mut [u8],
) -> Sample {
    let mut receiver = match path {
        "epoll" => Path::Epoll(EpollPath::new(rx)),
        "poll_ring" => Path::PollRing(PollRingPath::new(rx)),
        _ => Path::Multishot(MultishotPath::new(rx, bufs.0, bufs.1)),
    };
    let deferred = match &receiver {
        Path::Epoll(_) => None,
        Path::PollRing(p) => Some(p.ring.deferred()),
        Path::Multishot(p) => Some(p.deferred),
    };
    let (tally, rx_ns, tx_ns) = std::thread::scope(|s| {
        // The tally owns the sending half: if this thread fails, the sender stops at once.
        let (consumed, done) = mpsc::sync_channel(passes);
        let mut tally = Tally::new(rx.len(), frame.len(), passes, consumed);
        let sender = s.spawn(move || send_passes(tx, frame, passes, done, cpus.map(|c| c.1)));
        let t0 = thread_cpu_ns();
        match &mut receiver {
            Path::Epoll(p) => p.receive(rx, scratch, &mut tally),
            Path::PollRing(p) => p.receive(rx, scratch, &mut tally),
            Path::Multishot(p) => p.receive(rx, &mut tally),
        }
        let rx_ns = thread_cpu_ns() - t0;
        (tally, rx_ns, sender.join().expect("sender thread"))
    });
    drop(receiver);
    let want = (passes * frame.len()) as u64;
    for (conn, &got) in tally.got.iter().enumerate() {
        assert_eq!(got, want, "{path}: connection {conn} received {got} of {want} bytes");
    }
    let msgs = (passes * rx.len()) as u64;
    Sample {
        rx_us: rx_ns as f64 / msgs as f64 / 1e3,
        tx_us: tx_ns as f64 / msgs as f64 / 1e3,
        msgs,
        counts: tally.counts,
        deferred,
    }
}

fn main() {
    if !should_run() {
        return;
    }
    let conns: usize = env_or("RECV_CONNS", 2000);
    let passes: usize = env_or("RECV_PASSES", 20);
    let frames = env_list("RECV_FRAME", "8,100");
    let count: usize = env_or("RECV_BUFS", 1024);
    let buf_size: usize = env_or("RECV_BUF_SIZE", 4096);
    let rounds: usize = env_or("RECV_ROUNDS", 3);
    assert!(count.is_power_of_two() && count <= 32_768, "RECV_BUFS: a power of two up to 32768, not {count}");
    assert!(buf_size > 0 && !frames.contains(&0), "RECV_BUF_SIZE and RECV_FRAME: bytes, above 0");
    if let Err(e) = tether::server::raise_nofile() {
        eprintln!("cannot raise RLIMIT_NOFILE ({e}); {conns} connections need {} descriptors", 2 * conns);
    }
    let cpus = two_cpus();
    if let Some((receiver, _)) = cpus {
        pin_to(receiver);
    }
    let (tx, rx) = loopback_pairs(conns);
    let tx_fds: Vec<RawFd> = tx.iter().map(|s| s.as_raw_fd()).collect();
    let rx_fds: Vec<RawFd> = rx.iter().map(|s| s.as_raw_fd()).collect();
    let mut scratch = vec![0u8; SCRATCH_BYTES];
    let bufs = (count as u16, buf_size);
    // The buffers and the ring's entries: per ring (per core), whatever the connection count.
    let ring_bytes = count * (buf_size + std::mem::size_of::<types::BufRingEntry>());
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    // Per frame size and path: the receiver's µs per message and the ratio to epoll, per round.
    let mut us = vec![vec![Vec::new(); PATHS.len()]; frames.len()];
    let mut ratios = vec![vec![Vec::new(); PATHS.len()]; frames.len()];
    for round in 1..=rounds {
        for (f, &size) in frames.iter().enumerate() {
            let frame = vec![FILL; size];
            let mut epoll_us = f64::NAN;
            for (p, path) in PATHS.iter().enumerate() {
                let load = loadavg();
                let s = measure(path, (&rx_fds, &tx_fds), &frame, passes, bufs, cpus, &mut scratch);
                if p == 0 {
                    epoll_us = s.rx_us;
                }
                let ratio = s.rx_us / epoll_us;
                us[f][p].push(s.rx_us);
                ratios[f][p].push(ratio);
                let (c, per_wake) = (s.counts, s.msgs as f64 / s.counts.wakes as f64);
                rows.push(vec![
                    round.to_string(),
                    size.to_string(),
                    path.to_string(),
                    format!("{:.3}", s.rx_us),
                    format!("{ratio:.2}"),
                    format!("{per_wake:.2}"),
                    format!("{:.3}", s.tx_us),
                    c.rearms.to_string(),
                    c.enobufs.to_string(),
                    if *path == "recv_multishot" { c.peak_bufs.to_string() } else { "-".into() },
                    format!("{load:.2}"),
                ]);
                runs.push(json!({"round": round, "frame": size, "path": path, "rx_cpu_us_per_msg": s.rx_us,
                    "ratio_to_epoll": ratio, "tx_cpu_us_per_msg": s.tx_us, "msgs": s.msgs, "wakes": c.wakes,
                    "rearms": c.rearms, "enobufs": c.enobufs, "peak_bufs": c.peak_bufs, "deferred": s.deferred, "loadavg": load}));
            }
        }
    }
    let pinned = cpus.map_or("not pinned".to_string(), |(a, b)| format!("receiver on CPU {a}, sender on CPU {b}"));
    table(
        &format!("receive path: {conns} loopback connections × {passes} passes, paced by pass; {pinned}"),
        &[
            "round",
            "frame",
            "path",
            "rx µs/msg",
            "×epoll",
            "msgs/wake",
            "tx µs/msg",
            "re-arms",
            "ENOBUFS",
            "peak bufs",
            "load 1m",
        ],
        &rows,
    );
    let mut medians = serde_json::Map::new();
    for (f, &size) in frames.iter().enumerate() {
        let line: Vec<String> = PATHS
            .iter()
            .enumerate()
            .map(|(p, path)| format!("{path} {:.3} µs (×{:.2})", median(&us[f][p]), median(&ratios[f][p])))
            .collect();
        println!("\nmedians, {size}-byte frame: {} per message (ratio: median of each round's)", line.join(", "));
        let per_path = |v: &[Vec<f64>]| -> serde_json::Value {
            PATHS.iter().zip(v).map(|(p, x)| (p.to_string(), json!(median(x)))).collect()
        };
        medians.insert(
            size.to_string(),
            json!({"rx_cpu_us_per_msg": per_path(&us[f]), "ratio_to_epoll": per_path(&ratios[f])}),
        );
    }
    println!(
        "provided buffers: {count} × {buf_size} B + {} B of ring entries = {:.2} MiB per ring (one per core, \
         whatever the connection count); epoll and poll_ring read into one {} KiB scratch buffer per core",
        ring_bytes - count * buf_size,
        ring_bytes as f64 / (1 << 20) as f64,
        SCRATCH_BYTES / 1024
    );
    write_json(
        "recv_path",
        &json!({"conns": conns, "passes": passes, "frames": frames, "cpus": cpus.map(|(a, b)| [a, b]),
        "provided_buffers": {"count": count, "size": buf_size, "bytes": ring_bytes}, "scratch_bytes": SCRATCH_BYTES,
        "runs": runs, "medians": medians}),
    );
}
