//! The per-core processor: the one task that changes channel state. It drains the local queue
//! and the bus in order, walks subscriber lists in chunks (yielding between chunks so one big
//! broadcast never stalls the core's connections), and writes the touched connections a chunk
//! at a time, taking new messages between chunks, so the frames queued to a connection before
//! its turn leave in one `sendmsg`.

use std::cell::RefCell;
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use super::bus::{BusMsg, CoreMsg};
use super::conn::ConnId;
use super::core::CoreState;
use super::encodings::Batch;
use super::yielding::yield_now;
use crate::published::Published;

/// Subscribers a delivery visits before the processor yields.
pub const CHUNK: usize = 1024;
/// Subscribers a fan-out prefetches for at once, a group ahead of those it serves
/// ([`prefetch_group`]).
const PREFETCH_GROUP: usize = 16;
/// Messages handled before a chunk of the dirty list is written.
const PASS: usize = 256;
/// Consecutive deliveries of one channel queued to its subscribers together.
const BATCH: usize = 64;
/// Connections written per chunk of the dirty list, between which the processor takes the
/// messages that arrived and yields (so the reactor reads, and the clock runs).
const WRITE_CHUNK: usize = 512;

/// The next message for this core: the local queue and the bus first, then the broker's.
fn recv(core: &Rc<RefCell<CoreState>>) -> Option<BusMsg> {
    let st = &mut *core.borrow_mut();
    st.router.recv().or_else(|| st.broker.recv().map(BusMsg::Core))
}

/// Runs the processor of one core until the runtime stops.
pub async fn run(core: Rc<RefCell<CoreState>>) {
    let mut frames: Vec<Arc<Published>> = Vec::with_capacity(BATCH);
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
        // A message taken while batching deliveries that did not join the batch.
        let mut next: Option<BusMsg> = None;
        // Messages first, then a chunk of the dirty list, until both are done: what arrives
        // while a long list is written (the next publish, read by the reactor between chunks,
        // or a delivery from another core) is queued to every subscriber before the next
        // chunk, so the connections not yet written take it in the same write, and no
        // message waits for a whole list.
        loop {
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
            while handled < PASS {
                let Some(msg) = next.take().or_else(|| recv(&core)) else { break };
                handled += 1;
                match msg {
                    BusMsg::Core(CoreMsg::Deliver { ch, seq: _, msg }) => {
                        // The deliveries of the same channel that follow join this one (the
                        // first message of another kind or channel is kept for next).
                        frames.push(msg);
                        while frames.len() < BATCH && handled < PASS {
                            match recv(&core) {
                                Some(BusMsg::Core(CoreMsg::Deliver { ch: c, seq: _, msg })) if c == ch => {
                                    frames.push(msg);
                                    handled += 1;
                                }
                                other => {
                                    next = other;
                                    break;
                                }
                            }
                        }
                        deliver(&core, &ch, &frames).await;
                        frames.clear();
                    }
                    BusMsg::Core(other) => core.borrow_mut().handle(other),
                    BusMsg::Broker(req) => {
                        let st = &mut *core.borrow_mut();
                        let now_ms = st.clock.now_ms();
                        st.broker.serve(&mut st.router, now_ms, req);
                    }
                }
            }
            let more = {
                let mut st = core.borrow_mut();
                let more = st.flush_some(WRITE_CHUNK);
                st.conns.writing = more;
                more
            };
            if !more && handled < PASS && next.is_none() {
                break;
            }
            yield_now().await;
        }
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

/// Queues `msgs` (consecutive messages of `ch`, in seq order) to every local subscriber of
/// `ch`, in chunks of [`CHUNK`] subscribers: each subscriber takes all of them at once, so its
/// session is visited once per batch, not once per message. Each frame is shared by the
/// subscribers of this core as one copy made here per encoding taken ([`Batch`]).
async fn deliver(core: &Rc<RefCell<CoreState>>, ch: &str, msgs: &[Arc<Published>]) {
    let Some(chan) = core.borrow().local.find(ch) else { return };
    // A copy of this core's own, counted without atomics (queue::Frame: a `Bytes` clone per
    // subscriber took a quarter of the server's time at 7.5 M deliveries/s on 2 cores). Made
    // when it costs at most 64 bytes of copying per local subscriber.
    let (subs, epoch) =
        core.borrow().local.chans.get(chan as usize).map_or((0, None), |c| (c.subs.len(), c.epoch.clone()));
    let mut batch = Batch::new(msgs, subs).with_epoch(epoch);
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
            let ids = &ids[..end - pos];
            for (k, id) in ids.iter().enumerate() {
                if k % PREFETCH_GROUP == 0 {
                    prefetch_group(&mut st, ids, k);
                }
                if *id == ConnId::DEAD {
                    continue;
                }
                n += st.deliver_to(*id, now, &mut batch, chan, policy);
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

/// Before serving subscribers `ids[k..k + PREFETCH_GROUP]`, brings in what the next two groups
/// will touch: the connection records of the group after next (their slab entries span up to
/// four cache lines), and, for the next group, whose records came in one group ago, the slot
/// each queue stores its next frame at (`Session::next_slot`). At 10,000 subscribers the
/// records and queues outgrow the core's L2; fetched one subscriber at a time, a record's miss
/// was met mid-delivery and stalled the pass (`perf annotate` of a saturated core: a fifth of
/// the server's time on the instruction after the per-subscriber prefetch). Done for a group
/// in a short loop, the misses are in flight together.
fn prefetch_group(st: &mut CoreState, ids: &[ConnId], k: usize) {
    let far = ids.iter().skip(k + 2 * PREFETCH_GROUP).take(PREFETCH_GROUP);
    for id in far {
        if let Some(c) = st.conns.get(*id) {
            let p: *const u8 = (c as *const super::conn::Conn).cast();
            let size = std::mem::size_of::<super::conn::Conn>();
            for at in (0..size).step_by(64).chain([size - 1]) {
                prefetch(p.wrapping_add(at));
            }
        }
    }
    let near = ids.iter().skip(k + PREFETCH_GROUP).take(PREFETCH_GROUP);
    for id in near {
        if let Some(c) = st.conns.get(*id) {
            prefetch(c.session.next_slot());
        }
    }
}

/// Asks the CPU to bring the cache line at `p` in, for a store soon; never faults, whatever
/// `p` is (a prefetch of an unmapped address is dropped). A no-op off x86-64.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault (Intel SDM, PREFETCHh).
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
