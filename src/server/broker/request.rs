//! The broker seam's vocabulary: what a core asks a channel's home ([`Request`]) and the
//! parts of its answers that are the broker's own ([`PublishResult`], [`Resume`],
//! [`HistoryPage`]), with the fence of a feed's publish ([`Fence`]) and the node-wide actions
//! of the server API that a broker carries to the other nodes ([`Control`]). The answers themselves travel as
//! [`CoreMsg`](crate::server::bus::CoreMsg)s; requests for a home core travel on the bus
//! ([`BusMsg::Broker`](crate::server::bus::BusMsg::Broker)).

use std::sync::Arc;

use bytes::Bytes;

use serde::{Deserialize, Serialize};

use crate::auth::revoke::Revocation;
use crate::protocol::presence::Member;
use crate::protocol::RequestError;
use crate::server::bus::ConnRef;
use crate::server::conn::ConnId;

/// What a publish resolved to at the channel's home.
#[derive(Debug)]
pub enum PublishResult {
    /// Stored as `seq` (also for a duplicate id: the original seq).
    Stored {
        /// The channel's seq for this message.
        seq: u64,
    },
    /// Refused (a broker that cannot store it now, `limits.max_channels` reached, or a fenced
    /// publish whose token is stale: [`crate::protocol::codes::FENCED`]).
    Refused(Box<RequestError>),
}

/// The fence of a publish made on behalf of an upstream feed (docs/feeds.md "Fencing", issue 11
/// item 5): the channel's home refuses it (code [`crate::protocol::codes::FENCED`]) when it has
/// seen a higher `token` for `feed`, and otherwise raises the highest token it keeps for `feed`
/// to `token`, atomically with the publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The feed's id (`crate::feeds::FeedDef::id`: 1–64 bytes of `[A-Za-z0-9._-]`; the Redis
    /// publish script relies on it holding no space).
    pub feed: Box<str>,
    /// The fencing token of the lease the publisher holds (`crate::feeds::Lease`'s
    /// `fencing_token`: 1 on the first acquire, one more on each next one).
    pub token: u64,
}

/// A request about one channel, from a subscriber's or publisher's core to the channel's
/// home.
#[derive(Debug)]
pub enum Request {
    /// Publish `data` (raw JSON text) on `ch`; `id` is the publisher's dedup key. The answer
    /// ([`CoreMsg::Published`](crate::server::bus::CoreMsg::Published)) goes to `reply` when given.
    Publish {
        /// Channel name.
        ch: Arc<str>,
        /// The publisher's message id (`pub.id`, `Idempotency-Key`), for dedup.
        id: Option<Box<str>>,
        /// The message: compact JSON text, validated on the way in.
        data: Bytes,
        /// Who gets the answer.
        reply: Option<ConnRef>,
        /// `Some` for a feed's publish: refused as `fenced` (not stored, no seq, not recorded
        /// for dedup) when the home saw a higher token for the feed. `None` for every other
        /// publish (clients, HTTP).
        fence: Option<Fence>,
    },
    /// Subscribe `conn` to `ch`, resuming after `from` when given (and `epoch` matches).
    /// Answered with [`CoreMsg::Subscribed`](crate::server::bus::CoreMsg::Subscribed).
    Subscribe {
        /// Channel name.
        ch: Arc<str>,
        /// The subscribing connection.
        conn: ConnRef,
        /// The last seq the client processed, to resume after.
        from: Option<u64>,
        /// The epoch `from` belongs to, as the client last saw it.
        epoch: Option<Box<str>>,
        /// On a presence channel (`[[channels]] presence = true`), the member the connection
        /// becomes once the subscription is registered; `None` elsewhere.
        member: Option<Box<Member>>,
    },
    /// One subscription of core `core` to `ch` ended. Not answered.
    Unsubscribe {
        /// Channel name.
        ch: Arc<str>,
        /// The core whose subscription ended.
        core: u16,
        /// On a presence channel, the connection whose subscription ended (it leaves the
        /// channel's presence); `None` elsewhere.
        member: Option<ConnId>,
    },
    /// Who is in `ch` (client `presence`, `presence_stats`). Answered with
    /// [`CoreMsg::PresenceAnswer`](crate::server::bus::CoreMsg::PresenceAnswer).
    Presence {
        /// Channel name.
        ch: Arc<str>,
        /// The asking connection.
        conn: ConnRef,
        /// What it asks.
        query: PresenceQuery,
    },
    /// The next history batch of `ch` for a resuming subscriber: seqs after `after`, up to
    /// `until`. Answered with [`CoreMsg::ReplayBatch`](crate::server::bus::CoreMsg::ReplayBatch).
    Fetch {
        /// Channel name.
        ch: Arc<str>,
        /// The resuming connection.
        conn: ConnRef,
        /// Last seq already fetched.
        after: u64,
        /// Last seq of the replay (the head when the subscription began).
        until: u64,
    },
    /// A page of `ch`'s history for `GET /api/history/{ch}`, read like a resume's batches:
    /// the messages after `from` (the newest `limit` when `None`), at most `limit`.
    /// Answered with [`CoreMsg::History`](crate::server::bus::CoreMsg::History).
    History {
        /// Channel name.
        ch: Arc<str>,
        /// The HTTP connection that asked.
        reply: ConnRef,
        /// Messages after this seq; `None`: the newest ones.
        from: Option<u64>,
        /// Most messages in the page (1–1000, checked by the caller).
        limit: usize,
    },
    /// Carry `msg` to every other node (the Redis broker: a message on its control topic;
    /// for a revocation, also stored in Redis for nodes that start later). The node's own
    /// cores are told by the asking core, not by the broker. Answered with
    /// [`CoreMsg::ControlSent`](crate::server::bus::CoreMsg::ControlSent).
    Control {
        /// What every node does.
        msg: Arc<Control>,
        /// The HTTP connection that asked.
        reply: ConnRef,
    },
}

impl Request {
    /// The channel the request is about; `None` for [`Request::Control`], which is about
    /// every node.
    pub fn channel(&self) -> Option<&str> {
        match self {
            Request::Publish { ch, .. }
            | Request::Subscribe { ch, .. }
            | Request::Unsubscribe { ch, .. }
            | Request::Presence { ch, .. }
            | Request::Fetch { ch, .. }
            | Request::History { ch, .. } => Some(ch),
            Request::Control { .. } => None,
        }
    }
}

/// What a [`Request::Presence`] asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresenceQuery {
    /// One page of members (`presence.page_size` at most), after `cursor` when given (the
    /// `next` of the previous page, as the client sent it back).
    Members {
        /// Where the previous page ended.
        cursor: Option<Box<str>>,
    },
    /// How many connections and distinct users.
    Stats,
}

/// A node-wide action of the server API (docs/api.md), applied by every core of every node
/// to its own connections. Travels between nodes as JSON tagged by `op`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Control {
    /// `POST /api/disconnect`: close every connection whose token's `sub` is `user`.
    Disconnect {
        /// The user (JWT `sub`).
        user: Box<str>,
        /// The close code: 4000–4999, or 1001, 1011, 1012, 1013.
        code: u16,
        /// The close reason, at most 123 bytes of UTF-8 (RFC 6455 §5.5).
        reason: Box<str>,
    },
    /// `POST /api/unsubscribe`: end `user`'s subscriptions to `ch`.
    Unsubscribe {
        /// The user (JWT `sub`).
        user: Box<str>,
        /// The channel.
        ch: Box<str>,
    },
    /// `POST /api/revoke`: refuse the matching tokens from now on and close the connections
    /// that hold one (4003).
    Revoke {
        /// What is revoked, and until when.
        revocation: Revocation,
    },
}

/// Most bytes of message data one history page holds (`GET /api/history/{ch}`): a page ends
/// after `limit` messages or once its messages' data passed this, whichever comes first (it
/// holds at least one message), so a request (or ten at once, unread) cannot make the node
/// build a body of `limit` × `max_publish_bytes`. The next page starts `from` its last seq.
pub const HISTORY_PAGE_MAX_BYTES: usize = 1 << 20;

/// Keeps the first messages of `messages` whose data stays within [`HISTORY_PAGE_MAX_BYTES`]
/// (at least one).
pub fn within_page_bytes(messages: impl IntoIterator<Item = (u64, Bytes)>) -> Vec<(u64, Bytes)> {
    let mut bytes = 0;
    let mut out = Vec::new();
    for (seq, data) in messages {
        if !out.is_empty() && bytes + data.len() > HISTORY_PAGE_MAX_BYTES {
            break;
        }
        bytes += data.len();
        out.push((seq, data));
    }
    out
}

/// One page of a channel's history (`GET /api/history/{ch}`).
#[derive(Debug, Clone)]
pub struct HistoryPage {
    /// The channel's current epoch (as a `subscribed` would carry it).
    pub epoch: Arc<str>,
    /// The channel's head: the seq of its last message (0 before any).
    pub head: u64,
    /// The oldest seq still in history (`head + 1` when it holds none).
    pub oldest: u64,
    /// `(seq, data)` in seq order; `data` is the message's JSON text as stored.
    pub messages: Vec<(u64, Bytes)>,
}

/// How a `sub` with `from` resolved at the home core.
#[derive(Debug, Clone)]
pub enum Resume {
    /// No `from` was given: live from `head`.
    Live,
    /// `from` was found: replay seqs `from+1 ..= until` (the head at subscribe) before live
    /// ones. `frames` is the first batch; the rest is fetched as the connection drains.
    Recovered {
        /// The client's resume point.
        from: u64,
        /// The first history batch (seqs `from+1 ..`).
        frames: Vec<Bytes>,
        /// The last seq to replay from history.
        until: u64,
    },
    /// The resume point is gone: send `reset` (evicted or epoch) with the oldest kept seq.
    Reset {
        /// Why: evicted from history, or another epoch.
        reason: crate::protocol::ResetReason,
        /// The oldest seq still in history.
        oldest: u64,
    },
    /// `from` is beyond `head`: answer with an `error`.
    Ahead,
    /// The broker cannot answer now (Redis unreachable): answer with this `error`
    /// (`unavailable`, with `retry_after_ms`); the subscription is not made.
    Unavailable(Box<RequestError>),
    /// The home refused to register the subscription (`limit`: the channel does not exist
    /// and `limits.max_channels` channels do): answer with this `error`. Unlike the other
    /// answers nothing was registered, so nothing is released (no `Unsubscribe` follows);
    /// `head` and `epoch` of such an answer mean nothing.
    Refused(Box<RequestError>),
}
