//! The I/O task of one connection: waits for readiness (holding no buffer while idle) and
//! hands what comes to the core ([`CoreState::on_readable`], [`CoreState::flush`]); everything
//! is decided by the connection's session. It never holds a borrow across an await, and owns
//! the socket, which it closes after the session is removed.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::AsRawFd;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::Poll;

use futures::future::FutureExt;
use monoio::net::TcpStream;

use super::core::CoreState;
use super::session::{ConnId, Flags, ReapReason, State};

enum Event {
    Closed,
    Readable(io::Result<()>),
    Writable(io::Result<()>),
}

/// Serves connection `id` until its session is over, then removes every trace of it.
pub async fn run(core: Rc<RefCell<CoreState>>, stream: TcpStream, id: ConnId) {
    let mut rd = pin!(stream.readable(false).fuse());
    // Waiting for writability is rare (a slow consumer), so its future lives on the heap only
    // while needed instead of widening every idle connection's task.
    let mut wr: Option<Pin<Box<dyn Future<Output = io::Result<()>> + '_>>> = None;
    loop {
        let ev = poll_fn(|cx| {
            let mut st = core.borrow_mut();
            let st = &mut *st;
            let Some(s) = st.conns.get(id) else { return Poll::Ready(Event::Closed) };
            if s.is_closed() {
                return Poll::Ready(Event::Closed);
            }
            let want_write = s.flags.has(Flags::WANT_WRITE);
            if want_write {
                let w = wr.get_or_insert_with(|| Box::pin(stream.writable(false)));
                if let Poll::Ready(r) = w.as_mut().poll(cx) {
                    return Poll::Ready(Event::Writable(r));
                }
            }
            // Echo and HTTP answers are not bounded by the queue limits: read no more until
            // the peer takes what we owe it (a pipelining client that never reads its answers
            // would otherwise grow our memory without bound).
            let http = matches!(s.state(), State::Http(_));
            let owed = want_write && (s.flags.has(Flags::ECHO) || http);
            let mut hold = owed || s.awaiting().is_some();
            if !hold && s.flags.has(Flags::PUBLISHER) && st.router.overloaded() {
                hold = true;
                if !s.flags.has(Flags::HELD) {
                    s.flags.set(Flags::HELD);
                    st.conns.held.push(id);
                    // The clock checks every tick whether the overload cleared.
                    super::tick::nudge();
                }
            }
            if !hold {
                if let Poll::Ready(r) = rd.as_mut().poll(cx) {
                    return Poll::Ready(Event::Readable(r));
                }
            }
            let Some(s) = st.conns.get(id) else { return Poll::Ready(Event::Closed) };
            if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                s.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
        match ev {
            Event::Closed => break,
            Event::Readable(r) => {
                rd.set(stream.readable(false).fuse());
                let mut st = core.borrow_mut();
                match r {
                    Ok(()) => st.on_readable(id, stream.as_raw_fd()),
                    Err(_) => st.end(id, ReapReason::Reset),
                }
            }
            Event::Writable(r) => {
                wr = None;
                let mut st = core.borrow_mut();
                if let Some(s) = st.conn(id) {
                    s.flags.clear(Flags::WANT_WRITE);
                    if r.is_err() {
                        s.kill(ReapReason::Reset);
                    }
                }
                st.flush(id);
                // Pipelined requests wait while their answers do not drain.
                st.resume_http(id);
            }
        }
    }
    // Removing the session first: the socket closes when `stream` drops, after it.
    core.borrow_mut().teardown(id);
}
