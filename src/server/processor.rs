//! The per-core processor: the one task that changes channel state. It drains the local queue
//! and the bus in order, walks subscriber lists in chunks (yielding between chunks so one big
//! broadcast never stalls the core's connections), and flushes every touched connection once
//! per pass, so several frames leave in one `sendmsg`.

use std::cell::RefCell;
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;

use super::bus::{BusMsg, CoreMsg};
use super::core::CoreState;
use super::session::ConnId;

/// Subscribers visited per chunk before the processor flushes and yields.
pub const CHUNK: usize = 1024;
/// Messages handled per pass before flushing and yielding.
const PASS: usize = 256;

/// Yields once to the runtime, letting other tasks on this core run.
pub async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Runs the processor of one core until the runtime stops.
pub async fn run(core: Rc<RefCell<CoreState>>) {
    let (me, shared) = {
        let st = core.borrow();
        (st.me, st.shared.clone())
    };
    loop {
        // Sleep until rung; with spilled messages, also retry the full queues every 1 ms.
        let spill = {
            let st = core.borrow();
            st.router.has_spill() || st.broker.has_backlog()
        };
        let rung = poll_fn(|cx| shared.doorbells[me].poll_rung(cx));
        if spill {
            let _ = monoio::time::timeout(Duration::from_millis(1), rung).await;
        } else {
            rung.await;
        }
        {
            let mut st = core.borrow_mut();
            if st.router.has_spill() {
                st.router.retry_spill();
            }
            if st.broker.has_backlog() {
                let now_ms = st.clock.now_ms();
                st.broker.sweep(now_ms);
            }
            if !st.drain.started && shared.draining() {
                super::tick::start_drain(&mut st);
            }
            super::tick::catch_up(&mut st);
        }
        handle_feed_publishes(&core);
        let mut handled = 0;
        loop {
            let msg = {
                let st = &mut *core.borrow_mut();
                st.router.recv().or_else(|| st.broker.recv().map(BusMsg::Core))
            };
            let Some(msg) = msg else { break };
            match msg {
                BusMsg::Core(CoreMsg::Deliver { ch, seq: _, frame }) => deliver(&core, &ch, frame).await,
                BusMsg::Core(other) => core.borrow_mut().handle(other),
                BusMsg::Broker(req) => {
                    let st = &mut *core.borrow_mut();
                    let now_ms = st.clock.now_ms();
                    st.broker.serve(&mut st.router, now_ms, req);
                }
            }
            handled += 1;
            if handled % PASS == 0 {
                {
                    let mut st = core.borrow_mut();
                    st.flush_dirty();
                    super::tick::catch_up(&mut st);
                }
                yield_now().await;
            }
        }
        core.borrow_mut().flush_dirty();
    }
}

/// Answers the admin requests the feeds thread answered, and hands its queued publishes to the broker, as a connection's publish would
/// be (at most [`PASS`] per pass; the doorbell is rung again when more wait).
fn handle_feed_publishes(core: &Rc<RefCell<CoreState>>) {
    let st = &mut *core.borrow_mut();
    while let Some((conn, reply)) = st.feeds.next_answer() {
        st.answer_feeds(conn, reply);
    }
    for _ in 0..PASS {
        let Some(req) = st.feeds.next_request(st.me) else { return };
        st.broker.request(&mut st.router, req);
    }
    st.shared.doorbells[st.me].ring();
}

/// Queues `frame` to every local subscriber of `ch`, in chunks of [`CHUNK`].
async fn deliver(core: &Rc<RefCell<CoreState>>, ch: &str, frame: Bytes) {
    let Some(chan) = core.borrow().local.find(ch) else { return };
    core.borrow_mut().active_chan = Some(chan);
    let mut pos = 0;
    loop {
        let done = {
            let mut st = core.borrow_mut();
            let Some(lc) = st.local.chans.get(chan as usize) else { break };
            let policy = lc.overflow;
            let end = (pos + CHUNK).min(lc.subs.len());
            let ids: [ConnId; CHUNK] = {
                let mut a = [ConnId::DEAD; CHUNK];
                a[..end - pos].copy_from_slice(&lc.subs[pos..end]);
                a
            };
            let mut n = 0u64;
            let now = st.clock.now();
            for id in &ids[..end - pos] {
                if *id != ConnId::DEAD && st.deliver_to(*id, now, frame.clone(), chan, policy) {
                    n += 1;
                }
            }
            st.metrics().delivered.fetch_add(n, Relaxed);
            pos = end;
            end >= st.local.chans.get(chan as usize).map_or(0, |c| c.subs.len())
        };
        if done {
            break;
        }
        super::tick::catch_up(&mut core.borrow_mut());
        yield_now().await;
    }
    let mut st = core.borrow_mut();
    st.active_chan = None;
    st.tidy(chan);
}
