//! State shared by the application side ([`super::Client`], [`super::Publisher`]) and the
//! background connection task, and the commands between them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::offsets::Position;
use super::presence::Query;
use super::{Ack, ClientError, Event, Stats};

/// Locks a std mutex; a panic elsewhere while holding it leaves plain data that is still valid.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Resume state shared by the application side and the task.
#[derive(Default)]
pub(crate) struct Book {
    /// Resume point per channel: sent as `from`/`epoch` on every (re)subscribe.
    pub positions: HashMap<String, Position>,
    /// The epoch of each channel as of the last event the application consumed; a commit is
    /// recorded under it, so a seq is never paired with an epoch announced after it.
    pub app_epochs: HashMap<String, String>,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub connects: AtomicU64,
    pub duplicates: AtomicU64,
    pub gaps: AtomicU64,
    pub status_dropped: AtomicU64,
}

pub(crate) struct Shared {
    pub book: Mutex<Book>,
    /// Set once when the task ends; every later request fails with it.
    pub terminal: Mutex<Option<ClientError>>,
    /// One permit per outbox slot.
    pub room: Arc<Semaphore>,
    pub counters: Counters,
}

impl Shared {
    pub(crate) fn new(positions: HashMap<String, Position>, max_outbox: usize) -> Self {
        Self {
            book: Mutex::new(Book { positions, app_epochs: HashMap::new() }),
            terminal: Mutex::new(None),
            room: Arc::new(Semaphore::new(max_outbox.clamp(1, Semaphore::MAX_PERMITS))),
            counters: Counters::default(),
        }
    }

    pub(crate) fn terminal_error(&self) -> ClientError {
        lock(&self.terminal).clone().unwrap_or(ClientError::Shutdown)
    }

    pub(crate) fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            connects: c.connects.load(Ordering::Relaxed),
            duplicates_dropped: c.duplicates.load(Ordering::Relaxed),
            gaps: c.gaps.load(Ordering::Relaxed),
            status_events_dropped: c.status_dropped.load(Ordering::Relaxed),
        }
    }
}

/// A publish waiting for its ack.
pub(crate) struct Pending {
    pub id: String,
    pub ch: String,
    pub frame: String,
    pub reply: oneshot::Sender<Result<Ack, ClientError>>,
    pub permit: OwnedSemaphorePermit,
}

pub(crate) enum Command {
    Subscribe {
        ch: String,
        join_leave: bool,
    },
    Unsubscribe(String),
    Publish(Pending),
    /// A `presence` or `presence_stats` of the application.
    Query(Query),
    Close(oneshot::Sender<()>),
}

/// `Connected`/`Disconnected` events are dropped beyond this many queued events, so an
/// application that only publishes never stalls the reader.
const STATUS_ROOM: usize = 64;

/// Events waiting for room in the application's channel, in order.
#[derive(Default)]
pub(crate) struct Outq {
    pub q: VecDeque<Event>,
    /// Queued events that must not be dropped; while any wait, the socket is not read.
    pub data: usize,
}

pub(crate) fn is_status(ev: &Event) -> bool {
    matches!(ev, Event::Connected { .. } | Event::Disconnected { .. } | Event::Retrying { .. })
}

impl Outq {
    pub(crate) fn push_data(&mut self, ev: Event) {
        self.data += 1;
        self.q.push_back(ev);
    }

    pub(crate) fn push_status(&mut self, ev: Event, counters: &Counters) {
        if self.q.len() >= STATUS_ROOM {
            counters.status_dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            self.q.push_back(ev);
        }
    }

    pub(crate) fn deliver(&mut self, permit: Result<mpsc::Permit<'_, Event>, mpsc::error::SendError<()>>) {
        match permit {
            Ok(permit) => {
                if let Some(ev) = self.q.pop_front() {
                    if !is_status(&ev) {
                        self.data -= 1;
                    }
                    permit.send(ev);
                }
            }
            // The application dropped its `Client`; publishers may still be running.
            Err(_) => {
                self.q.clear();
                self.data = 0;
            }
        }
    }
}
