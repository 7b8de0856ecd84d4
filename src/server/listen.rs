//! The listeners of a core and its accept loop: one `SO_REUSEPORT` listener per core on
//! `listen` (and on `tls.listen_tls` when set), each accepted socket handed to the core's slab
//! and reactor, a TLS listener's with the handshake configuration in use
//! ([`super::tls::keys::Keys`]).

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;
use monoio::net::TcpListener;

use super::core::CoreState;
use super::{events, tls};

/// Connections taken from a listener's backlog per accept completion, the one the runtime
/// delivered included: the rest with `accept4` at once ([`accept_now`]), instead of one ring
/// round trip (submit, wait, wake the accept task) each. Bounded so a connect storm cannot
/// keep the core from serving the sockets it already has; what is left waits for the next
/// completion.
const ACCEPTS_PER_WAKE: usize = 64;

/// One listener per core on `addr`, sharing its port with `SO_REUSEPORT`, after making sure
/// no other process listens there: `SO_REUSEPORT` would let a second process share the port
/// silently, the kernel would split connections between the two, and the two memory brokers
/// would number the same channel twice (docs/operations.md, one server per port).
///
/// The check is a probe socket bound to `addr` *without* `SO_REUSEPORT` (with
/// `SO_REUSEADDR`, so sockets in TIME_WAIT do not count): the bind fails with `EADDRINUSE`
/// exactly when another socket listens on the address (or on a wildcard covering it). The
/// probe stays bound (not listening) until our listeners listen, which it does not hinder,
/// and picks the port when `addr` has port 0. Two processes started in the same instant can
/// both pass the probe; one started while another serves cannot.
pub(super) fn bind_listeners(
    addr: SocketAddr,
    cores: usize,
) -> std::io::Result<(SocketAddr, Vec<std::net::TcpListener>)> {
    let named = |e: std::io::Error| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}"));
    let probe = socket_for(addr).map_err(named)?;
    match probe.bind(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("address {addr} is already in use by another process (stop it, or choose another address with --listen or `listen` in the config)"),
            ));
        }
        Err(e) => return Err(named(e)),
    }
    let bound = probe.local_addr().map_err(named)?.as_socket().unwrap_or(addr);
    let mut listeners = Vec::with_capacity(cores);
    for _ in 0..cores {
        listeners.push(bind_reuseport(bound).map_err(named)?);
    }
    drop(probe);
    Ok((bound, listeners))
}

/// A TCP socket for `addr` with `SO_REUSEADDR` (and dual-stack for IPv6).
fn socket_for(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(false)?;
    }
    Ok(s)
}

/// A listening socket with `SO_REUSEPORT`, so each core accepts on its own queue.
fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let s = socket_for(addr)?;
    s.set_reuse_port(true)?;
    // Every accepted socket is a copy of the listener's and keeps its TCP_NODELAY (Linux), so
    // set once here saves a setsockopt per handshake: the engine gathers each flush into one
    // sendmsg itself and Nagle would only hold its small frames back.
    s.set_tcp_nodelay(true)?;
    s.bind(&addr.into())?;
    // The kernel caps this at net.core.somaxconn (sysctl/99-tether.conf raises it).
    s.listen(65_535)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Accepts until the drain starts, then drops the listener (closing it). Each accepted socket
/// leaves monoio (`into_raw_fd` drops the driver's state of it) for the core's slab and
/// reactor: no task per connection. Each completion of the runtime's accept also takes what
/// waits behind it in the backlog, up to [`ACCEPTS_PER_WAKE`], so a burst of connections costs
/// one wake-up of the core, not one each. `tls`: the listener speaks TLS ([`take_accepted`]).
pub(super) async fn accept_loop(core: Rc<RefCell<CoreState>>, listener: TcpListener, tls: bool) {
    let mut acc = pin!(listener.accept().fuse());
    loop {
        let r = poll_fn(|cx| {
            let mut st = core.borrow_mut();
            if st.drain.started {
                return Poll::Ready(None);
            }
            st.drain.accept_waker = Some(cx.waker().clone());
            acc.as_mut().poll(cx).map(Some)
        })
        .await;
        let Some(r) = r else { break };
        // Not polled (so not submitted) until the backlog below is taken: the ring's accept and
        // `accept4` never wait on the listener together.
        acc.set(listener.accept().fuse());
        match r {
            Ok((stream, _peer)) => {
                let mut st = core.borrow_mut();
                take_accepted(&mut st, stream.into_raw_fd(), tls);
                for _ in 1..ACCEPTS_PER_WAKE {
                    match accept_now(listener.as_raw_fd()) {
                        Ok(fd) => take_accepted(&mut st, fd, tls),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        // EMFILE and the like: the ring's accept meets it again and backs off.
                        Err(_) => break,
                    }
                }
            }
            Err(e) => {
                // EMFILE/ENFILE: back off briefly instead of spinning on a full fd table.
                events::accept_failed(core.borrow().me, &e);
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    tracing::info!(core = core.borrow().me, "listener closed");
}

/// Hands the accepted socket `fd` (owned from now on) to the core's slab and reactor. `tls`: it
/// came from the TLS listener, so it takes an `accept_rate` token first (closed at once
/// without one: the handshake is the costly part of a TLS connection) and starts its handshake
/// with the configuration in use now.
fn take_accepted(st: &mut CoreState, fd: RawFd, tls: bool) {
    st.metrics().accepted.fetch_add(1, Relaxed);
    let config = if tls { st.shared.tls.as_ref().map(|k| k.current()) } else { None };
    if config.is_some() && !st.take_accept_token() {
        st.metrics().tls.failed(tls::Failure::Rate);
        super::io::close(fd);
        return;
    }
    // Only a TLS connection has side-table state to mark: a plain one skips the lookup.
    let rated = config.is_some();
    match st.insert_conn(fd, config) {
        Ok(id) if rated => {
            if let Some(t) = st.tls.get(id.key) {
                t.flags |= tls::TlsConn::RATED;
            }
        }
        Ok(_) => {}
        Err(e) => events::accept_failed(st.me, &e),
    }
}

/// One connection from the backlog of the non-blocking listener `fd` (`accept4(2)`, close-on-exec
/// and non-blocking like the runtime's), or `WouldBlock` when the backlog is empty. Errors:
/// those of accept4 (`EMFILE`, `ENFILE`, `ENOBUFS`, `ECONNABORTED`).
fn accept_now(fd: RawFd) -> std::io::Result<RawFd> {
    loop {
        let flags = libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
        // SAFETY: plain system call on an open listener; no address is asked for.
        let r = unsafe { libc::accept4(fd, std::ptr::null_mut(), std::ptr::null_mut(), flags) };
        if r >= 0 {
            return Ok(r);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The listener's TCP_NODELAY reaches every accepted socket, which the accept loop relies
    /// on instead of one setsockopt per connection.
    #[test]
    fn accepted_sockets_inherit_the_listeners_nodelay() {
        let listener = super::bind_reuseport("127.0.0.1:0".parse().expect("addr")).expect("bind");
        listener.set_nonblocking(false).expect("blocking");
        let _peer = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        assert!(accepted.nodelay().expect("getsockopt"), "TCP_NODELAY not inherited");
    }
}
