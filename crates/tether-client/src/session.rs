//! The application side of a client: [`Client`] (events, commits, subscriptions, presence),
//! [`Publisher`] (at-least-once publish, presence from other tasks), [`AckHandle`] and
//! [`SubscribeOptions`].

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use super::backoff::Backoff;
use super::offsets::{OffsetStore, Position};
use super::presence::{Member, PresenceStats, Query, Reply};
use super::shared::{lock, Command, Pending, Shared};
use super::task::Task;
use super::urls::{check_urls, Rotation};
use super::wire::{check_channel, new_publish_id, pub_frame};
use super::{Ack, ClientConfig, ClientError, Event, Stats};

/// How long [`Client::close`] waits for the close handshake.
const CLOSE_WAIT: Duration = Duration::from_secs(3);

/// A reconnecting, resuming tether client (docs/protocol.md, the reference client).
///
/// Dropping the last handle (`Client` and every [`Publisher`]) closes the connection.
pub struct Client {
    publisher: Publisher,
    events: mpsc::Receiver<Event>,
    store: Option<OffsetStore>,
    /// Serializes offset-file writes so an older snapshot never lands after a newer one.
    save_lock: tokio::sync::Mutex<()>,
}

/// How [`Client::subscribe_with`] subscribes. `Default` is a live subscription (or the offset
/// file's position) without joins and leaves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// The last seq already processed (`Some(0)` replays from seq 1), used when the offset file
    /// has no entry for the channel; as the `from` of [`Client::subscribe`].
    pub from: Option<u64>,
    /// Resume from this position, overriding any offset-file entry and `from`; as
    /// [`Client::subscribe_at`].
    pub at: Option<Position>,
    /// Also receive the channel's joins and leaves (`"join_leave": true`, docs/protocol.md
    /// "Presence"): [`Event::PresenceDiff`] and [`Event::PresenceReset`]. The server refuses the
    /// subscription with [`Event::Error`] code `presence_off` when the channel's rule has no
    /// `join_leave = true` (the client then does not subscribe to it again).
    pub join_leave: bool,
}

/// A cloneable handle for publishing and asking who is in a channel from other tasks.
#[derive(Clone)]
pub struct Publisher {
    cmds: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
}

/// Resolves to the server's [`Ack`] for one publish, or to the error that ended it:
/// [`ClientError::Refused`] for an `error` reply with this publish's id, or the client's
/// terminal error ([`ClientError::Closed`], [`ClientError::Shutdown`], …).
pub struct AckHandle {
    reply: oneshot::Receiver<Result<Ack, ClientError>>,
    shared: Arc<Shared>,
}

impl Future for AckHandle {
    type Output = Result<Ack, ClientError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.reply).poll(cx) {
            Poll::Ready(Ok(result)) => Poll::Ready(result),
            Poll::Ready(Err(_)) => Poll::Ready(Err(self.shared.terminal_error())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Client {
    /// Starts the client: validates the URLs, loads the offset file, and spawns the
    /// connection task on the current tokio runtime. Returns at once; the connection is
    /// made in the background and reported as [`Event::Connected { .. }`].
    ///
    /// # Errors
    /// [`ClientError::InvalidUrl`] when [`ClientConfig::urls`] is empty or an entry is not
    /// `ws://HOST:PORT/PATH`; [`ClientError::Io`] when the offset file cannot be read or
    /// parsed, or when called outside a tokio runtime.
    pub fn connect(cfg: ClientConfig) -> Result<Self, ClientError> {
        check_urls(&cfg.urls, "ClientConfig::urls")?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| ClientError::Io(format!("tether client needs a tokio runtime: {e}")))?;
        let store = cfg.offset_file.as_ref().map(OffsetStore::new);
        let positions: HashMap<String, Position> = match &store {
            Some(s) => s.load()?.into_iter().collect(),
            None => HashMap::new(),
        };
        let shared = Arc::new(Shared::new(positions, cfg.max_outbox));
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (ev_tx, ev_rx) = mpsc::channel(cfg.event_buffer.max(1));
        let backoff = match cfg.seed {
            Some(seed) => Backoff::with_seed(cfg.backoff, seed),
            None => Backoff::new(cfg.backoff),
        };
        let rotation = Rotation::new(cfg.urls, backoff);
        let task = Task::new(rotation, cfg.connect_timeout, cfg.idle_timeout, shared.clone(), cmd_rx, ev_tx, cfg.token);
        runtime.spawn(task.run());
        Ok(Self {
            publisher: Publisher { cmds: cmd_tx, shared },
            events: ev_rx,
            store,
            save_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Subscribes to `ch` on this and every later connection. The resume point is, in order:
    /// the offset file's entry for `ch`, then `from` (the last seq already processed; `Some(0)`
    /// replays from seq 1), else none: the subscription starts live at the current head, and
    /// that head becomes the resume point. Subscribing to an already subscribed channel does
    /// nothing.
    ///
    /// # Errors
    /// [`ClientError::InvalidChannel`]; the terminal error once the client has stopped.
    pub fn subscribe(&self, ch: &str, from: Option<u64>) -> Result<(), ClientError> {
        self.subscribe_with(ch, SubscribeOptions { from, ..SubscribeOptions::default() })
    }

    /// Subscribes to `ch` resuming from `pos`, overriding any offset-file entry.
    ///
    /// # Errors
    /// As [`subscribe`](Self::subscribe).
    pub fn subscribe_at(&self, ch: &str, pos: Position) -> Result<(), ClientError> {
        self.subscribe_with(ch, SubscribeOptions { at: Some(pos), ..SubscribeOptions::default() })
    }

    /// Subscribes to `ch` as `opts` say: its resume point (as [`subscribe`](Self::subscribe)
    /// and [`subscribe_at`](Self::subscribe_at)) and whether it receives joins and leaves.
    ///
    /// With `join_leave`, every later connection subscribes with `join_leave` again, and since
    /// joins and leaves while no connection was open are lost, the client then raises
    /// [`Event::PresenceReset`] with `reconnected: true` right after the resubscription's
    /// [`Event::Subscribed`] (or [`Event::Reset`]): ask [`presence`](Self::presence) again.
    /// Subscribing to an already subscribed channel does nothing (its `join_leave` stays).
    ///
    /// Keep the members keyed by `client`: a connection's id is never used again, so a diff
    /// that an answer already reflects (it waited among the events while the answer came)
    /// changes nothing when applied after it.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tether_client::ClientError> {
    /// use std::collections::HashMap;
    /// use tether_client::{Client, ClientConfig, Event, Member, SubscribeOptions};
    /// let by_client = |all: Vec<Member>| all.into_iter().map(|m| (m.client.clone(), m)).collect::<HashMap<_, _>>();
    /// let mut client = Client::connect(ClientConfig::new("ws://127.0.0.1:8080/ws"))?;
    /// client.subscribe_with("room.1", SubscribeOptions { join_leave: true, ..Default::default() })?;
    /// let mut here = by_client(client.presence("room.1").await?); // every member, all pages
    /// loop {
    ///     match client.next_event().await? {
    ///         Event::PresenceDiff { joins, leaves, .. } => {
    ///             for m in &leaves {
    ///                 here.remove(&m.client);
    ///             }
    ///             here.extend(joins.into_iter().map(|m| (m.client.clone(), m)));
    ///         }
    ///         Event::PresenceReset { ch, .. } => here = by_client(client.presence(&ch).await?), // ask again
    ///         _ => {}
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`subscribe`](Self::subscribe).
    pub fn subscribe_with(&self, ch: &str, opts: SubscribeOptions) -> Result<(), ClientError> {
        check_channel(ch)?;
        {
            let mut book = lock(&self.publisher.shared.book);
            match (opts.at, opts.from) {
                (Some(pos), _) => {
                    book.positions.insert(ch.to_string(), pos);
                }
                (None, Some(seq)) => {
                    book.positions.entry(ch.to_string()).or_insert(Position { seq, epoch: None });
                }
                (None, None) => {}
            }
        }
        self.publisher.command(Command::Subscribe { ch: ch.to_string(), join_leave: opts.join_leave })
    }

    /// See [`Publisher::presence`].
    ///
    /// # Errors
    /// See [`Publisher::presence`].
    pub async fn presence(&self, ch: &str) -> Result<Vec<Member>, ClientError> {
        self.publisher.presence(ch).await
    }

    /// See [`Publisher::presence_stats`].
    ///
    /// # Errors
    /// See [`Publisher::presence_stats`].
    pub async fn presence_stats(&self, ch: &str) -> Result<PresenceStats, ClientError> {
        self.publisher.presence_stats(ch).await
    }

    /// Stops receiving `ch` (sends `unsub`); its resume point is kept.
    ///
    /// # Errors
    /// The terminal error once the client has stopped.
    pub fn unsubscribe(&self, ch: &str) -> Result<(), ClientError> {
        self.publisher.command(Command::Unsubscribe(ch.to_string()))
    }

    /// The next event. Messages at or below the channel's committed seq (replays of what the
    /// application already recorded) are skipped and counted in
    /// [`Stats::duplicates_dropped`]. A [`Event::Reset`] moves the channel's resume point to
    /// the reset's `seq` and `epoch`.
    ///
    /// # Errors
    /// The terminal error once every earlier event has been returned:
    /// [`ClientError::Closed`] for a stop close code, [`ClientError::Handshake`],
    /// [`ClientError::Protocol`], or [`ClientError::Shutdown`].
    pub async fn next_event(&mut self) -> Result<Event, ClientError> {
        loop {
            let Some(ev) = self.events.recv().await else {
                return Err(self.publisher.shared.terminal_error());
            };
            let shared = &self.publisher.shared;
            let mut book = lock(&shared.book);
            match &ev {
                Event::Subscribed { ch, epoch, .. } => {
                    book.app_epochs.insert(ch.clone(), epoch.clone());
                }
                Event::Reset { ch, seq, epoch, .. } => {
                    book.app_epochs.insert(ch.clone(), epoch.clone());
                    let pos = Position { seq: *seq, epoch: Some(epoch.clone()) };
                    book.positions.insert(ch.clone(), pos);
                }
                Event::Message { ch, seq, .. } if book.positions.get(ch).is_some_and(|p| *seq <= p.seq) => {
                    shared.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                _ => {}
            }
            return Ok(ev);
        }
    }

    /// Records that the application has processed and recorded `seq` on `ch`: later
    /// (re)subscribes resume after it, under the epoch of the events consumed so far. With an
    /// offset file, returns once the file is durably replaced.
    ///
    /// # Errors
    /// [`ClientError::Io`] when the offset file cannot be written (the in-memory position is
    /// updated anyway).
    pub async fn commit(&self, ch: &str, seq: u64) -> Result<(), ClientError> {
        {
            let mut book = lock(&self.publisher.shared.book);
            let epoch =
                book.app_epochs.get(ch).cloned().or_else(|| book.positions.get(ch).and_then(|p| p.epoch.clone()));
            book.positions.insert(ch.to_string(), Position { seq, epoch });
        }
        let Some(store) = &self.store else {
            return Ok(());
        };
        let _guard = self.save_lock.lock().await;
        let snapshot: BTreeMap<String, Position> =
            lock(&self.publisher.shared.book).positions.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let store = store.clone();
        tokio::task::spawn_blocking(move || store.save(&snapshot))
            .await
            .map_err(|e| ClientError::Io(e.to_string()))??;
        Ok(())
    }

    /// The current resume point of `ch`, if any.
    pub fn position(&self, ch: &str) -> Option<Position> {
        lock(&self.publisher.shared.book).positions.get(ch).cloned()
    }

    /// Counters since the client started.
    pub fn stats(&self) -> Stats {
        self.publisher.shared.stats()
    }

    /// A cloneable publishing handle sharing this client's connection and outbox.
    pub fn publisher(&self) -> Publisher {
        self.publisher.clone()
    }

    /// See [`Publisher::publish`].
    ///
    /// # Errors
    /// See [`Publisher::publish`].
    pub async fn publish<T: Serialize + ?Sized>(&self, ch: &str, data: &T) -> Result<Ack, ClientError> {
        self.publisher.publish(ch, data).await
    }

    /// Closes the connection with 1000 and stops the client; unacked publishes fail with
    /// [`ClientError::Shutdown`]. Waits up to 3 s for the close handshake.
    pub async fn close(self) {
        let (done, wait) = oneshot::channel();
        if self.publisher.cmds.send(Command::Close(done)).is_ok() {
            let _ = tokio::time::timeout(CLOSE_WAIT, wait).await;
        }
    }
}

impl Publisher {
    fn command(&self, cmd: Command) -> Result<(), ClientError> {
        self.cmds.send(cmd).map_err(|_| self.shared.terminal_error())
    }

    /// Queues one publish of `data` on `ch` with `id` (a fresh [`new_publish_id`] when
    /// `None`) and returns a handle to await its ack. The publish stays in the outbox, and is
    /// resent with the same id after every reconnect, until the server acks or refuses it;
    /// the server's dedup by id makes the resends harmless. Waits while the outbox is full
    /// (`ClientConfig::max_outbox`). Publishes from one task are sent in call order.
    ///
    /// # Errors
    /// [`ClientError::InvalidChannel`], [`ClientError::InvalidData`] when `data` does not
    /// serialize; the terminal error once the client has stopped.
    pub async fn send<T: Serialize + ?Sized>(
        &self,
        ch: &str,
        id: Option<String>,
        data: &T,
    ) -> Result<AckHandle, ClientError> {
        check_channel(ch)?;
        let id = id.unwrap_or_else(new_publish_id);
        let frame = pub_frame(ch, &id, data)?;
        let permit = self.shared.room.clone().acquire_owned().await.map_err(|_| self.shared.terminal_error())?;
        let (reply, wait) = oneshot::channel();
        let pending = Pending { id, ch: ch.to_string(), frame, reply, permit };
        self.command(Command::Publish(pending))?;
        Ok(AckHandle { reply: wait, shared: self.shared.clone() })
    }

    /// Publishes `data` on `ch` at least once and waits for the ack.
    ///
    /// # Errors
    /// As [`send`](Self::send), then as [`AckHandle`].
    pub async fn publish<T: Serialize + ?Sized>(&self, ch: &str, data: &T) -> Result<Ack, ClientError> {
        self.send(ch, None, data).await?.await
    }

    /// Publishes with a caller-chosen `id` (e.g. a retry of an earlier process's publish) and
    /// waits for the ack; a duplicate id is acked with its original seq.
    ///
    /// # Errors
    /// As [`publish`](Self::publish).
    pub async fn publish_with_id<T: Serialize + ?Sized>(
        &self,
        ch: &str,
        id: &str,
        data: &T,
    ) -> Result<Ack, ClientError> {
        self.send(ch, Some(id.to_string()), data).await?.await
    }

    /// Every member of `ch` (docs/protocol.md, "Presence"): asks `presence` and follows the
    /// server's `next` pages (`presence.page_size` members each, 1000 by default) until the
    /// last, then returns them all, in the server's order. Needs the channel's `sub` right,
    /// not a subscription. A channel nobody is in gives an empty list.
    ///
    /// The request outlives a connection: after a reconnect it is asked again from the first
    /// page. While it waits the client keeps reading the socket even when the application is
    /// behind on [`Client::next_event`], so that the answer can come, holding up to 4,096
    /// events more than [`ClientConfig::event_buffer`](super::ClientConfig::event_buffer); past
    /// that it waits for the application (consume events meanwhile, e.g. from another task
    /// with a [`Publisher`]). A member list is a snapshot: apply the [`Event::PresenceDiff`]s
    /// of a `join_leave` subscription to it.
    ///
    /// # Errors
    /// [`ClientError::InvalidChannel`]; [`ClientError::Refused`] with the server's `code`:
    /// `presence_off` (the channel's rule has no `presence = true`), `forbidden` (the token
    /// does not allow subscribing to `ch`), `limit` (more than
    /// `limits.per_connection.presence_rate` requests: `retry_after` says when to ask again);
    /// the terminal error once the client has stopped.
    pub async fn presence(&self, ch: &str) -> Result<Vec<Member>, ClientError> {
        check_channel(ch)?;
        let (reply, wait) = oneshot::channel();
        self.command(Command::Query(Query::new(ch.to_string(), Reply::Members(reply))))?;
        wait.await.unwrap_or_else(|_| Err(self.shared.terminal_error()))
    }

    /// How many are in `ch`: `presence_stats` (connections, and distinct users among them).
    /// Asked again after a reconnect, and read as [`presence`](Self::presence) is.
    ///
    /// # Errors
    /// As [`presence`](Self::presence).
    pub async fn presence_stats(&self, ch: &str) -> Result<PresenceStats, ClientError> {
        check_channel(ch)?;
        let (reply, wait) = oneshot::channel();
        self.command(Command::Query(Query::new(ch.to_string(), Reply::Stats(reply))))?;
        wait.await.unwrap_or_else(|_| Err(self.shared.terminal_error()))
    }

    /// Counters of the client this publisher belongs to.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }
}
