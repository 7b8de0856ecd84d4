//! The feed runtime (docs/feeds.md): one thread per process running a small tokio runtime
//! (like the Redis broker's thread) that decides which feeds this node owns.
//!
//! - **Reconcile** at start, every `reconcile_ms`, and at once for a feed announced on the
//!   store's release notification: acquire each STARTED feed whose lease is free, start its
//!   owner task ([`super::owner`]); stop owned feeds that are STOPPED, deleted, or whose lease
//!   the store no longer shows as ours.
//! - **Renew** every `renew_ms` all owned leases in one batched call (`renew_many`: one Redis
//!   script per 500 leases, one DynamoDB transaction per 100), storing the last published
//!   upstream seq with each (not per message), then read the owned feeds back (one
//!   `get_many`) so a STOPPED or deleted feed is stopped within one renew interval (and a
//!   STOPPED one released).
//! - **Give up in time**: a feed whose lease was not renewed by `lease_expires_at_ms -
//!   skew_margin_ms` (this node's clock) has its upstream connection closed at once, before
//!   any other node can acquire it, provided the nodes' clocks agree within the margin.
//! - **Drain**: on [`FeedRuntime::shutdown`] every owned feed is stopped, its `last_seq`
//!   written and its lease released (expiry 0), so another node takes it at once.
//!
//! The node id ([`FeedRuntime::node_id`]) is random per process and logged at start; it is the
//! `lease_owner` of every lease this process takes.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::host::FeedHost;
use super::metrics::FeedProgress;
use super::owner::{Owner, OwnerEvent};
use super::record::{DesiredState, Feed, FeedDef};
use super::store::{AnyStore, LeaseStore, LeaseTerm, Renewal};
use super::LeaseError;
use crate::config::Feeds as FeedsConfig;

pub use super::admin::{AdminReply, AdminRequest};

/// How long a graceful stop (close the upstream) may take before the owner task is aborted.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Wait between attempts to open the lease store at start.
const OPEN_RETRY: Duration = Duration::from_secs(1);
/// Acquires in flight at once when several feeds are free together (a reconcile after a node
/// left, a burst of release notifications from a draining node): 1,000 free feeds take about
/// 32 waves of two store round trips instead of 2,000 round trips in a row.
const ACQUIRE_CONCURRENCY: usize = 32;

/// What the rest of the process asks of the feed runtime.
pub enum Command {
    /// Stop every owned feed, store its `last_seq`, release its lease, and end the thread.
    Shutdown,
    /// An admin API request (`/feeds`), answered through the callback.
    Admin(AdminRequest, Box<dyn FnOnce(AdminReply) + Send>),
}

/// The running feed runtime: its node id and the way to talk to its thread.
pub struct FeedRuntime {
    node_id: Arc<str>,
    commands: mpsc::UnboundedSender<Command>,
    thread: std::thread::JoinHandle<()>,
}

/// A random node id: `<hostname>-<8 hex digits>` (the hostname cut to 64 bytes and to
/// printable ASCII; `node` when unknown), new at every start.
pub fn new_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host.trim().chars().filter(|c| c.is_ascii_graphic()).take(64).collect();
    let host = if host.is_empty() { "node".to_owned() } else { host };
    format!("{host}-{:08x}", rand::random::<u32>())
}

impl FeedRuntime {
    /// Starts the feeds thread for `shared.config().feeds`. The store is opened in the
    /// background (retried every second while unreachable). Errors: the thread could not be
    /// spawned.
    /// `rx` is the receiving end of `shared.commands()` (the admin API's way in).
    pub fn start(shared: Arc<dyn FeedHost>, rx: mpsc::UnboundedReceiver<Command>) -> std::io::Result<FeedRuntime> {
        let node_id = shared.node_id();
        tracing::info!(node_id = %node_id, store = shared.config().feeds.store.as_str(), "feeds: node id (lease_owner of this process)");
        let commands = shared.commands().clone();
        let node = node_id.clone();
        let thread = std::thread::Builder::new().name("tether-feeds".into()).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "feeds: cannot build the runtime; no feed runs on this node");
                    return;
                }
            };
            rt.block_on(Supervisor::run(shared, node, rx));
        })?;
        Ok(FeedRuntime { node_id, commands, thread })
    }

    /// This process's node id, the `lease_owner` of its leases.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Hands `cmd` to the feeds thread; `false` when the thread has ended.
    pub fn send(&self, cmd: Command) -> bool {
        self.commands.send(cmd).is_ok()
    }

    /// Begins the drain of feeds (see [`Command::Shutdown`]); returns at once.
    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
    }

    /// Begins the drain of feeds if it has not begun, and waits for the feeds thread to end.
    pub fn join(self) {
        self.shutdown();
        let _ = self.thread.join();
    }
}

/// A feed this node owns.
struct Held {
    def: FeedDef,
    token: u64,
    /// The lease's end as last acquired or renewed (this node's clock, Unix ms).
    expires_ms: u64,
    progress: Arc<FeedProgress>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// A lease won by [`Supervisor::try_acquire`], before its owner task starts.
struct Won {
    /// The owner the store showed before (a takeover when set).
    previous_owner: Option<String>,
    def: FeedDef,
    token: u64,
    last_seq: Option<String>,
}

/// This node's clock: Unix epoch milliseconds (the lease times; docs/feeds.md, the clock assumption).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The feeds thread's state.
pub(super) struct Supervisor {
    pub(super) shared: Arc<dyn FeedHost>,
    pub(super) cfg: FeedsConfig,
    pub(super) node: Arc<str>,
    pub(super) store: AnyStore,
    held: HashMap<String, Held>,
    events: mpsc::UnboundedSender<OwnerEvent>,
}

/// The next released feed id; pending forever without a subscription, `None` when it ended.
async fn next_released(r: &mut Option<mpsc::UnboundedReceiver<String>>) -> Option<String> {
    match r {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

impl Supervisor {
    async fn run(shared: Arc<dyn FeedHost>, node: Arc<str>, mut commands: mpsc::UnboundedReceiver<Command>) {
        let store = loop {
            match AnyStore::open(shared.config()).await {
                Ok(s) => break s,
                Err(e) => tracing::warn!(error = %e, "feeds: cannot open the lease store; retrying"),
            }
            tokio::select! {
                _ = tokio::time::sleep(OPEN_RETRY) => {}
                c = commands.recv() => match c {
                    None | Some(Command::Shutdown) => return,
                    Some(Command::Admin(_, reply)) => reply(AdminReply::unavailable("the lease store is not reachable yet")),
                },
            }
        };
        shared.metrics().set_store_requests(store.requests().clone());
        let (events, mut owner_events) = mpsc::unbounded_channel();
        let cfg = shared.config().feeds.clone();
        let mut sup = Supervisor { shared, cfg, node, store, held: HashMap::new(), events };
        let mut statics_written = false;
        let mut released = None;
        let mut reconcile = tokio::time::interval(Duration::from_millis(sup.cfg.reconcile_ms));
        let mut renew = tokio::time::interval(Duration::from_millis(sup.cfg.renew_ms));
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let give_up_in = sup.next_give_up();
            tokio::select! {
                c = commands.recv() => match c {
                    None | Some(Command::Shutdown) => return sup.release_all().await,
                    Some(Command::Admin(req, reply)) => reply(sup.admin(req).await),
                },
                _ = reconcile.tick() => {
                    if !statics_written {
                        statics_written = sup.write_statics().await;
                    }
                    if released.is_none() {
                        released = sup.bounded(sup.store.released()).await.map_err(|e| tracing::warn!(error = %e, "feeds: no release notifications until the next reconcile")).ok();
                    }
                    sup.reconcile().await;
                }
                _ = renew.tick() => sup.renew_all().await,
                id = next_released(&mut released) => match id {
                    Some(id) => {
                        // A draining node releases all its feeds at once: take every
                        // notification already here and acquire them together.
                        let mut ids = vec![id];
                        while let Some(Ok(more)) = released.as_mut().map(|rx| rx.try_recv()) {
                            ids.push(more);
                        }
                        sup.acquire_released(ids).await;
                    }
                    None => released = None,
                },
                Some(OwnerEvent::Fenced { id, token }) = owner_events.recv() => {
                    if sup.held.get(&id).is_some_and(|h| h.token == token) {
                        sup.hard_stop(&id).await;
                    }
                }
                _ = tokio::time::sleep(give_up_in) => sup.give_up_overdue().await,
            }
        }
    }

    /// Time until the earliest `expires_ms - skew_margin_ms` of the owned feeds (an hour when
    /// none).
    fn next_give_up(&self) -> Duration {
        let now = now_ms();
        self.held
            .values()
            .map(|h| Duration::from_millis(h.expires_ms.saturating_sub(self.cfg.skew_margin_ms).saturating_sub(now)))
            .min()
            .unwrap_or(Duration::from_secs(3600))
    }

    /// This node's lease term at `now_ms`: `[feeds] lease_ms` from then.
    fn term(&self, now_ms: u64) -> LeaseTerm<'_> {
        LeaseTerm { owner: &self.node, now_ms, lease_ms: self.cfg.lease_ms }
    }

    /// A store call bounded by the renew interval, so a hung store never delays the give-up
    /// check (nor, for an admin request, the renews) by more than that. A call cut off so may
    /// have happened: [`LeaseError::Unknown`].
    pub(super) async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, LeaseError>>,
    ) -> Result<T, LeaseError> {
        let limit = Duration::from_millis(self.cfg.renew_ms.max(100));
        tokio::time::timeout(limit, f).await.unwrap_or_else(|_| Err(LeaseError::Unknown("timed out".into())))
    }

    /// Writes the `[[feeds.static]]` definitions; `true` once all are written.
    async fn write_statics(&self) -> bool {
        for def in &self.cfg.static_feeds {
            if let Err(e) = self.bounded(self.store.put(def)).await {
                tracing::warn!(feed = %def.id, error = %e, "feeds: cannot write a [[feeds.static]] feed; retrying at the next reconcile");
                return false;
            }
        }
        true
    }

    /// Reads every feed: acquires the free STARTED ones, stops owned ones that should not run
    /// here any more, restarts owned ones whose definition changed.
    pub(super) async fn reconcile(&mut self) {
        let now = now_ms();
        let feeds = match self.bounded(self.store.list()).await {
            Ok(f) => f,
            Err(e) => return tracing::warn!(error = %e, "feeds: reconcile cannot list the feeds"),
        };
        let listed: std::collections::HashSet<String> = feeds.iter().map(|f| f.def.id.clone()).collect();
        let gone: Vec<String> = self.held.keys().filter(|id| !listed.contains(*id)).cloned().collect();
        for id in gone {
            tracing::info!(feed = %id, "feeds: feed deleted; upstream closed");
            self.hard_stop(&id).await;
        }
        let (free, held): (Vec<Feed>, Vec<Feed>) = feeds.into_iter().partition(|f| !self.held.contains_key(&f.def.id));
        for f in held {
            self.check(f, now).await;
        }
        self.acquire_free(free, now).await;
    }

    /// Brings one feed read from the store in line: acquire, stop, or restart.
    async fn check(&mut self, f: Feed, now: u64) {
        let id = f.def.id.clone();
        let Some(h) = self.held.get(&id) else {
            return self.acquire_free(vec![f], now).await;
        };
        let ours = f.lease.lease_owner.as_deref() == Some(&*self.node) && f.lease.fencing_token == h.token;
        if !ours {
            tracing::warn!(feed = %id, owner = ?f.lease.lease_owner, token = f.lease.fencing_token, "feeds: lease taken over; upstream closed");
            self.hard_stop(&id).await;
        } else if f.def.desired_state == DesiredState::Stopped {
            self.stop_and_release(&id).await;
        } else if f.def != h.def {
            tracing::info!(feed = %id, "feeds: definition changed; reconnecting upstream");
            self.restart(f.def).await;
        }
    }

    /// [`Supervisor::check`] at this moment.
    pub(super) async fn check_one(&mut self, f: Feed) {
        self.check(f, now_ms()).await
    }

    /// On release notifications: acquires those of `ids` that are STARTED and free (one
    /// `get_many`, then [`Supervisor::acquire_free`]).
    async fn acquire_released(&mut self, mut ids: Vec<String>) {
        ids.retain(|id| !self.held.contains_key(id));
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return;
        }
        let now = now_ms();
        match self.bounded(self.store.get_many(&ids)).await {
            Ok(feeds) => self.acquire_free(feeds.into_iter().flatten().collect(), now).await,
            Err(e) => {
                tracing::warn!(feeds = ids.len(), error = %e, "feeds: cannot read released feeds; the next reconcile takes them")
            }
        }
    }

    /// Acquires those of `feeds` (read at `now`, not held here) that are STARTED and whose
    /// lease is free, up to [`ACQUIRE_CONCURRENCY`] store calls at a time, and starts an owner
    /// task for each lease won. Past the first wave, new acquires begin only during half a renew
    /// interval, so a long list never holds up the renews and the give-up check for long: the
    /// feeds not tried are tried at the next reconcile.
    async fn acquire_free(&mut self, feeds: Vec<Feed>, now: u64) {
        use futures::stream::{self, StreamExt};
        let wanted = |f: &Feed| f.def.desired_state == DesiredState::Started && !f.lease.is_held(now);
        let feeds: Vec<Feed> = feeds.into_iter().filter(|f| wanted(f) && !self.held.contains_key(&f.def.id)).collect();
        if feeds.is_empty() {
            return;
        }
        let budget_end = tokio::time::Instant::now() + Duration::from_millis(self.cfg.renew_ms / 2);
        let this = &*self;
        let won: Vec<Won> = stream::iter(feeds)
            .enumerate()
            .take_while(|(i, _)| {
                std::future::ready(*i < ACQUIRE_CONCURRENCY || tokio::time::Instant::now() < budget_end)
            })
            .map(|(_, f)| this.try_acquire(f, now))
            .buffer_unordered(ACQUIRE_CONCURRENCY)
            .filter_map(std::future::ready)
            .collect()
            .await;
        for w in won {
            self.start_owned(w, now);
        }
    }

    /// Acquires `f`'s lease at `now` and reads the feed back; `None` when another node won it,
    /// it changed hands meanwhile, or the store failed (logged).
    async fn try_acquire(&self, f: Feed, now: u64) -> Option<Won> {
        let id = &f.def.id;
        let token = match self.bounded(self.store.acquire(id, self.term(now))).await {
            Ok(t) => t,
            Err(LeaseError::Held { .. }) | Err(LeaseError::NotFound) => return None,
            Err(e) => {
                tracing::warn!(feed = %id, error = %e, "feeds: acquire failed");
                return None;
            }
        };
        // Read back: last_seq is final now (renew and release need our token), and the
        // definition may have changed since the list.
        let (def, last_seq) = match self.bounded(self.store.get(id)).await {
            Ok(Some(g)) if g.lease.fencing_token == token => (g.def, g.lease.last_seq),
            Ok(_) => return None,
            Err(_) => (f.def.clone(), f.lease.last_seq.clone()),
        };
        Some(Won { previous_owner: f.lease.lease_owner, def, token, last_seq })
    }

    /// Starts the owner task of a lease won at `now`.
    fn start_owned(&mut self, w: Won, now: u64) {
        let Won { previous_owner, def, token, last_seq } = w;
        let id = def.id.clone();
        let metrics = self.shared.metrics();
        if let Some(prev) = previous_owner {
            metrics.takeovers.fetch_add(1, Relaxed);
            tracing::info!(feed = %id, token, previous_owner = %prev, last_seq = ?last_seq, "feeds: lease acquired (takeover)");
        } else {
            tracing::info!(feed = %id, token, last_seq = ?last_seq, "feeds: lease acquired");
        }
        let progress = metrics.progress(&id);
        progress.set_last_seq(last_seq);
        progress.last_message_ms.store(now, Relaxed);
        progress.owned.store(true, Relaxed);
        metrics.owned.fetch_add(1, Relaxed);
        let (stop, task) = self.spawn_owner(def.clone(), token, progress.clone());
        self.held.insert(id, Held { def, token, expires_ms: now + self.cfg.lease_ms, progress, stop, task });
    }

    fn spawn_owner(
        &self,
        def: FeedDef,
        token: u64,
        progress: Arc<FeedProgress>,
    ) -> (watch::Sender<bool>, JoinHandle<()>) {
        let (stop, stop_rx) = watch::channel(false);
        let owner =
            Owner { def, token, progress, shared: self.shared.clone(), stop: stop_rx, events: self.events.clone() };
        (stop, tokio::spawn(owner.run()))
    }

    /// Replaces the owner task of a held feed with one for `def` (same lease).
    async fn restart(&mut self, def: FeedDef) {
        let Some(h) = self.held.get_mut(&def.id) else { return };
        let _ = h.stop.send(true);
        let old = std::mem::replace(&mut h.task, tokio::spawn(async {}));
        graceful(old).await;
        let (token, progress) = (h.token, h.progress.clone());
        let (stop, task) = self.spawn_owner(def.clone(), token, progress);
        if let Some(h) = self.held.get_mut(&def.id) {
            (h.def, h.stop, h.task) = (def, stop, task);
        }
    }

    /// Renews every owned lease in one `renew_many`, storing each feed's last published
    /// upstream seq, then reads the owned feeds back to stop the STOPPED and deleted ones.
    pub(super) async fn renew_all(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let now = now_ms();
        let args: Vec<(String, u64, Option<String>)> =
            self.held.iter().map(|(id, h)| (id.clone(), h.token, h.progress.last_seq())).collect();
        let leases: Vec<Renewal<'_>> =
            args.iter().map(|(id, token, seq)| Renewal { id, token: *token, last_seq: seq.as_deref() }).collect();
        let results = match self.bounded(self.store.renew_many(self.term(now), &leases)).await {
            Ok(results) => results,
            Err(e) => {
                self.shared.metrics().renew_failures.fetch_add(leases.len() as u64, Relaxed);
                tracing::warn!(feeds = leases.len(), error = %e, "feeds: renew failed; each upstream closes at its lease end - skew_margin_ms unless a renew succeeds");
                Vec::new()
            }
        };
        let results: Vec<(String, Result<(), LeaseError>)> =
            args.iter().map(|(id, ..)| id.clone()).zip(results).collect();
        for (id, r) in results {
            match r {
                Ok(()) => {
                    if let Some(h) = self.held.get_mut(&id) {
                        h.expires_ms = now + self.cfg.lease_ms;
                    }
                }
                Err(e @ (LeaseError::Lost { .. } | LeaseError::NotFound)) => {
                    self.shared.metrics().renew_failures.fetch_add(1, Relaxed);
                    tracing::warn!(feed = %id, error = %e, "feeds: lease lost at renew; upstream closed");
                    self.hard_stop(&id).await;
                }
                Err(e) => {
                    self.shared.metrics().renew_failures.fetch_add(1, Relaxed);
                    tracing::warn!(feed = %id, error = %e, "feeds: renew failed; the upstream closes at lease end - skew_margin_ms unless a renew succeeds");
                }
            }
        }
        let ids: Vec<String> = self.held.keys().cloned().collect();
        match self.bounded(self.store.get_many(&ids)).await {
            Ok(feeds) => {
                for (id, f) in ids.iter().zip(feeds) {
                    match f {
                        Some(f) => self.check(f, now).await,
                        None => {
                            tracing::info!(feed = %id, "feeds: feed deleted; upstream closed");
                            self.hard_stop(id).await;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "feeds: cannot read the owned feeds after renewing"),
        }
    }

    /// Closes the upstream of every feed whose lease was not renewed by its expiry minus the
    /// skew margin.
    async fn give_up_overdue(&mut self) {
        let now = now_ms();
        let overdue: Vec<(String, u64)> = self
            .held
            .iter()
            .filter(|(_, h)| h.expires_ms.saturating_sub(self.cfg.skew_margin_ms) <= now)
            .map(|(id, h)| (id.clone(), h.expires_ms))
            .collect();
        for (id, expires) in overdue {
            tracing::error!(feed = %id, lease_expires_at_ms = expires, skew_margin_ms = self.cfg.skew_margin_ms, "feeds: lease not renewed in time; upstream closed before the lease can pass to another node");
            self.hard_stop(&id).await;
        }
    }

    /// Forgets `id` after aborting its owner task at once (no release: the lease is not ours,
    /// or may not be by the time a release would arrive).
    pub(super) async fn hard_stop(&mut self, id: &str) {
        let Some(h) = self.held.remove(id) else { return };
        h.task.abort();
        let _ = h.task.await;
        self.forget(&h.progress);
    }

    fn forget(&self, progress: &FeedProgress) {
        progress.owned.store(false, Relaxed);
        progress.connected.store(false, Relaxed);
        self.shared.metrics().owned.fetch_sub(1, Relaxed);
    }

    /// Stops `id` gracefully, then releases its lease with its last published upstream seq.
    pub(super) async fn stop_and_release(&mut self, id: &str) {
        let Some(h) = self.held.remove(id) else { return };
        let _ = h.stop.send(true);
        graceful(h.task).await;
        self.forget(&h.progress);
        let seq = h.progress.last_seq();
        match self.bounded(self.store.release(id, &self.node, h.token, seq.as_deref())).await {
            Ok(()) => tracing::info!(feed = %id, token = h.token, last_seq = ?seq, "feeds: stopped and released"),
            Err(e) => {
                tracing::warn!(feed = %id, error = %e, "feeds: stopped; release failed (the lease expires by itself)")
            }
        }
    }

    /// The drain: stops every owned feed (all at once), then releases each lease with its
    /// last_seq, concurrently.
    async fn release_all(mut self) {
        let held: Vec<(String, Held)> = self.held.drain().collect();
        for (_, h) in &held {
            let _ = h.stop.send(true);
        }
        let mut leases = Vec::with_capacity(held.len());
        for (id, h) in held {
            graceful(h.task).await;
            self.forget(&h.progress);
            leases.push((id, h.token, h.progress.last_seq()));
        }
        let this = &self;
        let releases = leases.iter().map(|(id, token, seq)| async move {
            (id, this.bounded(this.store.release(id, &this.node, *token, seq.as_deref())).await)
        });
        for (id, r) in futures::future::join_all(releases).await {
            match r {
                Ok(()) => tracing::info!(feed = %id, "feeds: drain: stopped and released"),
                Err(e) => {
                    tracing::warn!(feed = %id, error = %e, "feeds: drain: release failed (the lease expires by itself)")
                }
            }
        }
    }
}

/// Waits up to [`STOP_GRACE`] for a stopping owner task, then aborts it.
async fn graceful(mut task: JoinHandle<()>) {
    if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
        task.abort();
        let _ = task.await;
    }
}
