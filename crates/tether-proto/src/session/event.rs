//! What a session hands up to its core, in the order it decided them: the requests it read
//! ([`Inbound`]) and what the core should log about the peer ([`Event::PeerClosed`],
//! [`Event::Refused`]). The session never logs and never names its socket or peer itself: the
//! core knows the connection's address and writes the line.
//!
//! quinn-proto's shape, fitted to a record that must stay small at C1M: a call that takes input
//! (`handle_bytes`) appends its events to an [`Events`] queue the core lends it, and the core
//! takes them out with [`Events::poll_event`] right after the call. The queue is the core's,
//! one for all its connections (reused, so it allocates only while it grows): an idle
//! connection pays nothing for it, where a queue of its own would cost every connection 24
//! bytes of its 168.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::protocol::close::CloseCode;
use crate::protocol::{ClientOp, RequestError};

/// One request of a connection, as its session hands it up.
#[derive(Debug)]
pub enum Inbound {
    /// A request that parsed and passed the connection's rates: the core serves it.
    Op(ClientOp),
    /// A request the session answered itself (malformed, or over one of the
    /// `limits.per_connection` rates): `frame` is its `error` frame, `ch` the channel it
    /// named, when it named one.
    Answered {
        /// The channel the request named (as sent, at most 128 bytes).
        ch: Option<Box<str>>,
        /// The encoded `error` text frame.
        frame: Bytes,
    },
}

impl Inbound {
    /// The channel this request is about, if any (`refresh` is about none).
    pub fn channel(&self) -> Option<&str> {
        match self {
            Inbound::Op(
                ClientOp::Sub { ch, .. }
                | ClientOp::Unsub { ch }
                | ClientOp::Pub { ch, .. }
                | ClientOp::Presence { ch, .. }
                | ClientOp::PresenceStats { ch },
            ) => Some(ch),
            Inbound::Op(ClientOp::Refresh { .. }) => None,
            Inbound::Answered { ch, .. } => ch.as_deref(),
        }
    }

    /// Whether it is a `pub` (served without waiting for the connection's earlier `pub`s).
    pub fn is_pub(&self) -> bool {
        matches!(self, Inbound::Op(ClientOp::Pub { .. }))
    }
}

/// One thing a session hands up to its core.
#[derive(Debug)]
pub enum Event {
    /// A request, in message order: the core serves it (or queues its ready answer).
    Request(Inbound),
    /// The peer sent a close frame with `code` (`None`: no status, RFC 6455 §7.1.5) and
    /// `reason` (UTF-8-checked client bytes: escape them before logging). The session already
    /// answered it; the core logs it.
    PeerClosed {
        /// The peer's close code.
        code: Option<CloseCode>,
        /// The peer's close reason.
        reason: Bytes,
    },
    /// A text message that is not a valid request (its `error` answer follows as a
    /// [`Event::Request`] of [`Inbound::Answered`]): the core logs why. `reason` and `ch` are
    /// client bytes (escape them before logging).
    Refused(RequestError),
}

/// The events of the session call in progress, lent by the core (see the module docs).
#[derive(Debug, Default)]
pub struct Events {
    queue: VecDeque<Event>,
}

impl Events {
    /// The oldest event not yet taken, `None` when every one was.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.queue.pop_front()
    }

    /// Whether no event waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub(super) fn push(&mut self, e: Event) {
        self.queue.push_back(e);
    }

    pub(super) fn push_request(&mut self, r: Inbound) {
        self.queue.push_back(Event::Request(r));
    }

    /// Takes out the requests the session answered itself, in order, handing each answer
    /// frame to `answer`; the rest stays in order.
    pub(super) fn take_answered(&mut self, mut answer: impl FnMut(Bytes)) {
        self.queue.retain_mut(|e| match e {
            Event::Request(Inbound::Answered { frame, .. }) => {
                answer(std::mem::take(frame));
                false
            }
            _ => true,
        });
    }
}
