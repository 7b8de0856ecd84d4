//! The task of one connection: waits for readiness (holding no buffer while idle), reads into
//! the core's scratch buffer, and feeds the bytes to the HTTP or WebSocket layer. Everything it
//! decides is applied to the core state at once; it never holds a borrow across an await.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::AsRawFd;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::Poll;

use bytes::Bytes;
use futures::future::FutureExt;
use monoio::net::TcpStream;

use super::conn_state::*;
use super::core::CoreState;
use super::http_api;
use super::metrics::ReapReason;
use crate::protocol::{self, ClientOp};
use crate::ws::codec::{self, Message, Violation};

/// Size of the per-core read buffer. Reads never go to per-connection memory.
pub const SCRATCH_BYTES: usize = 64 * 1024;

thread_local! {
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; SCRATCH_BYTES].into_boxed_slice());
}

enum Event {
    Kill,
    Readable(io::Result<()>),
    Writable(io::Result<()>),
    Reply,
}

/// Serves connection `id` until it ends, then removes every trace of it.
pub async fn run(core: Rc<RefCell<CoreState>>, stream: TcpStream, id: ConnId) {
    let mut rd = pin!(stream.readable(false).fuse());
    // Waiting for writability is rare (a slow consumer), so its future lives on the heap only
    // while needed instead of widening every idle connection's task.
    let mut wr: Option<Pin<Box<dyn Future<Output = io::Result<()>> + '_>>> = None;
    loop {
        let ev = poll_fn(|cx| {
            let mut st = core.borrow_mut();
            let Some(c) = st.conn(id) else { return Poll::Ready(Event::Kill) };
            if c.flags & KILL != 0 {
                return Poll::Ready(Event::Kill);
            }
            if c.flags & REPLY_READY != 0 {
                return Poll::Ready(Event::Reply);
            }
            if c.flags & WANT_WRITE != 0 {
                let w = wr.get_or_insert_with(|| Box::pin(stream.writable(false)));
                if let Poll::Ready(r) = w.as_mut().poll(cx) {
                    return Poll::Ready(Event::Writable(r));
                }
            }
            // Echo and HTTP answers are not bounded by the queue limits: read no more until
            // the peer takes what we owe it (a pipelining client that never reads its answers
            // would otherwise grow our memory without bound).
            let owed = c.flags & WANT_WRITE != 0 && (c.flags & ECHO != 0 || c.phase == Phase::Http);
            let mut hold = owed || c.flags & AWAITING != 0;
            if !hold && c.flags & PUBLISHER != 0 && st.overloaded() {
                hold = true;
                let c = st.conn(id).expect("looked up above");
                if c.flags & HELD == 0 {
                    c.flags |= HELD;
                    st.held.push(id);
                }
            }
            let Some(c) = st.conn(id) else { return Poll::Ready(Event::Kill) };
            if !hold {
                if let Poll::Ready(r) = rd.as_mut().poll(cx) {
                    return Poll::Ready(Event::Readable(r));
                }
            }
            if !c.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                c.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
        match ev {
            Event::Kill => break,
            Event::Readable(r) => {
                rd.set(stream.readable(false).fuse());
                match r {
                    Ok(()) => on_readable(&core, id, stream.as_raw_fd()),
                    Err(_) => kill(&core, id, ReapReason::Reset),
                }
            }
            Event::Writable(r) => {
                wr = None;
                let mut st = core.borrow_mut();
                if let Some(c) = st.conn(id) {
                    c.flags &= !WANT_WRITE;
                    if r.is_err() {
                        c.kill(ReapReason::Reset);
                    }
                }
                st.flush(id);
                // Pipelined requests wait while their answers do not drain.
                http_api::resume(&mut st, id);
            }
            Event::Reply => http_api::on_reply(&mut core.borrow_mut(), id),
        }
    }
    // Removing the entry first: the socket closes when `stream` drops, after it.
    core.borrow_mut().teardown(id);
}

fn kill(core: &Rc<RefCell<CoreState>>, id: ConnId, why: ReapReason) {
    if let Some(c) = core.borrow_mut().conn(id) {
        c.kill(why);
    }
}

/// Reads what the socket has (up to a few scratch buffers per wake-up, for fairness).
fn on_readable(core: &Rc<RefCell<CoreState>>, id: ConnId, fd: std::os::fd::RawFd) {
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        for _ in 0..4 {
            let n = match recv(fd, &mut scratch) {
                Ok(0) => return kill(core, id, ReapReason::Eof),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => return kill(core, id, ReapReason::Reset),
            };
            let mut st = core.borrow_mut();
            let now = st.now_tick();
            let Some(c) = st.conn(id) else { return };
            c.last_rx = now;
            c.flags &= !AWAIT_PONG;
            match c.phase {
                Phase::Http => http_api::on_bytes(&mut st, id, &scratch[..n]),
                Phase::Open | Phase::ClosingByUs => on_ws_bytes(&mut st, id, &scratch[..n]),
                Phase::Flushing | Phase::Lingering => {}
            }
            if st.conn(id).is_none_or(|c| c.flags & KILL != 0) || n < scratch.len() {
                return;
            }
        }
    })
}

/// Decodes WebSocket frames from the connection's leftover plus `data`, acting on each.
pub fn on_ws_bytes(st: &mut CoreState, id: ConnId, data: &[u8]) {
    let max = st.shared.config.limits.max_message_bytes;
    let Some(c) = st.conn(id) else { return };
    let mut pending = std::mem::take(&mut c.pending_in);
    let buf: &[u8] = if pending.is_empty() {
        data
    } else {
        pending.extend_from_slice(data);
        &pending
    };
    let mut pos = 0;
    while pos < buf.len() {
        let Some(c) = st.conn(id) else { return };
        if c.flags & KILL != 0 || matches!(c.phase, Phase::Flushing | Phase::Lingering) {
            pos = buf.len();
            break;
        }
        match c.decoder.decode(&buf[pos..], max, true) {
            Ok((0, None)) => break,
            Ok((n, None)) => pos += n,
            Ok((n, Some(m))) => {
                pos += n;
                on_message(st, id, m);
            }
            Err(v) => {
                fail(st, id, v);
                pos = buf.len();
            }
        }
    }
    let Some(c) = st.conn(id) else { return };
    if pos < buf.len() {
        c.pending_in = if pending.is_empty() {
            buf[pos..].to_vec()
        } else {
            pending.drain(..pos);
            pending
        };
    }
}

/// Fails the connection for a protocol violation with the violation's code.
fn fail(st: &mut CoreState, id: ConnId, v: Violation) {
    st.fail(id, v.code, v.reason);
}

fn on_message(st: &mut CoreState, id: ConnId, m: Message) {
    let Some(c) = st.conn(id) else { return };
    let (phase, echo) = (c.phase, c.flags & ECHO != 0);
    if phase == Phase::ClosingByUs {
        // Our close is out: only the peer's close matters now (RFC 6455 §7.1.2).
        if let Message::Close { .. } = m {
            c.kill(c.reap.unwrap_or(ReapReason::Close));
        }
        return;
    }
    match m {
        Message::Text(p) if echo => echo_frame(st, id, 0x1, &p),
        Message::Binary(p) if echo => echo_frame(st, id, 0x2, &p),
        Message::Text(p) => on_request(st, id, &p),
        Message::Binary(_) => {
            let e = protocol::error_json("bad_request", "binary frames are not part of protocol v1; send JSON text", None);
            st.reply(id, codec::encode_frame(0x1, &e));
        }
        Message::Ping(p) => st.reply(id, codec::pong_frame(&p)),
        Message::Pong(_) => {}
        Message::Close { code, .. } => {
            // Echo the peer's code (RFC 6455 §5.5.1), then close TCP once it is written.
            let code = code.unwrap_or(1000);
            st.metrics().close(code);
            let Some(c) = st.conn(id) else { return };
            c.push(codec::close_frame(code, ""), NO_CHAN);
            c.phase = Phase::Flushing;
            c.reap.get_or_insert(ReapReason::Close);
            st.flush(id);
        }
    }
}

/// `/echo`: sends the message back with its opcode. Not bounded by the queue limits (it is a
/// conformance endpoint); the task stops reading while an echo waits for the socket instead.
fn echo_frame(st: &mut CoreState, id: ConnId, opcode: u8, p: &[u8]) {
    let Some(c) = st.conn(id) else { return };
    c.push(codec::encode_frame(opcode, p), NO_CHAN);
    st.flush(id);
}

/// One pub/sub request (docs/protocol.md); a bad one gets an `error` and the connection stays open.
fn on_request(st: &mut CoreState, id: ConnId, text: &[u8]) {
    match protocol::parse_client_op(text) {
        Ok(ClientOp::Sub { ch, from, epoch }) => st.client_sub(id, &ch, from, epoch),
        Ok(ClientOp::Unsub { ch }) => st.client_unsub(id, &ch),
        Ok(ClientOp::Pub { ch, id: pub_id, data }) => {
            let data = Bytes::copy_from_slice(data.get().as_bytes());
            st.client_pub(id, &ch, Some(pub_id.into_boxed_str()), data);
        }
        Err(e) => {
            let json = protocol::error_json(e.code, &e.reason, e.id.as_deref());
            st.reply(id, codec::encode_frame(0x1, &json));
        }
    }
}
