//! Every socket call of a connection, in one place: non-blocking `recv`, vectored `sendmsg`,
//! the half-close (`shutdown(SHUT_WR)`), the close, the peer's address and an SSE stream's
//! `TCP_USER_TIMEOUT`. The sessions decide; this
//! module only does what they decided. [`batch`] makes a chunk of connections' `sendmsg`s in
//! one `io_uring_enter` on the core's send ring; [`poll_ring`] is the core's io_uring readiness
//! source.

pub mod batch;
pub mod poll_ring;

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};

/// Non-blocking `recv` into `buf`: `Ok(0)` is EOF; `WouldBlock` means no data now. Retries
/// `EINTR`.
pub fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a valid writable slice; fd is open while its session exists (the core
        // closes it only after removing the session, `CoreState::teardown`).
        let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether input waits in the socket `fd` unread: bytes, the peer's FIN or an error (a
/// `MSG_PEEK` of one byte that does not block and consumes nothing). `false` when nothing is
/// there. One system call; for the rare moment a deadline would judge the peer silent.
pub fn has_input(fd: RawFd) -> bool {
    let mut byte = 0u8;
    loop {
        // SAFETY: one writable byte; fd is open while its session exists (see `recv`).
        let r = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        if r >= 0 {
            return true;
        }
        match io::Error::last_os_error().kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return false,
            // A pending error: the read that follows reaps the connection for it.
            _ => return true,
        }
    }
}

/// One non-blocking `sendmsg` of `iov` (no `SIGPIPE`), or `send` when `iov` is one slice
/// (the light-load case, one frame per subscriber: the kernel then copies and checks no
/// `msghdr` nor iovec array); the bytes written, `WouldBlock` when the socket buffer is full;
/// other errors are the peer's (reset, broken pipe). Retries `EINTR`.
pub fn send(fd: RawFd, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec on Unix; sendmsg only reads through the pointer.
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    loop {
        let r = match iov {
            // SAFETY: the slice is alive for the call; fd as in `recv`.
            [one] => unsafe { libc::send(fd, one.as_ptr().cast(), one.len(), flags) },
            // SAFETY: msg points at `iov`, alive for the call; fd as in `recv`.
            _ => unsafe { libc::sendmsg(fd, &msg, flags) },
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Frames of at most this many bytes are copied together before a send ([`Gather`]); larger
/// ones are handed to the kernel where they lie.
pub const GATHER_FRAME: usize = 1024;

/// Bytes a [`Gather`] copies for one send, at most (64 KiB); what does not fit waits for the
/// next send of the same connection.
pub const GATHER_BYTES: usize = 64 * 1024;

/// A core's buffer for [`Gather::send`]: runs of small frames copied into one slice, so a
/// subscriber behind by many small messages costs the kernel one iovec, not one per frame.
///
/// Measured (docs/architecture.md, "Small frames, one slice"): the kernel's `_copy_from_iter`
/// walks an iovec array with a fixed cost per element, which at 64-byte frames dominated the
/// copy itself; one core's deliveries at saturation went from 6.6 to 8.3 M/s with this alone,
/// and to 9.9 M/s with 256 frames per call instead of 64.
pub struct Gather {
    buf: Vec<u8>,
}

impl Default for Gather {
    fn default() -> Self {
        Gather { buf: Vec::with_capacity(GATHER_BYTES) }
    }
}

/// One element of a gathered send: bytes copied into the buffer, or a frame sent in place.
#[derive(Clone, Copy)]
enum Part {
    Copied { start: u32, end: u32 },
    InPlace(u16),
}

impl Gather {
    /// [`send`] of `iov` with each run of frames of at most [`GATHER_FRAME`] bytes copied
    /// into one slice first (up to [`GATHER_BYTES`] copied; what does not fit is left for the
    /// next call, as a short write would be). One frame is sent as it is. Same result as
    /// [`send`]: the bytes written, counted from the start of `iov`.
    pub fn send(&mut self, fd: RawFd, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        if iov.len() < 2 {
            return send(fd, iov);
        }
        let iov = &iov[..iov.len().min(crate::session::queue::MAX_IOV)];
        let mut plan = [Part::InPlace(0); crate::session::queue::MAX_IOV];
        let mut parts = 0;
        self.buf.clear();
        for (i, s) in iov.iter().enumerate() {
            if s.len() > GATHER_FRAME {
                plan[parts] = Part::InPlace(i as u16);
                parts += 1;
                continue;
            }
            if self.buf.len() + s.len() > GATHER_BYTES {
                break;
            }
            let at = self.buf.len() as u32;
            self.buf.extend_from_slice(s);
            let end = self.buf.len() as u32;
            match parts.checked_sub(1).map(|p| &mut plan[p]) {
                Some(Part::Copied { end: e, .. }) => *e = end,
                _ => {
                    plan[parts] = Part::Copied { start: at, end };
                    parts += 1;
                }
            }
        }
        let mut out = [IoSlice::new(&[]); crate::session::queue::MAX_IOV];
        for (o, p) in out.iter_mut().zip(&plan[..parts]) {
            *o = match *p {
                Part::Copied { start, end } => IoSlice::new(&self.buf[start as usize..end as usize]),
                Part::InPlace(i) => iov[i as usize],
            };
        }
        send(fd, &out[..parts])
    }
}

/// Half-closes the connection (sends FIN) once our last bytes are written. An error means
/// the peer is gone already; the caller's deadline reaps it either way.
pub fn shutdown_write(fd: RawFd) {
    // SAFETY: fd as in `recv`.
    if unsafe { libc::shutdown(fd, libc::SHUT_WR) } != 0 {
        tracing::trace!(fd, error = %io::Error::last_os_error(), "shutdown(SHUT_WR) failed");
    }
}

/// Closes the socket `fd` (owned by its session until the core tore the session down). An
/// error (`EINTR`, `EIO`) leaves nothing to retry on Linux: the descriptor is released anyway.
pub fn close(fd: RawFd) {
    // SAFETY: the caller owns fd and never uses it again.
    if unsafe { libc::close(fd) } != 0 {
        tracing::trace!(fd, error = %io::Error::last_os_error(), "close failed");
    }
}

/// Bounds how long bytes written to `fd` may stay unacknowledged before the kernel ends the
/// connection (`TCP_USER_TIMEOUT`, RFC 5482, Linux `tcp(7)`): then the socket reports
/// `ETIMEDOUT` and the reactor reaps it. For SSE streams, whose peer never answers a
/// heartbeat, so a peer that vanished without a reset is found within this bound instead of
/// the kernel's ~15 minutes of retransmissions. A failure is logged and leaves the default.
pub fn set_user_timeout(fd: RawFd, timeout: std::time::Duration) {
    // SAFETY: fd as in `recv`; the borrow does not outlive this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    if let Err(error) = socket2::SockRef::from(&fd).set_tcp_user_timeout(Some(timeout)) {
        tracing::debug!(%error, "setsockopt(TCP_USER_TIMEOUT) failed");
    }
}

/// The peer's address, asked of the kernel (`getpeername`).
pub fn peer_addr(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: fd as in `recv`; the borrow does not outlive this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    socket2::SockRef::from(&fd).peer_addr().ok()?.as_socket()
}

/// The local address of the connected socket `fd` (`getsockname`): the address the peer
/// connected to. `None` when the kernel no longer knows it.
pub fn local_addr(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: fd as in `recv`; the borrow does not outlive this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    socket2::SockRef::from(&fd).local_addr().ok()?.as_socket()
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn has_input_sees_bytes_and_the_fin_without_consuming_them() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut peer = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (ours, _) = listener.accept().expect("accept");
        let fd = ours.as_raw_fd();
        assert!(!has_input(fd), "nothing sent yet");
        peer.write_all(b"pong").expect("write");
        // Loopback delivers within the write; bounded wait all the same.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !has_input(fd) {
            assert!(std::time::Instant::now() < end, "the bytes never showed");
            std::thread::yield_now();
        }
        assert!(has_input(fd), "a peek consumes nothing");
        let mut buf = [0u8; 16];
        assert_eq!(recv(fd, &mut buf).expect("recv"), 4);
        assert!(!has_input(fd), "all read");
        peer.shutdown(Shutdown::Write).expect("fin");
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !has_input(fd) {
            assert!(std::time::Instant::now() < end, "the FIN never showed");
            std::thread::yield_now();
        }
        assert_eq!(recv(fd, &mut buf).expect("recv"), 0);
    }

    /// Frames small and large, in runs, come out of a gathered send byte for byte in order; a
    /// queue longer than the gather buffer is written in several sends, each counted from the
    /// start of what it was given.
    #[test]
    fn gathered_sends_keep_every_byte_in_order() {
        use std::io::Read;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut peer = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (ours, _) = listener.accept().expect("accept");
        // Sizes around both limits: tiny, GATHER_FRAME, one past it, large, and enough small
        // ones to overflow GATHER_BYTES.
        let mut frames: Vec<Vec<u8>> = Vec::new();
        let sizes = [3, 64, GATHER_FRAME, GATHER_FRAME + 1, 70_000, 1, 900];
        for (i, n) in sizes.iter().cycle().take(crate::session::queue::MAX_IOV * 2).enumerate() {
            frames.push((0..*n).map(|k| (i * 31 + k) as u8).collect());
        }
        let expected: Vec<u8> = frames.concat();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            peer.set_read_timeout(Some(std::time::Duration::from_secs(20))).expect("timeout");
            peer.read_to_end(&mut got).expect("read");
            got
        });
        let mut gather = Gather::default();
        let (mut frame, mut offset, mut sends) = (0, 0, 0);
        let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while frame < frames.len() {
            assert!(std::time::Instant::now() < end, "the sends never finished");
            let iov: Vec<IoSlice<'_>> = std::iter::once(&frames[frame][offset..])
                .chain(frames[frame + 1..].iter().map(|f| &f[..]))
                .take(crate::session::queue::MAX_IOV)
                .map(IoSlice::new)
                .collect();
            let mut n = match gather.send(ours.as_raw_fd(), &iov) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                Err(e) => panic!("send: {e}"),
            };
            sends += 1;
            while n > 0 {
                let left = frames[frame].len() - offset;
                if n < left {
                    offset += n;
                    n = 0;
                } else {
                    n -= left;
                    frame += 1;
                    offset = 0;
                }
            }
        }
        drop(ours);
        let got = reader.join().expect("reader");
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "bytes differ");
        assert!(sends > 1, "more than one send's worth");
    }
}
