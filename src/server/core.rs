//! One core's state and what it does with it: the connections' sessions, the local
//! subscription index, the broker, the way to other cores, the clock and the drain.
//! Everything here runs on the core's own thread, without locks.
//!
//! The core is the sessions' environment: it feeds them input, deadlines and deliveries
//! through [`CoreState::with_session`] (which files each session's next deadline in the timer
//! wheel and notes who has bytes to send), acts on what they hand up (pub/sub requests, HTTP
//! requests), and writes what they queued with [`CoreState::flush`] through `server::io`
//! (the send path is `server::flush`).
//! Readiness comes from the core's [`Reactor`] (one epoll set, one task for every connection);
//! the core owns each connection's socket and closes it at [`CoreState::teardown`].

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use bytes::Bytes;
use slab::Slab;

use super::broker::{Broker, Request};
use super::bus::{ConnRef, CoreMsg, Endpoint, Router};
use super::clock::Clock;
use super::conn::{session_config, Conn, ConnId, IoFlags};
use super::encodings::Batch;
use super::local::LocalChannels;
use super::metrics::CoreMetrics;
use super::reactor::Reactor;
use super::requests::Waiting;
use super::timer::TimerWheel;
use super::{io as sock, Shared};
use crate::auth::grants::Grants;
use crate::published::Encoding;
use crate::session::replay::Fetch;
use crate::session::{Ctx, Event, Events, HandshakeFailure, Overflow, ReapReason, Session, SessionConfig, State};
use crate::tick::{heartbeat_slot, Tick};
use crate::ws::codec::CloseCode;
use crate::ws::deflate::Deflate;

/// Size of the per-core read buffer. Reads never go to per-connection memory.
pub const SCRATCH_BYTES: usize = 64 * 1024;

/// Scratch buffers read from one connection per readiness, for fairness between connections.
const READS_PER_WAKE: usize = 4;

thread_local! {
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; SCRATCH_BYTES].into_boxed_slice());
}

/// The connections of one core.
#[derive(Default)]
pub struct Conns {
    /// Connections by slab key.
    pub slab: Slab<Conn>,
    next_gen: u32,
    /// Connections with frames queued and not yet written, in the order they were queued to
    /// (each listed once, [`IoFlags::DIRTY`]); written from the front a chunk at a time
    /// ([`CoreState::flush_some`]).
    pub dirty: VecDeque<ConnId>,
    /// The ids of the chunk being written (kept for its capacity).
    pub flushing: Vec<ConnId>,
    /// The processor is writing the dirty list a chunk at a time and yields between chunks:
    /// the clock leaves what it queues to it rather than writing the whole list at once.
    pub writing: bool,
    /// Publishing connections whose reads are paused until the overload clears.
    pub held: Vec<ConnId>,
}

/// The connection `id` in `slab`, if it is still the same connection.
pub(super) fn conn(slab: &mut Slab<Conn>, id: ConnId) -> Option<&mut Conn> {
    slab.get_mut(id.key as usize).filter(|c| c.gen == id.gen)
}

/// Files the deadline of connection `id`'s session in the timer wheel when it moved since it
/// was last filed (an entry whose tick no longer matches `armed` is ignored when it fires). A
/// heartbeat deadline is filed on the heartbeat grid of `slack` ticks ([`heartbeat_slot`]) so
/// that one clock wake-up handles a batch of them.
pub(super) fn arm(wheel: &mut TimerWheel, slack: Tick, id: ConnId, c: &mut Conn) {
    let due = c.session.poll_timeout();
    let due = if c.session.deadline_is_heartbeat() { heartbeat_slot(due, slack) } else { due };
    if due != c.armed {
        c.armed = due;
        super::tick::due_at(wheel.schedule(id, due));
    }
}

/// Hands the session's wish to be looked at by its I/O owner ([`Session::poll_wake`]: it
/// closed, or a hold on its reads cleared) to the reactor.
pub(super) fn notice(reactor: &mut Reactor, id: ConnId, c: &mut Conn) {
    if c.session.poll_wake() {
        reactor.schedule(id, c);
    }
}

impl Conns {
    /// The connection `id`, if it is still the same connection.
    pub fn get(&mut self, id: ConnId) -> Option<&mut Conn> {
        conn(&mut self.slab, id)
    }
}

/// Where this core is in the drain.
#[derive(Default)]
pub struct Drain {
    /// The drain has started here: the listener is closed, closes are scheduled.
    pub started: bool,
    /// The drain is over: the clock task returns and the core stops.
    pub done: bool,
    /// When the drain gives up waiting for close answers.
    pub deadline: Option<Tick>,
    /// Waker of the accept loop, woken when the drain starts.
    pub accept_waker: Option<Waker>,
}

/// One core's state. Borrowed mutably only between awaits.
pub struct CoreState {
    /// This core's index.
    pub me: usize,
    /// Process-wide configuration, metrics and flags.
    pub shared: Arc<Shared>,
    /// The connections.
    pub conns: Conns,
    /// Local subscription index.
    pub local: LocalChannels,
    /// The home side of channels.
    pub broker: Box<dyn Broker>,
    /// The way to other cores (and to this one, in order).
    pub router: Router,
    /// The clock and the timer wheel.
    pub clock: Clock,
    /// The readiness source of every connection of this core (one epoll set).
    pub reactor: Reactor,
    /// The drain.
    pub drain: Drain,
    /// The local channel a delivery is walking right now (no compaction there meanwhile).
    pub active_chan: Option<u32>,
    /// `GET /connections` and `GET /status.json` requests gathering rows from every core.
    pub inspects: Vec<super::http::inspect::Gathering>,
    /// The grants of this core's authenticated connections, interned (docs/security.md).
    pub grants: Grants,
    /// Publishes of the feeds thread handed to this core, and those waiting for an answer.
    pub feeds: super::feed_port::FeedInbox,
    /// The send ring of `io.send_batch = "io_uring"` (`server::flush`); `None`: one
    /// `sendmsg(2)` per connection.
    pub(super) sends: Option<super::io::batch::SendBatch>,
    /// The buffer small frames are copied into before a `sendmsg(2)` (`server::flush`).
    pub(super) gather: super::io::Gather,
    /// What a session hands up in one call, lent to it and emptied right after (kept to reuse
    /// its allocation).
    events: Events,
    /// Requests waiting behind an unanswered `sub` or `pub` (`server::requests`).
    pub waiting: Waiting,
    /// The server API's state at this core (`server::control`): revocations, token ids,
    /// requests gathering answers.
    pub api: super::control::ApiState,
    /// Token bucket for `accept_rate` (tokens, last refill in ms).
    rate: (f64, u64),
    /// The state of this core's TLS connections, by slab key (`server::tls`).
    pub tls: super::tls::TlsConns,
}

impl CoreState {
    /// Fresh state for core `me` with its share of the broker (`broker::open`) and its
    /// readiness source `reactor`; `start` is the process's clock origin.
    pub fn new(
        me: usize,
        shared: Arc<Shared>,
        ep: Endpoint,
        start: Instant,
        broker: Box<dyn Broker>,
        reactor: Reactor,
    ) -> CoreState {
        let cfg = &shared.config;
        let session_cfg: SessionConfig = session_config(cfg);
        CoreState {
            me,
            conns: Conns::default(),
            local: LocalChannels::default(),
            broker,
            router: Router::new(me, ep, shared.clone()),
            clock: Clock::new(start, session_cfg, Deflate::new(cfg.compression.deflate())),
            reactor,
            drain: Drain::default(),
            active_chan: None,
            inspects: Vec::new(),
            grants: Grants::default(),
            feeds: super::feed_port::FeedInbox::new(&shared.feed_ports, me),
            sends: super::flush::send_ring(me, cfg.io.send_batch),
            gather: Default::default(),
            events: Events::default(),
            waiting: Waiting::default(),
            api: Default::default(),
            rate: (cfg.accept_rate as f64, 0),
            tls: Default::default(),
            shared,
        }
    }

    /// This core's metrics.
    pub fn metrics(&self) -> &CoreMetrics {
        &self.shared.metrics[self.me]
    }

    /// The connection `id`, if it is still the same connection.
    pub fn conn(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.conns.get(id)
    }

    /// The session of connection `id`, if it is still the same connection.
    pub fn session(&mut self, id: ConnId) -> Option<&mut Session> {
        self.conns.get(id).map(|c| &mut c.session)
    }

    /// Runs `f` on session `id` at the current tick, then files its deadline in the timer
    /// wheel when it moved, and lists it for the next flush when it has bytes to send.
    /// `None` when the connection is gone.
    pub fn with_session<R>(&mut self, id: ConnId, f: impl FnOnce(&mut Session, &Ctx) -> R) -> Option<R> {
        let now = self.clock.now();
        self.with_session_at(id, now, f)
    }

    /// [`CoreState::with_session`] at a tick the caller read once for many sessions (a
    /// fan-out chunk), sparing a clock read per delivery.
    pub fn with_session_at<R>(&mut self, id: ConnId, now: Tick, f: impl FnOnce(&mut Session, &Ctx) -> R) -> Option<R> {
        let ctx = Ctx {
            now,
            cfg: &self.clock.cfg,
            stats: &self.shared.metrics[self.me].session,
            deflate: &self.clock.deflate,
        };
        let c = conn(&mut self.conns.slab, id)?;
        let r = f(&mut c.session, &ctx);
        arm(&mut self.clock.wheel, self.clock.heartbeat_slack, id, c);
        notice(&mut self.reactor, id, c);
        if c.session.has_output() && !c.io.has(IoFlags::DIRTY) {
            c.io.set(IoFlags::DIRTY);
            self.conns.dirty.push_back(id);
        }
        Some(r)
    }

    /// Takes a freshly accepted socket `fd` (owned from now on: closed at
    /// [`CoreState::teardown`]) and registers it with the reactor; returns its id. `tls`: it
    /// was accepted on a TLS listener, whose handshake starts with this configuration. Errors:
    /// the registration failed (`ENOSPC` at `fs.epoll.max_user_watches`, `ENOMEM`), or rustls
    /// refused to start a connection; the socket is closed then.
    pub fn insert_conn(&mut self, fd: RawFd, tls: Option<Arc<rustls::ServerConfig>>) -> io::Result<ConnId> {
        let tls = match tls.map(super::tls::TlsConn::new).transpose() {
            Ok(t) => t,
            Err(e) => {
                sock::close(fd);
                return Err(io::Error::other(e));
            }
        };
        self.conns.next_gen = self.conns.next_gen.wrapping_add(1);
        let gen = self.conns.next_gen;
        let mut c = Conn::new(gen, fd, self.clock.now(), &self.clock.cfg);
        if tls.is_some() {
            c.io.set(IoFlags::TLS);
        }
        let due = c.armed;
        let id = ConnId { key: self.conns.slab.insert(c) as u32, gen };
        if let Err(e) = self.reactor.register(fd, id) {
            self.conns.slab.remove(id.key as usize);
            sock::close(fd);
            return Err(e);
        }
        if let Some(t) = tls {
            self.tls.put(id.key, Box::new(t));
            self.metrics().tls.connections.fetch_add(1, Relaxed);
        }
        super::tick::due_at(self.clock.wheel.schedule(id, due));
        Ok(id)
    }

    /// The socket of `id` is readable: reads what it has into the core's scratch buffer and
    /// feeds it to the session, at most `READS_PER_WAKE` full buffers (the rest is marked
    /// [`IoFlags::READ_PENDING`] and read on the reactor's next pass). Once the socket reported
    /// the end of its input ([`IoFlags::INPUT_ENDED`]) it reads on to the EOF or error, which
    /// ends the connection.
    pub fn on_readable(&mut self, id: ConnId) {
        let Some(fd) = self.conn(id).map(|s| s.fd) else { return };
        // What the last turn left undecoded ([`MESSAGES_PER_TURN`](crate::session::MESSAGES_PER_TURN)) goes first.
        if self.session(id).is_some_and(|s| s.has_input() && !matches!(s.state(), State::Http(_))) {
            self.on_bytes(id, &[]);
            if self.turn_ended(id) {
                return;
            }
        }
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            if self.conn(id).is_some_and(|c| c.io.has(IoFlags::TLS)) {
                return self.read_tls(id, fd, &mut scratch, READS_PER_WAKE);
            }
            for _ in 0..READS_PER_WAKE {
                let n = match sock::recv(fd, &mut scratch) {
                    Ok(0) => return self.end(id, ReapReason::Eof),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(_) => return self.end(id, ReapReason::Reset),
                };
                self.on_bytes(id, &scratch[..n]);
                if self.turn_ended(id) {
                    return;
                }
                let Some(c) = self.conn(id).filter(|c| !c.session.is_closed()) else { return };
                // A short read took everything: a later arrival is a new edge. Not so the
                // peer's FIN reported with these bytes: the next recv returns it (0), unless
                // the reads are held now (an HTTP answer owed): then when the hold clears.
                if n < scratch.len() {
                    if c.io.has(IoFlags::INPUT_ENDED) && !super::reactor::read_held(self, id) {
                        continue;
                    }
                    if let Some(c) = self.conn(id).filter(|c| c.io.has(IoFlags::INPUT_ENDED)) {
                        c.io.set(IoFlags::READ_PENDING);
                    }
                    return;
                }
            }
            if let Some(c) = conn(&mut self.conns.slab, id) {
                c.io.set(IoFlags::READ_PENDING);
                self.reactor.schedule(id, c);
            }
        })
    }

    /// Whether `id`'s session stopped decoding for [`MESSAGES_PER_TURN`](crate::session::MESSAGES_PER_TURN): it is then listed
    /// for the reactor's next pass, and its socket not read further now.
    fn turn_ended(&mut self, id: ConnId) -> bool {
        match conn(&mut self.conns.slab, id) {
            Some(c) if c.io.has(IoFlags::READ_PENDING) && !c.session.is_closed() => {
                self.reactor.schedule(id, c);
                true
            }
            _ => false,
        }
    }

    /// Reads the input waiting for `id` when its deadline would judge the peer silent
    /// ([`Session::timeout_awaits_input`]) and its reads are not held: input already reported
    /// and not yet read ([`IoFlags::READ_PENDING`]), or input the reactor has not taken yet (a
    /// peek of the socket).
    fn read_before_timeout(&mut self, id: ConnId) {
        let now = self.clock.now();
        let Some(c) = self.conn(id) else { return };
        if !c.session.timeout_awaits_input(now) || !(c.io.has(IoFlags::READ_PENDING) || sock::has_input(c.fd)) {
            return;
        }
        if super::reactor::read_held(self, id) {
            // Input waits but this core does not read it now (e.g. an overloaded server holds
            // its publishers): the peer is not silent, and a pong it sent in time stays unread
            // only because of us.
            if let Some(s) = self.session(id) {
                s.input_waits();
            }
            return;
        }
        if let Some(c) = self.conn(id) {
            c.io.clear(IoFlags::READ_PENDING);
        }
        self.on_readable(id);
    }

    /// Ends `id` at once (EOF, socket error); the reactor tears it down.
    pub fn end(&mut self, id: ConnId, why: ReapReason) {
        if let Some(c) = conn(&mut self.conns.slab, id) {
            c.session.kill(why);
            notice(&mut self.reactor, id, c);
        }
    }

    /// Bytes read from `id`: the session decodes them; the core serves what it hands up
    /// (HTTP requests, pub/sub requests), logs what it reports of the peer, and writes the
    /// answers.
    pub fn on_bytes(&mut self, id: ConnId, data: &[u8]) {
        let mut events = std::mem::take(&mut self.events);
        let Some((state, turn_ended)) = self.with_session(id, |s, ctx| {
            s.handle_bytes(ctx, data, &mut events);
            (s.state(), s.poll_turn_ended())
        }) else {
            return;
        };
        if turn_ended {
            // The rest of its input waits for the reactor's next pass (MESSAGES_PER_TURN).
            if let Some(c) = self.conn(id) {
                c.io.set(IoFlags::READ_PENDING);
            }
        }
        if let State::Http(_) = state {
            self.serve_pending(id);
        }
        let mut serving = true;
        while let Some(event) = events.poll_event() {
            match event {
                Event::Request(req) => {
                    // A connection this server is closing (a limit, an error) serves no more
                    // requests; those sent before the peer's own close still count.
                    serving = serving
                        && self.session(id).is_some_and(|s| !matches!(s.state(), State::ClosingByUs | State::Closed));
                    if serving {
                        self.serve_request(id, req);
                    }
                }
                Event::PeerClosed { code, reason } => {
                    super::events::peer_closed(self.me, self.conn(id).map(|c| c.fd), code, &reason)
                }
                Event::Refused(e) => super::events::message_refused(self.me, self.conn(id).map(|c| c.fd), &e),
            }
        }
        self.events = events;
        self.flush(id);
    }

    /// A publish by connection `reply` (a WebSocket `pub` or an HTTP publish).
    pub fn publish(&mut self, reply: ConnId, ch: &str, id: Option<Box<str>>, data: Bytes) {
        if let Some(c) = self.conn(reply) {
            c.io.set(IoFlags::PUBLISHER);
        }
        let reply = Some(ConnRef { core: self.me as u16, id: reply });
        self.broker.request(&mut self.router, Request::Publish { ch: ch.into(), id, data, reply, fence: None });
    }

    /// Hands a fetch of the next replay batch of `conn` to the broker.
    pub fn fetch(&mut self, conn: ConnId, f: Fetch) {
        let conn = ConnRef { core: self.me as u16, id: conn };
        self.broker.request(&mut self.router, Request::Fetch { ch: f.ch, conn, after: f.after, until: f.until });
    }

    /// Queues a reply frame on `id` and writes it at once.
    pub fn reply(&mut self, id: ConnId, frame: Bytes) {
        self.with_session(id, |s, ctx| s.reply(ctx, frame));
        self.flush(id);
    }

    /// A deadline filed for `id` at tick `due` came. A deadline that would end the connection
    /// for want of input (a pong, a request head, a close frame) first reads what already waits
    /// in its socket: under a backlog the clock can run before the reactor has handed this
    /// core's input to its sessions, and a peer whose answer arrived in time is not reaped.
    pub fn on_timer(&mut self, id: ConnId, due: Tick) {
        if self.conn(id).is_none_or(|c| c.armed != due) {
            return; // the deadline moved, or the slot holds another connection
        }
        self.read_before_timeout(id);
        if self.conn(id).is_none_or(|c| c.armed != due || c.session.is_closed()) {
            return; // what was read moved the deadline, or ended the connection
        }
        let drain = self.shared.drain_code();
        let timed_out = self.with_session(id, |s, ctx| {
            s.handle_timeout(ctx, drain, &mut rand::rng());
            s.is_closed() && s.reap_reason() == Some(ReapReason::HandshakeTimeout)
        });
        if timed_out == Some(true) {
            let fd = self.conn(id).map(|c| c.fd);
            super::events::handshake_failed(
                self.me,
                fd,
                HandshakeFailure::Timeout,
                None,
                "no complete request head in time",
            );
        }
    }

    /// Queues the frames of `batch` (messages of local channel `chan`, in seq order), in the
    /// encoding `id` takes (an SSE stream's events among them), on `id` under `policy` at tick `now` (a fan-out delivery); returns
    /// how many were queued. The session is visited
    /// once for all of them. An overflow that closes the connection is logged.
    pub fn deliver_to(&mut self, id: ConnId, now: Tick, batch: &mut Batch, chan: u32, policy: Overflow) -> u64 {
        let r = self.with_session_at(id, now, |s, ctx| {
            let open = s.state().can_write();
            let mut queued = 0;
            for f in batch.frames(s.encoding(), ctx) {
                queued += u64::from(s.enqueue(ctx, f.clone(), chan, Some(policy)));
            }
            (queued, open && !s.state().can_write())
        });
        let Some((queued, closed)) = r else { return 0 };
        if closed {
            let (cfg, fd) = (&self.clock.cfg, self.conns.slab[id.key as usize].fd);
            super::events::overflow_closed(self.me, fd, cfg.queue_max_bytes, cfg.queue_max_messages);
        }
        queued
    }

    /// Removes connection `id` and every trace of it: subscriptions, queue, gauge, its
    /// registration with the reactor and its socket (closed).
    pub fn teardown(&mut self, id: ConnId) {
        if self.conn(id).is_none() {
            return;
        }
        let c = self.conns.slab.remove(id.key as usize);
        let (s, metrics) = (&c.session, &self.shared.metrics[self.me]);
        let why = s.reap_reason().unwrap_or(ReapReason::Eof);
        if s.is_upgraded() {
            metrics.connections.fetch_sub(1, Relaxed);
            if s.is_sse() {
                metrics.sse_connections.fetch_sub(1, Relaxed);
            }
            self.shared.open.fetch_sub(1, Relaxed);
            metrics.reaped(why);
            super::events::reaped(self.me, c.fd, why);
            if why.is_abnormal() {
                metrics.session.close(CloseCode::Abnormal);
            }
            if s.drain_scheduled() {
                metrics.session.drain_remaining.fetch_sub(1, Relaxed);
            }
            if s.encoding() == Encoding::Deflate {
                metrics.session.deflate_connections.fetch_sub(1, Relaxed);
            }
        } else if why == ReapReason::HandshakeTimeout {
            metrics.reaped(why);
        }
        if let Some(g) = s.grant() {
            self.release_grant(g);
        }
        for e in c.subs {
            self.drop_sub(id, e);
        }
        self.waiting.forget(id);
        self.api.forget(id);
        if c.io.has(IoFlags::TLS) {
            self.tls_teardown(id, c.fd, why);
        }
        // Last: the log lines above name the peer, asked of the socket.
        self.reactor.deregister(id);
        sock::close(c.fd);
        if self.conns.slab.is_empty() {
            self.reclaim_if_spare();
        }
    }

    /// Closes the socket of every connection left when the core stops (the drain's deadline
    /// passed with peers that never answered), without counting them as reaped.
    pub fn close_all(&mut self) {
        for (key, c) in self.conns.slab.iter() {
            self.reactor.deregister(ConnId { key: key as u32, gen: c.gen });
            sock::close(c.fd);
        }
        self.conns.slab.clear();
        self.tls = Default::default();
    }

    /// One token of the `accept_rate` bucket (always granted when the rate is 0).
    pub fn take_accept_token(&mut self) -> bool {
        let per_s = self.shared.config.accept_rate as f64 / self.shared.cores as f64;
        if per_s <= 0.0 {
            return true;
        }
        let now = self.clock.now_ms();
        let (tokens, last) = self.rate;
        let tokens = (tokens + (now - last) as f64 * per_s / 1000.0).min(per_s.max(1.0));
        self.rate = if tokens >= 1.0 { (tokens - 1.0, now) } else { (tokens, now) };
        tokens >= 1.0
    }

    /// Handles one message for this core, except `Deliver` (the processor walks subscriber
    /// lists itself so it can yield between chunks).
    pub fn handle(&mut self, msg: CoreMsg) {
        match msg {
            CoreMsg::Published { reply, ch, id, result } => self.published(reply.id, &ch, id.as_deref(), result),
            CoreMsg::Subscribed { ch, conn, head, epoch, resume } => self.subscribed(&ch, conn, head, &epoch, resume),
            CoreMsg::Reset { ch, head, epoch, reason, oldest, until } => {
                self.reset_subscribers(&ch, head, &epoch, reason, oldest, until)
            }
            CoreMsg::ReplayBatch { ch, conn, frames, evicted } => {
                if let Some(Some(f)) = self.with_session(conn, |s, ctx| s.replay_batch(ctx, &ch, frames, evicted)) {
                    self.fetch(conn, f);
                }
                self.flush(conn);
            }
            CoreMsg::Inspect { reply, top } => {
                let (rows, load) = self.inspect(top);
                let presence = self.broker.presence_top(super::http::inspect::PRESENCE_TOP);
                self.router.to_core(reply.core as usize, CoreMsg::Inspected { reply, rows, load, presence });
            }
            CoreMsg::Inspected { reply, rows, load, presence } => self.inspected(reply.id, rows, load, presence),
            CoreMsg::PresenceAnswer { conn, ch, json } => self.answer_presence(conn, &ch, json),
            CoreMsg::PresenceDiff { ch, frame } => self.presence_diff(&ch, frame),
            CoreMsg::Deliver { .. } => unreachable!("the processor walks deliveries itself"),
            api => self.handle_api(api),
        }
    }
}
