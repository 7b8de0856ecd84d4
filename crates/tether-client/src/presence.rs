//! Presence as the client sees it (docs/protocol.md, "Presence"): the [`Member`] and
//! [`PresenceStats`] types, and [`Queries`], the `presence` / `presence_stats` requests waiting
//! for their answers.
//!
//! The server answers the requests about one channel in the order they came
//! (docs/protocol.md, "Answers"), and its `error` answers name the channel but no request. So
//! each connection keeps, per channel, the requests still unanswered in the order they were
//! sent ([`Asked`]): an answer about `ch` belongs to the oldest of them. Queries outlive a
//! connection: after a reconnect each one is asked again from its first page.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use super::conn::{send_on, Writes};
use super::wire::{need, Inbound};
use super::ClientError;

/// One member of a presence channel: one connection subscribed to it
/// (`{"client","user","info"}` on the wire).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Member {
    /// The connection's id: unique across nodes and over a node's life, opaque.
    pub client: String,
    /// The JWT `sub` of the connection's token; `None` on a server without `[auth]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The token's `info` claim (any JSON, at most the server's `presence.info_max_bytes`),
    /// exactly as the server sent it; `None` when the token had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<Box<RawValue>>,
}

/// Members are equal when their `client`, `user` and `info` text are.
impl PartialEq for Member {
    fn eq(&self, other: &Self) -> bool {
        self.client == other.client
            && self.user == other.user
            && self.info.as_deref().map(RawValue::get) == other.info.as_deref().map(RawValue::get)
    }
}

impl Eq for Member {}

impl fmt::Display for Member {
    /// The member as one compact JSON object, as the server sends it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| fmt::Error)?)
    }
}

/// How many are in a presence channel: the answer to `presence_stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PresenceStats {
    /// Channel name.
    pub ch: String,
    /// Connections subscribed (tracked members).
    pub clients: u64,
    /// Distinct JWT `sub`s among them; 0 on a server without `[auth]`.
    pub users: u64,
}

/// Where a query's answer goes.
pub(crate) enum Reply {
    /// Every member, all pages gathered.
    Members(oneshot::Sender<Result<Vec<Member>, ClientError>>),
    /// The counts.
    Stats(oneshot::Sender<Result<PresenceStats, ClientError>>),
}

impl Reply {
    fn is_closed(&self) -> bool {
        match self {
            Reply::Members(r) => r.is_closed(),
            Reply::Stats(r) => r.is_closed(),
        }
    }

    fn fail(self, e: ClientError) {
        // A dropped receiver means the caller stopped waiting: nothing to tell.
        let _ = match self {
            Reply::Members(r) => r.send(Err(e)).map_err(drop),
            Reply::Stats(r) => r.send(Err(e)).map_err(drop),
        };
    }
}

/// A `presence` or `presence_stats` request of the application.
pub(crate) struct Query {
    pub ch: String,
    pub reply: Reply,
    /// Members gathered from the pages answered so far on this connection.
    got: Vec<Member>,
}

impl Query {
    pub(crate) fn new(ch: String, reply: Reply) -> Self {
        Self { ch, reply, got: Vec::new() }
    }

    /// The request for the page after `cursor` (the first page without one), or for the counts.
    fn frame(&self, cursor: Option<&str>) -> String {
        let op = match self.reply {
            Reply::Members(_) => "presence",
            Reply::Stats(_) => "presence_stats",
        };
        serde_json::to_string(&Request { op, ch: &self.ch, cursor }).unwrap_or_default()
    }
}

#[derive(Serialize)]
struct Request<'a> {
    op: &'static str,
    ch: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cursor: Option<&'a str>,
}

/// A request about a channel sent on this connection and not yet answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    /// A `sub`: answered by `subscribed`, `reset` or `error`.
    Sub,
    /// An `unsub`: answered by `unsubscribed` or `error`.
    Unsub,
    /// A page of a `presence` or a `presence_stats` of the query with this number.
    Query(u64),
}

/// The requests of one connection not yet answered, per channel, oldest first.
#[derive(Default)]
pub(crate) struct Unanswered(HashMap<String, VecDeque<Asked>>);

impl Unanswered {
    pub(crate) fn push(&mut self, ch: &str, asked: Asked) {
        self.0.entry(ch.to_string()).or_default().push_back(asked);
    }

    /// Takes the oldest unanswered request about `ch` when `answers(it)`: the frame just read
    /// answers it. A frame that answers nothing pending (a `reset` on a live subscription) leaves
    /// the queue as it is.
    pub(crate) fn answer(&mut self, ch: &str, answers: impl Fn(Asked) -> bool) -> Option<Asked> {
        let q = self.0.get_mut(ch)?;
        let first = *q.front()?;
        if !answers(first) {
            return None;
        }
        q.pop_front();
        if q.is_empty() {
            self.0.remove(ch);
        }
        Some(first)
    }
}

/// The application's presence queries still waiting for an answer, by number.
#[derive(Default)]
pub(crate) struct Queries {
    next: u64,
    pending: BTreeMap<u64, Query>,
}

impl Queries {
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Adds `q`; when a connection is open, sends its first request on it (`send`) and notes it
    /// in `asked`.
    pub(crate) fn add(&mut self, q: Query, conn: Option<(&mut Unanswered, &dyn Fn(String))>) {
        let n = self.next;
        self.next += 1;
        if let Some((asked, send)) = conn {
            send(q.frame(None));
            asked.push(&q.ch, Asked::Query(n));
        }
        self.pending.insert(n, q);
    }

    /// A new connection: every query starts again from its first page on it.
    pub(crate) fn resend(&mut self, asked: &mut Unanswered, send: &dyn Fn(String)) {
        self.pending.retain(|_, q| !q.reply.is_closed());
        for (n, q) in &mut self.pending {
            q.got.clear();
            send(q.frame(None));
            asked.push(&q.ch, Asked::Query(*n));
        }
    }

    /// The `presence` page for query `n`: gathers its members; asks for the next page (`send`,
    /// noted in `asked`) when `next` is given, else answers the application with every member.
    fn page(
        &mut self,
        n: u64,
        members: Vec<Member>,
        next: Option<String>,
        asked: &mut Unanswered,
        send: &dyn Fn(String),
    ) {
        let Some(mut q) = self.pending.remove(&n) else { return };
        if q.reply.is_closed() {
            return;
        }
        q.got.extend(members);
        match (next, q.reply) {
            (Some(cursor), reply) => {
                q.reply = reply;
                send(q.frame(Some(&cursor)));
                asked.push(&q.ch, Asked::Query(n));
                self.pending.insert(n, q);
            }
            (None, Reply::Members(r)) => {
                let _ = r.send(Ok(q.got));
            }
            (None, Reply::Stats(r)) => {
                let e = ClientError::Protocol("`presence` frame answering a `presence_stats`".into());
                let _ = r.send(Err(e));
            }
        }
    }

    /// The `presence_stats` answer for query `n`.
    fn stats(&mut self, n: u64, stats: PresenceStats) {
        match self.pending.remove(&n).map(|q| q.reply) {
            Some(Reply::Stats(r)) => {
                let _ = r.send(Ok(stats));
            }
            Some(other) => {
                other.fail(ClientError::Protocol("`presence_stats` frame answering a `presence`".into()));
            }
            None => {}
        }
    }

    /// The server refused query `n` (an `error` answer).
    fn refused(&mut self, n: u64, e: ClientError) {
        if let Some(q) = self.pending.remove(&n) {
            q.reply.fail(e);
        }
    }

    /// A `presence` page or a `presence_stats` answer (`f.op`): it answers the oldest request
    /// about its channel on this connection, a query (a frame that answers none is ignored).
    ///
    /// # Errors
    /// [`ClientError::Protocol`] when a field the `op` needs is missing.
    pub(crate) fn answered(&mut self, f: Inbound, asked: &mut Unanswered, writes: &Writes) -> Result<(), ClientError> {
        let op = f.op.as_str();
        let ch = need(op, f.ch, "ch")?;
        if op == "presence" {
            let members = need(op, f.members, "members")?;
            if let Some(Asked::Query(n)) = asked.answer(&ch, |a| matches!(a, Asked::Query(_))) {
                self.page(n, members, f.next, asked, &|t| send_on(writes, t));
            }
        } else {
            let clients = need(op, f.clients, "clients")?;
            let users = need(op, f.users, "users")?;
            if let Some(Asked::Query(n)) = asked.answer(&ch, |a| matches!(a, Asked::Query(_))) {
                self.stats(n, PresenceStats { ch, clients, users });
            }
        }
        Ok(())
    }

    /// An `error` that names a channel and no publish answers the oldest request about that
    /// channel; when that is a query, the query fails with [`ClientError::Refused`] and this
    /// returns `true`. Otherwise (`false`) it answered a `sub` or `unsub`, or is a refusal of
    /// its own (a refreshed token ending a subscription), for the task to handle.
    pub(crate) fn refused_by(&mut self, f: &Inbound, asked: &mut Unanswered) -> bool {
        let (Some(ch), None) = (&f.ch, &f.id) else { return false };
        let Some(Asked::Query(n)) = asked.answer(ch, |_| true) else { return false };
        let e = ClientError::Refused {
            code: f.code.clone().unwrap_or_default(),
            reason: f.reason.clone().unwrap_or_default(),
            retry_after: f.retry_after_ms.map(std::time::Duration::from_millis),
        };
        self.refused(n, e);
        true
    }

    /// The client stopped: every query fails with `e`.
    pub(crate) fn fail_all(&mut self, e: &ClientError) {
        for (_, q) in std::mem::take(&mut self.pending) {
            q.reply.fail(e.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn member(client: &str) -> Member {
        Member { client: client.into(), user: None, info: None }
    }

    #[test]
    fn members_round_trip_leaving_out_what_is_absent() {
        let m: Member = serde_json::from_str(r#"{"client":"n-0-1-1","user":"ada","info":{"name": "Ada"}}"#).unwrap();
        assert_eq!(m.user.as_deref(), Some("ada"));
        assert_eq!(m.info.as_deref().map(RawValue::get), Some(r#"{"name": "Ada"}"#));
        assert_eq!(m.to_string(), r#"{"client":"n-0-1-1","user":"ada","info":{"name": "Ada"}}"#);
        assert_eq!(member("x").to_string(), r#"{"client":"x"}"#);
    }

    #[test]
    fn answers_go_to_the_oldest_request_of_their_channel() {
        let mut asked = Unanswered::default();
        asked.push("a", Asked::Sub);
        asked.push("a", Asked::Query(0));
        asked.push("b", Asked::Query(1));
        // A live `reset` while the oldest request of `a` is a query answers nothing.
        assert_eq!(asked.answer("b", |x| x == Asked::Sub), None);
        assert_eq!(asked.answer("a", |x| x == Asked::Sub), Some(Asked::Sub));
        assert_eq!(asked.answer("a", |_| true), Some(Asked::Query(0)));
        assert_eq!(asked.answer("a", |_| true), None);
        assert_eq!(asked.answer("b", |_| true), Some(Asked::Query(1)));
    }

    #[test]
    fn pages_are_followed_and_gathered() {
        let sent = RefCell::new(Vec::new());
        let send = |f: String| sent.borrow_mut().push(f);
        let (mut queries, mut asked) = (Queries::default(), Unanswered::default());
        let (tx, mut rx) = oneshot::channel();
        queries.add(Query::new("room".into(), Reply::Members(tx)), Some((&mut asked, &send)));
        assert_eq!(sent.borrow().as_slice(), [r#"{"op":"presence","ch":"room"}"#]);
        let Some(Asked::Query(n)) = asked.answer("room", |_| true) else { panic!("asked") };
        queries.page(n, vec![member("a"), member("b")], Some("0-2-1".into()), &mut asked, &send);
        assert_eq!(sent.borrow()[1], r#"{"op":"presence","ch":"room","cursor":"0-2-1"}"#);
        assert!(rx.try_recv().is_err(), "not done after the first page");
        // A reconnect asks again from the first page, forgetting what the old connection gave.
        let mut asked = Unanswered::default();
        queries.resend(&mut asked, &send);
        assert_eq!(sent.borrow()[2], r#"{"op":"presence","ch":"room"}"#);
        let Some(Asked::Query(n)) = asked.answer("room", |_| true) else { panic!("asked") };
        queries.page(n, vec![member("c")], None, &mut asked, &send);
        assert_eq!(rx.try_recv().unwrap().unwrap(), vec![member("c")]);
        assert!(queries.is_empty());
    }

    #[test]
    fn refusals_and_stops_fail_the_query() {
        let (mut queries, mut asked) = (Queries::default(), Unanswered::default());
        let (tx, mut rx) = oneshot::channel();
        queries.add(Query::new("room".into(), Reply::Stats(tx)), Some((&mut asked, &|_| {})));
        let refusal = ClientError::Refused { code: "limit".into(), reason: "r".into(), retry_after: None };
        queries.refused(0, refusal.clone());
        assert_eq!(rx.try_recv().unwrap(), Err(refusal));
        let (tx, mut rx) = oneshot::channel();
        queries.add(Query::new("room".into(), Reply::Members(tx)), None);
        queries.fail_all(&ClientError::Shutdown);
        assert_eq!(rx.try_recv().unwrap(), Err(ClientError::Shutdown));
    }
}
