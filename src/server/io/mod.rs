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
}
