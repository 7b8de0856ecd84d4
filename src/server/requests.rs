//! A connection's pub/sub requests, served in request order (docs/protocol.md, "Answers").
//!
//! A session hands up what one read held, in order: the requests that parsed and passed its
//! per-connection rates, and the `error` answers it made itself for those that did not
//! ([`Inbound`], in the session's `Event`s). The core serves them one by one, except that a request about a channel
//! whose earlier `sub`, `presence` or `presence_stats` (of the same connection) still waits for
//! the broker's answer is held behind it, and so is any request but a `pub` that comes after an unanswered `pub` of the
//! connection; each is served when the answers it waits for have gone out. So every request gets exactly one
//! answer, and the answers about one channel leave in the order their requests came:
//! `sub x, sub x` answers `subscribed` then `error already_subscribed`; `sub x, unsub x`
//! answers `subscribed` then `unsubscribed`.
//!
//! Held requests live in one map of the core, keyed by connection: a connection that holds
//! none (nearly all of them, nearly always) pays nothing for it. A connection may have at
//! most [`MAX_HELD`] requests held; one more closes it with 1008 (reason `limit`,
//! `held_requests`): a client that pipelines that much behind a `sub` still unanswered (the
//! broker is slow, Redis is away) is not served at the cost of unbounded memory.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use super::authorize::Right;
use super::broker::{PresenceQuery, PublishResult};
use super::conn::{ConnId, PENDING};
use super::core::CoreState;
use crate::protocol::close::{CloseCode, CloseReason};
use crate::protocol::{self, ClientOp};
use crate::session::{Inbound, Limit, ReapReason};
use crate::ws::codec;

/// Requests one connection may have held at once (see the module docs).
pub const MAX_HELD: usize = 1024;

/// One connection's held requests: per channel, in request order, each with its ticket
/// (how many of the connection's `pub`s came before it, all of which must be answered before
/// it is served, unless it is a `pub` too).
#[derive(Debug, Default)]
struct ConnHeld {
    by_ch: HashMap<Box<str>, VecDeque<(u64, Inbound)>>,
    /// Requests held, over every channel.
    count: usize,
    /// The smallest ticket a channel's first held request waits for (`u64::MAX`: none).
    wants: u64,
}

/// Requests held per connection, and the `pub`s they wait for.
#[derive(Debug, Default)]
pub struct Waiting {
    by_conn: HashMap<ConnId, ConnHeld>,
    /// `pub`s received and answered, per connection with one unanswered or a request held.
    pubs: HashMap<ConnId, (u64, u64)>,
    /// The channels each connection has a `presence` or `presence_stats` query in flight about
    /// (at most one per channel: later requests about it are held).
    presence: HashMap<ConnId, Vec<Box<str>>>,
}

impl Waiting {
    /// `pub`s of `id` received so far, and answered so far.
    fn pubs(&self, id: ConnId) -> (u64, u64) {
        self.pubs.get(&id).copied().unwrap_or((0, 0))
    }

    /// A `pub` of `id` was answered (by the broker, or refused here). Returns whether a
    /// request held by `id` may go now.
    pub fn pub_answered(&mut self, id: ConnId) -> bool {
        let Some((received, answered)) = self.pubs.get_mut(&id) else { return false };
        *answered += 1;
        let answered = *answered;
        match self.by_conn.get(&id) {
            Some(h) => answered >= h.wants,
            None => {
                if answered >= *received {
                    self.pubs.remove(&id);
                }
                false
            }
        }
    }

    /// Forgets what `id` held (it left).
    pub fn forget(&mut self, id: ConnId) {
        self.by_conn.remove(&id);
        self.pubs.remove(&id);
        self.presence.remove(&id);
    }

    /// A presence query of `id` about `ch` went to the broker.
    pub fn presence_asked(&mut self, id: ConnId, ch: &str) {
        self.presence.entry(id).or_default().push(ch.into());
    }

    /// The broker answered `id`'s presence query about `ch`. Returns whether one was in
    /// flight (an answer for a connection that left, or whose slot was reused, finds none).
    pub fn presence_answered(&mut self, id: ConnId, ch: &str) -> bool {
        let Some(chans) = self.presence.get_mut(&id) else { return false };
        let Some(i) = chans.iter().position(|c| &**c == ch) else { return false };
        chans.swap_remove(i);
        if chans.is_empty() {
            self.presence.remove(&id);
        }
        true
    }

    fn presence_pending(&self, id: ConnId, ch: &str) -> bool {
        self.presence.get(&id).is_some_and(|chans| chans.iter().any(|c| &**c == ch))
    }
}

impl CoreState {
    /// The broker's answer `result` to the `pub` (id `id`, channel `ch`) of connection `conn`:
    /// to a feed's ticket, to an HTTP publish (`POST /publish`, answered once every message of
    /// its batch is), or as an `ack` or `error` frame queued for the WebSocket; then the
    /// requests held behind that `pub` are served.
    pub(crate) fn published(&mut self, conn: ConnId, ch: &str, id: Option<&str>, result: PublishResult) {
        if super::feed_port::FeedInbox::is_ticket(conn) {
            return self.feeds.answer(conn, result);
        }
        let Some(s) = self.session(conn) else { return };
        if let Some(keep_alive) = s.awaiting() {
            let Some(result) = self.batch_published(conn, ch, result) else { return };
            return self.answer_publish(conn, result, keep_alive);
        }
        let json = match &result {
            PublishResult::Stored { seq } => protocol::ack_json(id.unwrap_or(""), ch, *seq),
            PublishResult::Refused(e) => {
                protocol::with_channel(protocol::error_json_retry(e.code, &e.reason, id, e.retry_after_ms), ch)
            }
        };
        // Queued, not written: the processor flushes every touched connection once per pass,
        // so the acks of one broker batch leave in one `sendmsg` per connection.
        let frame = codec::text_frame(&json);
        self.with_session(conn, |s, ctx| s.reply(ctx, frame));
        if self.waiting.pub_answered(conn) {
            self.serve_held(conn, None);
        }
    }

    /// Serves request `req` of connection `id`, or holds it: when it is about a channel
    /// whose earlier `sub` by `id` waits for its answer or which has requests held already,
    /// and (unless it is a `pub` itself: the broker answers those in order) while a `pub` of
    /// `id` that came before it is unanswered.
    pub(crate) fn serve_request(&mut self, id: ConnId, req: Inbound) {
        let Some(ch) = req.channel() else { return self.serve_now(id, req) };
        let is_pub = req.is_pub();
        let (received, answered) = self.waiting.pubs(id);
        let behind_pub = answered < received && !is_pub;
        let holds = self.waiting.by_conn.get(&id).is_some_and(|h| h.by_ch.contains_key(ch));
        if is_pub {
            self.waiting.pubs.entry(id).or_insert((0, 0)).0 += 1;
        }
        if behind_pub || holds || self.sub_pending(id, ch) {
            let h =
                self.waiting.by_conn.entry(id).or_insert_with(|| ConnHeld { wants: u64::MAX, ..ConnHeld::default() });
            if h.count >= MAX_HELD {
                self.metrics().session.limit_refused(Limit::HeldRequests);
                let reason = CloseReason::limit(Limit::HeldRequests.key()).to_json();
                self.with_session(id, |s, ctx| s.close(ctx, CloseCode::Policy, &reason, ReapReason::Limit));
                return self.flush(id);
            }
            let q = h.by_ch.entry(ch.into()).or_default();
            if q.is_empty() && behind_pub {
                h.wants = h.wants.min(received);
            }
            q.push_back((received, req));
            h.count += 1;
            return;
        }
        self.serve_now(id, req);
        if is_pub && self.waiting.by_conn.get(&id).is_some_and(|h| self.waiting.pubs(id).1 >= h.wants) {
            self.serve_held(id, None); // a `pub` refused here may have been what others waited for
        }
    }

    /// An answer to one of `id`'s requests went out (`ch`: a `sub`'s, or `None`: a `pub`'s):
    /// serves, per channel in request order, the held requests that nothing holds any more.
    pub(crate) fn serve_held(&mut self, id: ConnId, ch: Option<&str>) {
        if self.conns.get(id).is_none() {
            return self.waiting.forget(id);
        }
        let chans: Vec<Box<str>> = match (ch, self.waiting.by_conn.get(&id)) {
            (_, None) => return,
            (Some(ch), Some(h)) if h.by_ch.contains_key(ch) => vec![ch.into()],
            (Some(_), Some(_)) => return,
            (None, Some(h)) => h.by_ch.keys().cloned().collect(),
        };
        for ch in chans {
            self.serve_channel(id, &ch);
        }
        let (received, answered) = self.waiting.pubs(id);
        match self.waiting.by_conn.get_mut(&id) {
            Some(h) if h.by_ch.is_empty() => {
                self.waiting.by_conn.remove(&id);
            }
            Some(h) => {
                // What the first held request of each channel still waits for.
                h.wants = h
                    .by_ch
                    .values()
                    .filter_map(|q| q.front())
                    .filter(|(ticket, r)| answered < *ticket && !r.is_pub())
                    .map(|(ticket, _)| *ticket)
                    .min()
                    .unwrap_or(u64::MAX);
            }
            None => {}
        }
        if answered >= received && !self.waiting.by_conn.contains_key(&id) {
            self.waiting.pubs.remove(&id);
        }
    }

    /// Serves `id`'s held requests about `ch` from the first on, until one must wait.
    fn serve_channel(&mut self, id: ConnId, ch: &str) {
        loop {
            let (_, answered) = self.waiting.pubs(id);
            let Some(h) = self.waiting.by_conn.get_mut(&id) else { return };
            let Some(q) = h.by_ch.get_mut(ch) else { return };
            let Some((ticket, req)) = q.front() else { return };
            if answered < *ticket && !req.is_pub() {
                return;
            }
            if self.sub_pending(id, ch) {
                return;
            }
            let h = self.waiting.by_conn.get_mut(&id).expect("held");
            let q = h.by_ch.get_mut(ch).expect("held channel");
            let (_, req) = q.pop_front().expect("held request");
            if q.is_empty() {
                h.by_ch.remove(ch);
            }
            h.count -= 1;
            self.serve_now(id, req);
        }
    }

    /// Whether `id` has a `sub` or a presence query of `ch` waiting for the broker's answer.
    fn sub_pending(&mut self, id: ConnId, ch: &str) -> bool {
        if self.waiting.presence_pending(id, ch) {
            return true;
        }
        let Some(chan) = self.local.find(ch) else { return false };
        self.conns.get(id).is_some_and(|s| s.subs.iter().any(|e| e.chan == chan && e.pos == PENDING))
    }

    /// One request of `id`, now (never serves held ones itself).
    fn serve_now(&mut self, id: ConnId, req: Inbound) {
        let op = match req {
            Inbound::Op(op) => op,
            Inbound::Answered { frame, .. } => return self.reply(id, frame),
        };
        match op {
            ClientOp::Sub { ch, from, epoch, join_leave } => {
                if self.authorize(id, Right::Subscribe, &ch, None) {
                    self.client_sub(id, &ch, from, epoch, join_leave);
                }
            }
            ClientOp::Presence { ch, cursor } => {
                if self.authorize(id, Right::Subscribe, &ch, None) {
                    self.client_presence(id, &ch, PresenceQuery::Members { cursor: cursor.map(Into::into) });
                }
            }
            ClientOp::PresenceStats { ch } => {
                if self.authorize(id, Right::Subscribe, &ch, None) {
                    self.client_presence(id, &ch, PresenceQuery::Stats);
                }
            }
            ClientOp::Unsub { ch } => self.client_unsub(id, &ch),
            ClientOp::Pub { ch, id: pub_id, data } => {
                if self.authorize(id, Right::Publish, &ch, Some(&pub_id)) {
                    let data = Bytes::copy_from_slice(data.get().as_bytes());
                    self.publish(id, &ch, Some(pub_id.into_boxed_str()), data);
                } else {
                    self.waiting.pub_answered(id);
                }
            }
            ClientOp::Refresh { token } => self.client_refresh(id, &token),
        }
    }
}
