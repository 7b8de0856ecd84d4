//! The thread-per-core engine.
//!
//! [`Server::start`] binds one `SO_REUSEPORT` listener per core and starts one thread per core,
//! each running its own monoio runtime (io_uring, or epoll when io_uring is unavailable or
//! `MONOIO_FORCE_LEGACY_DRIVER=1`). A core owns, and no one else touches: its listener, a slab
//! of compact per-connection state, its side of the subscription index, a timer wheel, and the
//! channels whose home it is. Cores exchange messages only through bounded queues
//! ([`bus`]).
//!
//! # Layout
//! - [`conn`]: the record of one connection in the core's slab: its sans-IO session
//!   (`tether_proto::session`: frames, the close handshake, heartbeats, the outbound queue and
//!   its overflow policies, resume replay pacing) beside its socket, generation, subscription
//!   list, timer entry and readiness conditions.
//! - [`listen`]: the `SO_REUSEPORT` listeners of each core and its accept loop (a TLS
//!   listener's connections start their handshake: [`tls`]).
//! - [`tls`]: TLS between the socket calls and the session (rustls' unbuffered API): the
//!   certificate in use, reloaded at `SIGHUP`, and each TLS connection's records.
//! - [`io`]: every socket call (`recv`, `sendmsg`, `shutdown`, `close`), and
//!   [`io::batch`]: the core's send ring (a chunk of `sendmsg`s per `io_uring_enter`).
//! - [`flush`]: the send path: writing what the sessions queued, one `sendmsg` per connection
//!   or a chunk at a time on the send ring (`io.send_batch`).
//! - [`reactor`]: the core's readiness source (one epoll set for every connection, slab key +
//!   generation as user data) and the one task that turns readiness into work.
//! - [`core`]: one core's state: sessions, clock, drain; feeds the sessions and writes what
//!   they queue.
//! - [`http`]: the HTTP side of a core: routing the upgrade and every HTTP endpoint
//!   ([`http::route`]), the admin guard ([`http::auth`]), `/feeds` ([`http::feeds`]), the
//!   status page ([`http::status`]), `GET /connections` ([`http::inspect`]) and the server
//!   API under `/api/` ([`http::api`]).
//! - [`subscribe`]: `sub`/`unsub` and the broker's confirmation, at the subscriber's core.
//! - [`presence`]: presence at the subscriber's core: the member a connection is, `presence`
//!   and `presence_stats` requests, and the delivery of join/leave windows.
//! - [`authorize`]: JWT auth at the core: the token of an upgrade, channel rights on
//!   `sub`/`pub`, `refresh`, and the core's table of interned grants.
//! - [`control`]: the server API at a core: the node-wide actions (disconnect, unsubscribe,
//!   revoke) applied to its connections, the revocations it checks, the `jti`s of its
//!   connections, and the API requests gathering answers from other cores.
//! - [`feed_port`]: the feeds thread's entry into the broker path (bounded, answered per
//!   publish).
//! - [`encodings`]: a batch of fan-out messages in the encodings this core's subscribers
//!   take (plain, permessage-deflate), one local copy per encoding, made when first needed.
//! - [`events`]: log lines about connections (handshake failures, reaps, overflow closes,
//!   drain progress), rate-limited per core.
//! - [`broker`]: the home side of channels behind the [`broker::Broker`] trait (seq, epoch,
//!   history, dedup), its vocabulary ([`broker::request`]), the [`broker::Outbox`] it answers
//!   through and [`broker::open`], which builds each core's broker; [`broker::memory`] is the
//!   embedded one.
//! - [`bus`]: the queues between cores and the messages they carry (the broker's requests
//!   for home cores, the cores' messages).
//! - [`local`]: channels at a subscriber's core: the subscriber lists.
//! - [`processor`]: the task that applies messages and fans frames out in chunks.
//! - [`tick`]: the per-core clock task, tickless (it sleeps until the next thing due):
//!   deadlines, sweeps and the staggered drain.
//! - [`timer`]: the timer wheel and its next due tick.
//! - [`metrics`]: per-core counters and the Prometheus rendering.
//!
//! The path of one publish: `reactor` (readable) → [`core::CoreState::on_bytes`] →
//! `session` (decode, request) → `core` (publish) → `broker` (home: seq, history, fan-out to
//! cores) → `processor` (deliver in chunks) → `session` (enqueue under the overflow policy) →
//! [`core::CoreState::flush_some`] (`flush`, a chunk of the dirty list at a time) → `io`
//! (`sendmsg`, or `io::batch`).

pub mod authorize;
pub mod broker;
pub mod bus;
pub mod clock;
pub mod conn;
pub mod control;
pub mod core;
pub mod encodings;
pub mod events;
pub mod feed_port;
pub mod flush;
pub mod http;
pub mod io;
pub mod listen;
pub mod local;
pub mod metrics;
pub mod presence;
pub mod processor;
pub mod reactor;
pub mod reclaim;
pub mod requests;
pub mod subscribe;
pub mod tick;
pub mod timer;
pub mod tls;
pub mod yielding;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use monoio::net::TcpListener;

pub use self::conn::ConnId;
use self::core::CoreState;
use crate::auth::Verifier;
use crate::config::{BrokerKind, Config};
use crate::ws::codec::CloseCode;
use bus::{Bus, Doorbell, Endpoint};
use metrics::CoreMetrics;

/// What every core shares: read-only configuration, per-core metrics, and the few flags that
/// must be seen process-wide.
pub struct Shared {
    /// The validated configuration.
    pub config: Config,
    /// Whether `GET /echo` is served (conformance suites).
    pub echo: bool,
    /// Number of cores (threads).
    pub cores: usize,
    /// One block of counters per core.
    pub metrics: Box<[CoreMetrics]>,
    /// One doorbell per core (wakes its processor).
    pub doorbells: Arc<[Doorbell]>,
    /// 0 while serving; the close code of the drain once shutdown began (see
    /// [`Shared::drain_code`]).
    drain: AtomicU16,
    /// Upgraded connections in the process (admission against `max_connections`).
    pub open: AtomicUsize,
    /// The broker's state and counters (`tether_broker_*`; `/readyz` is 503 while it is down).
    pub broker: metrics::BrokerMetrics,
    /// The process epoch: the memory broker creates every channel under it (16 random hex
    /// digits, new at each start), until a core rotates ([`broker::epoch`]).
    pub epoch: Arc<str>,
    /// Channels held by the process against `limits.max_channels` (`tether_channels`).
    pub channels: Arc<broker::cap::ChannelCap>,
    /// The JWT verifier when `[auth]` turns JWT auth on (docs/security.md); `None`: upgrades
    /// need no token.
    pub auth: Option<Verifier>,
    /// The feeds thread's queues into the cores ([`feed_port`]).
    pub feed_ports: feed_port::FeedPorts,
    /// The way to the feeds thread (admin requests, the drain).
    pub feed_commands: tokio::sync::mpsc::UnboundedSender<crate::feeds::runtime::Command>,
    /// The feed runtime's process-wide counters and per-feed progress (`tether_feed*`).
    pub feeds: crate::feeds::metrics::FeedMetrics,
    /// This process's node id (`<hostname>-<8 hex digits>`, new at every start): the
    /// `lease_owner` of its feeds' leases and the first part of its connections' presence
    /// client ids.
    pub node_id: Arc<str>,
    /// The certificate and key of new TLS handshakes when `[tls]` is set (reloaded at
    /// `SIGHUP`, [`Server::reload_tls`]); `None`: no TLS listener.
    pub tls: Option<Arc<tls::keys::Keys>>,
}

impl Shared {
    /// The close code of the drain in progress, `None` while serving.
    pub fn drain_code(&self) -> Option<CloseCode> {
        match self.drain.load(Relaxed) {
            0 => None,
            code => Some(CloseCode::from(code)),
        }
    }

    /// Whether the drain has begun.
    pub fn draining(&self) -> bool {
        self.drain.load(Relaxed) != 0
    }
}

/// The feeds thread's view of the process (docs/feeds.md): its publishes take the path of a
/// WebSocket publish through [`feed_port::FeedPorts`].
impl crate::feeds::FeedHost for Shared {
    fn config(&self) -> &Config {
        &self.config
    }

    fn node_id(&self) -> Arc<str> {
        self.node_id.clone()
    }

    fn metrics(&self) -> &crate::feeds::metrics::FeedMetrics {
        &self.feeds
    }

    fn commands(&self) -> &tokio::sync::mpsc::UnboundedSender<crate::feeds::runtime::Command> {
        &self.feed_commands
    }

    fn try_publish(&self, p: crate::feeds::FeedPublish) -> Result<(), crate::feeds::FeedPublish> {
        self.feed_ports.try_publish(p)
    }
}

/// Options of [`Server::start`] beyond the config file.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Serve the RFC 6455 echo endpoint `GET /echo`.
    pub echo: bool,
    /// The JWT verifier, already built from the config's `[auth]` with
    /// [`Verifier::from_config`] (which reads the key file: `tether serve` does it before
    /// starting so a bad key exits 2). `None`: [`Server::start`] builds it itself.
    pub auth: Option<Verifier>,
    /// The `[tls]` pair, already read with [`tls::keys::Keys::load`] (`tether serve` does it
    /// before starting so an unusable pair exits 2). `None`: [`Server::start`] reads it itself
    /// when `[tls]` is set.
    pub tls: Option<Arc<tls::keys::Keys>>,
}

/// A running server: its address, and the means to drain it and wait for its end.
pub struct Server {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    threads: Vec<JoinHandle<()>>,
    feeds: crate::feeds::runtime::FeedRuntime,
}

impl Server {
    /// Binds `config.listen` (port 0 picks a free port, shared by every core's listener) and
    /// starts `config.effective_cores()` core threads. Errors: another process already
    /// listens on the address (`AddrInUse`, "address ADDR is already in use by another
    /// process"), the address cannot be bound (the message names it), a runtime cannot be
    /// built, or (`InvalidInput`) `auth.jwt_public_key_file` is unusable when `opts.auth` is
    /// `None` (the message names the key).
    pub fn start(config: Config, opts: ServeOptions) -> std::io::Result<Server> {
        let auth = match opts.auth {
            Some(v) => Some(v),
            None => Verifier::from_config(config.auth.as_ref())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
        }
        .map(|v| v.with_info_limit(config.presence.info_max_bytes));
        let keys = match (opts.tls, &config.tls) {
            (Some(k), _) => Some(k),
            (None, Some(t)) => Some(Arc::new(
                tls::keys::Keys::load(t)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
            )),
            (None, None) => None,
        };
        let cores = config.effective_cores().max(1);
        let bus = Bus::new(cores);
        let (feed_commands, feed_rx) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            echo: opts.echo,
            cores,
            metrics: (0..cores).map(|_| CoreMetrics::default()).collect(),
            doorbells: bus.doorbells.clone(),
            drain: AtomicU16::new(0),
            open: AtomicUsize::new(0),
            broker: metrics::BrokerMetrics::new(config.broker.kind == BrokerKind::Memory),
            epoch: broker::epoch::new_epoch(),
            channels: Arc::new(broker::cap::ChannelCap::new(config.limits.max_channels)),
            auth,
            feed_ports: feed_port::FeedPorts::new(bus.doorbells.clone()),
            feed_commands,
            feeds: crate::feeds::metrics::FeedMetrics::default(),
            node_id: crate::feeds::runtime::new_node_id().into(),
            tls: keys,
            config,
        });
        let tls = shared.config.tls.as_ref();
        let (addr, listeners) = listen::bind_listeners(shared.config.listen, cores)?;
        // Each core's listeners, with whether each speaks TLS.
        let plain_is_tls = tls.is_some_and(|t| t.listen_tls.is_none());
        let mut listeners: Vec<Vec<(std::net::TcpListener, bool)>> =
            listeners.into_iter().map(|l| vec![(l, plain_is_tls)]).collect();
        let tls_addr = match tls.and_then(|t| t.listen_tls) {
            Some(at) => {
                let (bound, extra) = listen::bind_listeners(at, cores)?;
                for (core, l) in listeners.iter_mut().zip(extra) {
                    core.push((l, true));
                }
                Some(bound)
            }
            None => plain_is_tls.then_some(addr),
        };
        let brokers = broker::open(&shared)?;
        tracing::info!(%addr, listeners = cores, tls = plain_is_tls, "listening (one SO_REUSEPORT listener per core)");
        if let Some(at) = tls_addr.filter(|_| !plain_is_tls) {
            tracing::info!(addr = %at, listeners = cores, "listening for TLS (one SO_REUSEPORT listener per core)");
        }
        let start = Instant::now();
        let endpoints = bus.into_endpoints();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let mut threads = Vec::with_capacity(cores);
        for (i, ((listener, ep), broker)) in listeners.into_iter().zip(endpoints).zip(brokers).enumerate() {
            let shared = shared.clone();
            let ready = ready_tx.clone();
            let t = std::thread::Builder::new()
                .name(format!("tether-core-{i}"))
                .spawn(move || core_thread(i, shared, listener, ep, start, broker, ready))?;
            threads.push(t);
        }
        drop(ready_tx);
        for _ in 0..cores {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(std::io::Error::other("a core thread died while starting")),
            }
        }
        let feeds = crate::feeds::runtime::FeedRuntime::start(shared.clone(), feed_rx)?;
        Ok(Server { shared, addr, tls_addr, threads, feeds })
    }

    /// The bound address (with the real port when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address TLS is served on (`tls.listen_tls`, or `listen` when that speaks TLS);
    /// `None` without `[tls]`.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// Reads the `[tls]` certificate and key again (`SIGHUP`): new handshakes use the new pair,
    /// live connections keep theirs. Errors: no `[tls]` (nothing to reload), or the pair is
    /// unusable (the message names the file; the pair in use stays). Logged either way.
    pub fn reload_tls(&self) -> Result<(), String> {
        match &self.shared.tls {
            Some(k) => k.reload().map_err(|e| e.to_string()),
            None => Err("no [tls] section: nothing to reload".into()),
        }
    }

    /// Process-wide state (metrics, flags).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Begins the drain: `/readyz` turns 503, listeners close, every connection is closed with
    /// `code` (1012 restart, 1001 going away), spread over `drain.window_ms`, and every owned
    /// feed is stopped and its lease released (docs/feeds.md). A second call changes nothing.
    pub fn shutdown(&self, code: CloseCode) {
        if self.shared.drain.compare_exchange(0, code.into(), Relaxed, Relaxed).is_ok() {
            tracing::info!(code = u16::from(code), window_ms = self.shared.config.drain.window_ms, "draining");
            for d in self.shared.doorbells.iter() {
                d.ring();
            }
            self.feeds.shutdown();
        }
    }

    /// This process's node id (the `lease_owner` of the feeds it owns, docs/feeds.md).
    pub fn node_id(&self) -> &str {
        self.feeds.node_id()
    }

    /// The feed runtime, for the admin API.
    pub fn feeds(&self) -> &crate::feeds::runtime::FeedRuntime {
        &self.feeds
    }

    /// Waits until every core has drained (or its drain deadline passed) and the feeds
    /// thread has released the leases it held.
    pub fn wait(self) {
        self.feeds.join();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Pins the calling thread to the `i`-th CPU this process may run on (its affinity mask,
/// which cgroups and `taskset` narrow), wrapping around; returns the CPU number.
fn pin_to_cpu(i: usize) -> std::io::Result<usize> {
    // SAFETY: cpu_set_t is plain data; sched_{get,set}affinity(0) read and change only this
    // thread's mask.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &allowed)).collect();
        let Some(&cpu) = cpus.get(i % cpus.len().max(1)) else {
            return Err(std::io::Error::other("empty CPU affinity mask"));
        };
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(cpu)
    }
}

/// io_uring submission queue sizes tried in turn for a core's ring: a ring needs its SQ and CQ
/// arrays in kernel memory (about 1.5 MiB at 16,384 entries), which a fragmented or
/// memory-short kernel may refuse with ENOMEM; a smaller ring only submits in smaller batches.
const RING_ENTRIES: [u32; 3] = [16_384, 4_096, 1_024];

/// A core's monoio runtime, io_uring or epoll (each with its timer).
type CoreRuntime = monoio::FusionRuntime<
    monoio::time::TimeDriver<monoio::IoUringDriver>,
    monoio::time::TimeDriver<monoio::LegacyDriver>,
>;

/// The core's monoio runtime: io_uring when the kernel has it (epoll with
/// `MONOIO_FORCE_LEGACY_DRIVER=1`), retrying with a smaller ring when the kernel refuses one
/// ([`RING_ENTRIES`]), then falling back to epoll, each step logged as a warning. Errors: even
/// the epoll driver cannot be built (no descriptors left, say).
fn build_runtime(core: usize) -> std::io::Result<CoreRuntime> {
    let mut last = None;
    for entries in RING_ENTRIES {
        match monoio::RuntimeBuilder::<monoio::FusionDriver>::new().with_entries(entries).enable_timer().build() {
            Ok(rt) => return Ok(rt),
            Err(e) => {
                tracing::warn!(core, entries, error = %e, "cannot build the io_uring ring; trying a smaller one");
                last = Some(e);
            }
        }
    }
    let e = last.map_or_else(String::new, |e| e.to_string());
    tracing::warn!(core, error = %e, "no io_uring ring could be built; this core runs on epoll");
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().map(Into::into)
}

fn core_thread(
    i: usize,
    shared: Arc<Shared>,
    listeners: Vec<(std::net::TcpListener, bool)>,
    ep: Endpoint,
    start: Instant,
    broker: Box<dyn broker::Broker + Send>,
    ready: std::sync::mpsc::Sender<std::io::Result<()>>,
) {
    match pin_to_cpu(i) {
        Ok(cpu) => tracing::debug!(core = i, cpu, "core thread pinned"),
        Err(e) => {
            tracing::warn!(core = i, error = %e, "cannot pin the core thread to a CPU; the scheduler may move it")
        }
    }
    let mut rt = match build_runtime(i) {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let driver = match &rt {
        monoio::FusionRuntime::Uring(_) => "io_uring",
        monoio::FusionRuntime::Legacy(_) => "epoll",
    };
    tracing::info!(core = i, driver, "core started");
    rt.block_on(async move {
        let mut accepting = Vec::with_capacity(listeners.len());
        for (l, tls) in listeners {
            match TcpListener::from_std(l) {
                Ok(l) => accepting.push((l, tls)),
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            }
        }
        let reactor = match reactor::Reactor::new(shared.config.io.readiness) {
            Ok(r) => r,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        tracing::info!(
            core = i,
            readiness = reactor.kind(),
            deferred_task_work = reactor.deferred(),
            "readiness source ready"
        );
        let core = Rc::new(RefCell::new(CoreState::new(i, shared, ep, start, broker, reactor)));
        // First: the processor and the reactor yield to each other through it.
        yielding::spawn();
        monoio::spawn(processor::run(core.clone()));
        monoio::spawn(reactor::run(core.clone()));
        for (listener, tls) in accepting {
            monoio::spawn(listen::accept_loop(core.clone(), listener, tls));
        }
        let _ = ready.send(Ok(()));
        tick::run(core.clone()).await;
        core.borrow_mut().close_all();
    });
}

/// The open-file limit before and after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    /// Soft limit at start.
    pub before: u64,
    /// Soft limit now (the hard limit after a successful raise).
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit. `Ok` carries the limits as they are
/// now; `Err` when `getrlimit` or `setrlimit` failed (the soft limit is then unchanged).
pub fn raise_nofile() -> std::io::Result<Nofile> {
    // SAFETY: plain getrlimit/setrlimit on this process with a valid rlimit.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let before = r.rlim_cur;
        if before < r.rlim_max {
            let raised = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                let e = std::io::Error::last_os_error();
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("setrlimit(RLIMIT_NOFILE, {}) failed, soft limit stays {before}: {e}", r.rlim_max),
                ));
            }
        }
        Ok(Nofile { before, soft: r.rlim_max, hard: r.rlim_max })
    }
}

fn term_and_int() -> libc::sigset_t {
    // SAFETY: plain sigset manipulation on a local value.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (and the threads it starts later),
/// so [`wait_signal`] can take them synchronously. Errors: `pthread_sigmask` failed (then the
/// signals keep their default action, ending the process without a drain).
pub fn block_signals() -> std::io::Result<()> {
    let set = term_and_int();
    // SAFETY: a valid set; a null old-set pointer is allowed.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    // pthread functions return the error number instead of setting errno.
    if r != 0 {
        return Err(std::io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Waits for SIGTERM, SIGINT or SIGHUP (blocked by [`block_signals`]); returns the signal
/// number.
/// Errors: `sigwait` failed.
pub fn wait_signal() -> std::io::Result<i32> {
    let set = term_and_int();
    let mut sig = 0;
    loop {
        // SAFETY: a valid set and a valid out pointer.
        let r = unsafe { libc::sigwait(&set, &mut sig) };
        match r {
            0 => return Ok(sig),
            libc::EINTR => continue,
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
    }
}
