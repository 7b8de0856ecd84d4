//! Batched sends: the `sendmsg` calls of a chunk of connections submitted together on a small
//! io_uring ring of the core's own, in one `io_uring_enter` (docs/architecture.md, "The send
//! path").
//!
//! The ring is used synchronously and only for sends: [`SendBatch::stage`] writes one
//! `IORING_OP_SENDMSG` per connection (its own `msghdr` and iovecs, in the batch's slots),
//! [`SendBatch::submit`] enters the kernel once for the chunk and waits for every completion,
//! so nothing is in flight when it returns. It is independent of the monoio runtime's driver
//! (io_uring or epoll), and reads no readiness: connections still learn writability from the
//! core's epoll set.
//!
//! Every send carries `MSG_DONTWAIT | MSG_NOSIGNAL`, so a full socket completes at once with
//! `-EAGAIN`, exactly as a non-blocking `sendmsg(2)` returns `EWOULDBLOCK`, instead of being
//! parked on an internal poll until the socket drains: `io_sendmsg_prep` (Linux
//! `io_uring/net.c`) marks a request with `MSG_DONTWAIT` `REQ_F_NOWAIT`, and `io_queue_async`
//! (`io_uring/io_uring.c`) completes a `REQ_F_NOWAIT` request that got `-EAGAIN` with that
//! error instead of arming a poll (checked in v6.18; `full_socket_completes_with_eagain` below
//! checks it on the running kernel). So the send's effect on the socket, and the result the
//! caller acts on, are those of `server::io::send`.

use std::io::{self, IoSlice};
use std::os::fd::RawFd;

use io_uring::{opcode, types, IoUring};

/// Iovecs of one staged send, at most: a connection's first send of a pass takes this many
/// frames; the rest of its queue goes with `sendmsg` right after (`server::flush`).
pub const SLOT_IOV: usize = 64;

/// Sends staged per submission, at most: the ring's size. Each slot holds [`SLOT_IOV`] iovecs,
/// so the batch's own memory is about 130 KiB per core (128 × (64 × 16 B + a `msghdr`)).
/// Trade-off: a larger chunk spreads one `io_uring_enter` over more sends, but every send of a
/// chunk is made before any result is acted on.
pub const BATCH: usize = 128;

/// `io_uring_enter` calls that failed with `EAGAIN`/`EBUSY` (the kernel short of memory) in a
/// row before the batch gives up on its ring.
const ENTER_RETRIES: usize = 16;

/// One staged send: its message header and its iovecs, kept here (not on the stack) because
/// the kernel reads them while the submission is processed.
struct Slot {
    hdr: libc::msghdr,
    iov: [libc::iovec; SLOT_IOV],
}

/// A core's send ring and the slots of the sends staged on it (docs/architecture.md, "The send
/// path"). Owned by one core, used from its thread only.
pub struct SendBatch {
    ring: IoUring,
    slots: Box<[Slot]>,
    /// Sends staged since the last submit (the next free slot).
    staged: usize,
    /// Result of each staged send, by slot: `None` = not made (retry with `server::io::send`).
    results: Vec<Option<io::Result<usize>>>,
    /// The ring failed in a way that may repeat; every later batch is refused
    /// ([`SendBatch::is_broken`]).
    broken: bool,
}

impl SendBatch {
    /// A ring of [`BATCH`] entries. Errors are those of `io_uring_setup(2)`: `ENOMEM` (locked
    /// memory or kernel memory short, e.g. under load), `EPERM` / `ENOSYS` (io_uring disabled by
    /// `kernel.io_uring_disabled`, a seccomp filter or an old kernel); the caller then sends
    /// with `sendmsg(2)` per connection.
    pub fn new() -> io::Result<SendBatch> {
        let entries = BATCH as u32;
        // SUBMIT_ALL (Linux 5.18) keeps submitting the rest of a chunk when one entry fails at
        // preparation; without it the rest stays queued and the next enter submits it.
        let ring = IoUring::builder().setup_submit_all().build(entries).or_else(|_| IoUring::new(entries))?;
        // SAFETY: msghdr and iovec are plain C structs for which all-zero is a valid value.
        let empty = || Slot { hdr: unsafe { std::mem::zeroed() }, iov: unsafe { std::mem::zeroed() } };
        Ok(SendBatch {
            ring,
            slots: (0..BATCH).map(|_| empty()).collect(),
            staged: 0,
            results: Vec::with_capacity(BATCH),
            broken: false,
        })
    }

    /// Whether no send is staged since the last [`SendBatch::submit`].
    pub fn is_empty(&self) -> bool {
        self.staged == 0
    }

    /// Whether the ring failed for good (an `io_uring_enter` error other than a retried
    /// `EINTR`, `EAGAIN`, `EBUSY`): the caller should drop the batch and send with
    /// `sendmsg(2)` from then on.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Stages one `sendmsg` of `iov` (at most [`SLOT_IOV`] slices) on `fd` and returns its
    /// slot, the index of its result in [`SendBatch::submit`]'s answer. Panics when [`BATCH`]
    /// sends are staged already, or when the batch is broken ([`SendBatch::is_broken`]: sends
    /// it did not take may still sit in its submission queue).
    ///
    /// # Safety
    /// The memory `iov` points at must stay alive and unchanged, and `fd` open, until the next
    /// [`SendBatch::submit`] returns: the kernel reads them while it processes the submission.
    pub unsafe fn stage(&mut self, fd: RawFd, iov: &[IoSlice<'_>]) -> usize {
        let i = self.staged;
        assert!(i < BATCH && iov.len() <= SLOT_IOV && !self.broken, "send batch overfilled or broken");
        let slot = &mut self.slots[i];
        for (dst, src) in slot.iov.iter_mut().zip(iov) {
            *dst = libc::iovec { iov_base: src.as_ptr() as *mut _, iov_len: src.len() };
        }
        slot.hdr.msg_iov = slot.iov.as_mut_ptr();
        slot.hdr.msg_iovlen = iov.len() as _;
        let flags = (libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32;
        let sqe = opcode::SendMsg::new(types::Fd(fd), &slot.hdr).flags(flags).build().user_data(i as u64);
        // SAFETY: the header and iovecs live in `self.slots` and are not touched until
        // `submit` has reaped this entry's completion; the caller keeps the data and fd alive.
        // The ring has BATCH entries and at most BATCH are staged before a submit empties it.
        unsafe { self.ring.submission().push(&sqe) }.expect("send ring has room for a batch");
        self.staged += 1;
        i
    }

    /// Submits every staged send in one `io_uring_enter` and waits for all their completions;
    /// returns each send's result by slot: `Some(Ok(bytes written))`, `Some(Err(e))` with the
    /// `sendmsg(2)` error (`WouldBlock` when the socket buffer is full, a reset, a broken
    /// pipe), or `None` when the send was not made (interrupted, or the ring failed before
    /// the kernel took it): the caller sends those with `server::io::send`. Retries an enter
    /// interrupted by a signal, and one refused for lack of kernel memory up to 16 times in a
    /// row; past that, or on any other enter error, the ring is marked broken
    /// ([`SendBatch::is_broken`]).
    pub fn submit(&mut self) -> &mut [Option<io::Result<usize>>] {
        let n = self.staged;
        self.results.clear();
        self.results.resize_with(n, || None);
        let mut reaped = 0;
        let mut refused = 0;
        while reaped < n && !self.broken {
            match self.ring.submit_and_wait(n - reaped) {
                Ok(_) => refused = 0,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) && refused < ENTER_RETRIES => {
                    refused += 1;
                    std::thread::yield_now();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "io_uring_enter failed; sending with sendmsg from now on");
                    self.broken = true;
                }
            }
            for cqe in self.ring.completion() {
                let Some(slot) = self.results.get_mut(cqe.user_data() as usize) else { continue };
                reaped += 1;
                let r = cqe.result();
                *slot = match r {
                    0.. => Some(Ok(r as usize)),
                    _ if -r == libc::EINTR => None,
                    _ => Some(Err(io::Error::from_raw_os_error(-r))),
                };
            }
        }
        // A broken ring is never entered again, so a send the kernel did not take is never
        // made: its result stays `None`. A taken one completed inline (no request waits on a
        // poll, see the module doc) and was reaped above.
        self.staged = 0;
        &mut self.results
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// The kernel completes a send on a full socket with -EAGAIN instead of parking it on a
    /// poll (the contract `CoreState::flush_dirty` relies on), and a batch reports each
    /// connection's own result.
    #[test]
    fn full_socket_completes_with_eagain() {
        let Ok(mut batch) = SendBatch::new() else {
            eprintln!("io_uring unavailable here; nothing to check");
            return;
        };
        let (tx, mut rx) = pair();
        let (tx2, mut rx2) = pair();
        let chunk = vec![7u8; 256 * 1024];
        let mut sent = 0usize;
        let mut last = None;
        for _ in 0..10_000 {
            // SAFETY: `chunk` and the sockets outlive the submit below.
            let i = unsafe { batch.stage(tx.as_raw_fd(), &[IoSlice::new(&chunk)]) };
            match batch.submit()[i].take() {
                Some(Ok(n)) => sent += n,
                other => {
                    last = other;
                    break;
                }
            }
        }
        let e = last.expect("a send completed with an error").expect_err("a full socket refuses");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
        // A second connection in the same batch is unaffected by the first one's full buffer.
        let small = b"hello";
        // SAFETY: as above.
        let (a, b) = unsafe {
            (batch.stage(tx.as_raw_fd(), &[IoSlice::new(&chunk)]), batch.stage(tx2.as_raw_fd(), &[IoSlice::new(small)]))
        };
        let results = batch.submit();
        // Still full (or, should the kernel have freed room meanwhile, written in part).
        match results[a].take().expect("made") {
            Ok(n) => sent += n,
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}"),
        }
        assert_eq!(*results[b].as_ref().unwrap().as_ref().unwrap(), 5);
        let mut got = [0u8; 5];
        rx2.read_exact(&mut got).unwrap();
        assert_eq!(&got, small);
        // The full socket's bytes are all there, in order, and nothing more.
        drop(tx);
        let mut all = Vec::new();
        rx.read_to_end(&mut all).unwrap();
        assert_eq!(all.len(), sent);
    }

    /// A send to a reset peer completes with the reset (or broken pipe), not a signal.
    #[test]
    fn reset_peer_is_an_error() {
        let Ok(mut batch) = SendBatch::new() else { return };
        let (tx, rx) = pair();
        socket2::SockRef::from(&rx).set_linger(Some(std::time::Duration::ZERO)).unwrap();
        drop(rx);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let data = [1u8; 100];
        let mut err = None;
        for _ in 0..3 {
            // SAFETY: `data` and `tx` outlive the submit.
            let i = unsafe { batch.stage(tx.as_raw_fd(), &[IoSlice::new(&data)]) };
            if let Some(Err(e)) = batch.submit()[i].take() {
                err = Some(e);
                break;
            }
        }
        let e = err.expect("the reset surfaced");
        assert!(matches!(e.raw_os_error(), Some(libc::ECONNRESET | libc::EPIPE)), "{e}");
    }
}
