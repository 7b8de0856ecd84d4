//! The background connection task: connect, resubscribe from committed positions, resend the
//! outbox and the presence queries, read frames, and reconnect with backoff (docs/protocol.md),
//! to the next URL when there are several (`urls`). Subscriptions, resume positions, the outbox
//! and the queries belong to the task, not to a connection, so they carry over to whichever URL
//! answers.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_tungstenite::connect_async_with_config;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::close::{classify_close, retry_hint, CloseAction};
use super::conn::{send_on, send_sub, write_loop, Conn, Ws};
use super::ended::{abnormal, handshake_ended, read_error, Ended};
use super::offsets::Position;
use super::presence::{Asked, Queries, Unanswered};
use super::shared::{is_status, lock, Command, Outq, Pending, Shared};
use super::token::{url_with_token, TokenSource};
use super::urls::Rotation;
use super::wire::{need, refresh_frame, unsub_frame, Inbound};
use super::{Ack, ClientError, Event};

/// How long a closing connection may take to flush our close frame and read the peer's.
const CLOSE_DRAIN: Duration = Duration::from_secs(1);
/// How long reading may continue after the write half failed, to pick up the close frame
/// that usually explains why.
const WRITE_FAILURE_GRACE: Duration = Duration::from_secs(1);

/// One subscription of the application.
struct Sub {
    ch: String,
    /// Made with `"join_leave": true` on every connection.
    join_leave: bool,
    /// The server confirmed it on some connection: a later confirmation is a resubscription,
    /// and with `join_leave` the application's member list may be stale.
    confirmed: bool,
}

/// A request to send again after an `unavailable` or `unknown_outcome` error.
enum Retry {
    /// The publish with this id (still in the outbox).
    Pub(String),
    /// The subscription of this channel.
    Sub(String),
}

/// The wait after an `unavailable` error that carried no `retry_after_ms`.
const UNAVAILABLE_RETRY: Duration = Duration::from_secs(1);

/// Events the task may hold beyond the application's channel while a presence query waits
/// for its answer: it keeps reading so that the answer can come, within this bound.
const QUERY_SLACK: usize = 4096;

pub(crate) struct Task {
    /// Which URL each (re)connection goes to, and the backoff before it.
    rotation: Rotation,
    connect_timeout: Duration,
    idle_timeout: Option<Duration>,
    shared: Arc<Shared>,
    cmds: mpsc::UnboundedReceiver<Command>,
    events: mpsc::Sender<Event>,
    /// Subscribed channels in subscription order (resubscribed in this order).
    subs: Vec<Sub>,
    /// Presence queries of the application waiting for their answers.
    queries: Queries,
    /// Publishes not yet acked, in publish order (resent in this order).
    outbox: VecDeque<Pending>,
    /// Requests the server refused as `unavailable` (its broker cannot reach Redis), sent
    /// again on this connection when due; a reconnect resends everything anyway.
    retries: Vec<(Instant, Retry)>,
    out: Outq,
    /// Where the token comes from, when the server needs one (docs/security.md).
    token: Option<TokenSource>,
    /// The token the connection holds (sent on connect, or accepted by a `refreshed`).
    held_token: Option<String>,
    /// A token sent in a `refresh` and not yet answered.
    refreshing: Option<String>,
}

impl Task {
    pub(crate) fn new(
        rotation: Rotation,
        connect_timeout: Duration,
        idle_timeout: Option<Duration>,
        shared: Arc<Shared>,
        cmds: mpsc::UnboundedReceiver<Command>,
        events: mpsc::Sender<Event>,
        token: Option<TokenSource>,
    ) -> Self {
        Self {
            rotation,
            connect_timeout,
            idle_timeout,
            shared,
            cmds,
            events,
            subs: Vec::new(),
            queries: Queries::default(),
            outbox: VecDeque::new(),
            retries: Vec::new(),
            out: Outq::default(),
            token,
            held_token: None,
            refreshing: None,
        }
    }

    pub(crate) async fn run(mut self) {
        let end = loop {
            let url = self.rotation.url().to_string();
            // How long the connection was open; `None` when the attempt failed.
            let (ended, up) = match self.target(&url) {
                Err(reason) => (abnormal(reason), None),
                Ok(target) => {
                    let attempt = timeout(self.connect_timeout, connect_async_with_config(target, None, true));
                    match self.offline(attempt).await {
                        Err(end) => (end, None),
                        Ok(Err(_elapsed)) => (abnormal("connect timed out"), None),
                        Ok(Ok(Err(e))) => (handshake_ended(e), None),
                        Ok(Ok(Ok((ws, _response)))) => {
                            self.shared.counters.connects.fetch_add(1, Ordering::Relaxed);
                            let opened = Instant::now();
                            let ended = self.session(ws, &url).await;
                            (ended, Some(opened.elapsed()))
                        }
                    }
                }
            };
            match ended {
                Ended::Reconnect { code, reason, floor } => {
                    let retry_in = self.rotation.ended(up, floor);
                    let next = self.rotation.url();
                    tracing::debug!(%url, ?code, %reason, ?retry_in, %next, "tether client disconnected");
                    let ev = Event::Disconnected { code, reason, retry_in };
                    self.out.push_status(ev, &self.shared.counters);
                    if let Err(end) = self.offline(sleep(retry_in)).await {
                        break end;
                    }
                }
                other => break other,
            }
        };
        self.finish(end).await;
    }

    /// The URL to connect to: `url` itself, or with a fresh token from the source as
    /// `?token=` (logs name `url`, never this). `Err` when the source has no token.
    fn target(&mut self, url: &str) -> Result<String, String> {
        let Some(source) = &self.token else { return Ok(url.to_string()) };
        let token = source.fetch().map_err(|e| format!("no token for the connection: {e}"))?;
        let target = url_with_token(url, &token);
        self.held_token = Some(token);
        self.refreshing = None;
        Ok(target)
    }

    /// The server says the connection's token expired: sends `refresh` with a newer token
    /// from the source. Without one (a fixed token, a failing source) the server closes with
    /// 4001 after its grace and the reconnect asks the source again.
    fn refresh_token(&mut self, conn: &Conn) {
        let Some(source) = &self.token else { return };
        match source.fetch() {
            Ok(t) if Some(&t) != self.held_token.as_ref() => {
                conn.send(refresh_frame(&t));
                self.refreshing = Some(t);
            }
            Ok(_) => tracing::debug!("token expired and the token source has no newer one: waiting for 4001"),
            Err(e) => tracing::debug!(error = %e, "token expired and the token source failed: waiting for 4001"),
        }
    }

    /// Drives `fut` while no connection is open: commands are queued, events delivered.
    async fn offline<F: Future>(&mut self, fut: F) -> Result<F::Output, Ended> {
        tokio::pin!(fut);
        // A second sender handle: a reserved slot borrows its sender, and must not borrow `self`.
        let events = self.events.clone();
        loop {
            tokio::select! {
                out = &mut fut => return Ok(out),
                cmd = self.cmds.recv() => {
                    if let Some(end) = self.command(cmd, None) {
                        return Err(end);
                    }
                }
                permit = events.reserve(), if !self.out.q.is_empty() => {
                    self.out.deliver(permit);
                }
            }
        }
    }

    fn command(&mut self, cmd: Option<Command>, conn: Option<&mut Conn>) -> Option<Ended> {
        match cmd {
            None => return Some(Ended::Shutdown(None)),
            Some(Command::Close(done)) => return Some(Ended::Shutdown(Some(done))),
            Some(Command::Subscribe { ch, join_leave }) => {
                if !self.subscribed(&ch) {
                    if let Some(conn) = conn {
                        send_sub(&self.shared, conn, &ch, join_leave);
                    }
                    self.subs.push(Sub { ch, join_leave, confirmed: false });
                }
            }
            Some(Command::Unsubscribe(ch)) => {
                if let Some(i) = self.subs.iter().position(|s| s.ch == ch) {
                    self.subs.remove(i);
                    if let Some(conn) = conn {
                        conn.chans.remove(&ch);
                        conn.send(unsub_frame(&ch));
                        conn.asked.push(&ch, Asked::Unsub);
                    }
                }
            }
            Some(Command::Query(q)) => {
                let on = conn.map(|c| (&mut c.asked, &c.writes));
                match on {
                    Some((asked, writes)) => self.queries.add(q, Some((asked, &|f| send_on(writes, f)))),
                    None => self.queries.add(q, None),
                }
            }
            Some(Command::Publish(p)) => {
                if let Some(conn) = conn {
                    conn.send(p.frame.clone());
                }
                self.outbox.push_back(p);
            }
        }
        None
    }

    /// Sends again the requests refused as `unavailable` whose wait is over.
    fn retry_due(&mut self, conn: &mut Conn) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.retries).into_iter().partition(|(at, _)| *at <= now);
        self.retries = later;
        for (_, r) in due {
            match r {
                Retry::Pub(id) => {
                    if let Some(p) = self.outbox.iter().find(|p| p.id == id) {
                        conn.send(p.frame.clone());
                    }
                }
                Retry::Sub(ch) => {
                    let join_leave = self.subs.iter().find(|s| s.ch == ch).map(|s| s.join_leave);
                    if let Some(join_leave) = join_leave.filter(|_| !conn.chans.contains_key(&ch)) {
                        send_sub(&self.shared, conn, &ch, join_leave);
                    }
                }
            }
        }
    }

    fn subscribed(&self, ch: &str) -> bool {
        self.subs.iter().any(|s| s.ch == ch)
    }

    /// The server confirmed the subscription of `ch` (`subscribed`, or `reset` answering the
    /// `sub`): after the first time, a `join_leave` subscription's member list may be stale
    /// (the client did not see the joins and leaves while it was away), and the application is
    /// told so (docs/clients.md).
    fn confirmed(&mut self, ch: &str) {
        if let Some(s) = self.subs.iter_mut().find(|s| s.ch == ch) {
            if s.join_leave && s.confirmed {
                self.out.push_data(Event::PresenceReset { ch: ch.to_string(), reconnected: true });
            }
            s.confirmed = true;
        }
    }

    /// One open connection to `url`, from resubscribe to close.
    async fn session(&mut self, ws: Ws, url: &str) -> Ended {
        let (sink, mut stream) = ws.split();
        let (writes, queued) = mpsc::unbounded_channel();
        let mut writer: JoinHandle<()> = tokio::spawn(write_loop(sink, queued));
        let mut writer_done = false;
        let mut conn = Conn { writes, chans: HashMap::new(), asked: Unanswered::default() };
        for s in &self.subs {
            send_sub(&self.shared, &mut conn, &s.ch, s.join_leave);
        }
        for p in &self.outbox {
            conn.send(p.frame.clone());
        }
        let writes = conn.writes.clone();
        self.queries.resend(&mut conn.asked, &|f| send_on(&writes, f));
        let url = tether_proto::redact::redact_url(url);
        self.out.push_status(Event::Connected { url }, &self.shared.counters);

        let far = Duration::from_secs(86_400 * 365);
        let idle_limit = self.idle_timeout;
        let mut last_seen = Instant::now();
        let idle = sleep_until(last_seen + idle_limit.unwrap_or(far));
        tokio::pin!(idle);
        let mut grace: Option<Instant> = None;

        let events = self.events.clone();
        self.retries.clear();
        let ended = loop {
            let next_retry = self.retries.iter().map(|(at, _)| *at).min();
            // Behind the application, reading stops (the server's queue policy takes over),
            // except that a presence query's answer must still be able to arrive.
            let reading = self.out.data == 0 || (!self.queries.is_empty() && self.out.data < QUERY_SLACK);
            if !reading {
                // Time spent waiting for the application is not the server's silence.
                last_seen = Instant::now();
            }
            tokio::select! {
                cmd = self.cmds.recv() => {
                    if let Some(end) = self.command(cmd, Some(&mut conn)) {
                        break end;
                    }
                }
                () = sleep_until(next_retry.unwrap_or_else(|| Instant::now() + far)), if next_retry.is_some() => {
                    self.retry_due(&mut conn);
                }
                permit = events.reserve(), if !self.out.q.is_empty() => {
                    self.out.deliver(permit);
                }
                frame = stream.next(), if reading => {
                    last_seen = Instant::now();
                    if let Some(end) = self.inbound(frame, &mut conn) {
                        break end;
                    }
                }
                () = &mut idle, if reading && idle_limit.is_some() => {
                    let due = last_seen + idle_limit.unwrap_or(far);
                    if Instant::now() >= due {
                        break abnormal("no frame from the server within the idle timeout");
                    }
                    idle.as_mut().reset(due);
                }
                _ = &mut writer, if !writer_done => {
                    writer_done = true;
                    grace = Some(Instant::now() + WRITE_FAILURE_GRACE);
                }
                () = sleep_until(grace.unwrap_or_else(|| Instant::now() + far)), if grace.is_some() => {
                    break abnormal("write to the server failed");
                }
            }
        };

        let (close, drain) = match &ended {
            Ended::Shutdown(_) => (Some((CloseCode::Normal, "client shutdown")), true),
            Ended::Stop(ClientError::Protocol(_)) => (Some((CloseCode::Protocol, "")), true),
            // The server's close frame: tungstenite queued the reply, draining flushes it.
            Ended::Stop(_) | Ended::Reconnect { code: Some(_), .. } => (None, true),
            Ended::Reconnect { code: None, .. } => (None, false),
        };
        if let Some((code, reason)) = close {
            let frame = CloseFrame { code, reason: reason.into() };
            let _ = conn.writes.send(Message::Close(Some(frame)));
        }
        drop(conn);
        if drain {
            let _ = timeout(CLOSE_DRAIN, async {
                if !writer_done {
                    let _ = (&mut writer).await;
                }
                while let Some(Ok(_)) = stream.next().await {}
            })
            .await;
        }
        writer.abort();
        ended
    }

    fn inbound(&mut self, frame: Option<Result<Message, WsError>>, conn: &mut Conn) -> Option<Ended> {
        match frame {
            None => Some(abnormal("connection closed without a close frame")),
            Some(Err(e)) => Some(read_error(e)),
            Some(Ok(Message::Text(text))) => self.text(text.as_str(), conn).err().map(Ended::Stop),
            Some(Ok(Message::Close(frame))) => {
                let (code, reason) = frame.map_or((1005, String::new()), |f| (u16::from(f.code), f.reason.to_string()));
                Some(match classify_close(code) {
                    CloseAction::Reconnect => {
                        let floor = retry_hint(&reason);
                        Ended::Reconnect { code: Some(code), reason, floor }
                    }
                    CloseAction::Stop => Ended::Stop(ClientError::Closed { code, reason }),
                })
            }
            Some(Ok(Message::Binary(_))) => {
                Some(Ended::Stop(ClientError::Protocol("binary frame; protocol v1 uses text frames".into())))
            }
            // Pings are answered by tungstenite; pongs and raw frames carry nothing for us.
            Some(Ok(_)) => None,
        }
    }

    fn text(&mut self, text: &str, conn: &mut Conn) -> Result<(), ClientError> {
        let f = Inbound::parse(text)?;
        let op = f.op.as_str();
        if op == "error" && self.queries.refused_by(&f, &mut conn.asked) {
            return Ok(());
        }
        let counters = &self.shared.counters;
        match op {
            "msg" => {
                let ch = need(op, f.ch, "ch")?;
                let seq = need(op, f.seq, "seq")?;
                let data = need(op, f.data, "data")?;
                if !self.subscribed(&ch) {
                    return Ok(()); // in flight when we unsubscribed
                }
                let st = conn.chans.entry(ch.clone()).or_default();
                if let Some(last) = st.last {
                    if seq <= last {
                        counters.duplicates.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    if seq > last + 1 {
                        counters.gaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
                st.last = Some(seq);
                self.out.push_data(Event::Message { ch, seq, data, raw: text.to_string() });
            }
            "subscribed" => {
                let ch = need(op, f.ch, "ch")?;
                let seq = need(op, f.seq, "seq")?;
                let epoch = need(op, f.epoch, "epoch")?;
                let st = conn.chans.entry(ch.clone()).or_default();
                // A resume replays from+1.., a fresh subscription goes live after the head.
                st.last = Some(match (f.recovered, st.from) {
                    (Some(true), Some(from)) => from,
                    _ => seq,
                });
                {
                    let mut book = lock(&self.shared.book);
                    match book.positions.get_mut(&ch) {
                        // Starting live: the head is where a reconnect must pick up, even if
                        // nothing is committed before the connection drops.
                        None => {
                            let pos = Position { seq, epoch: Some(epoch.clone()) };
                            book.positions.insert(ch.clone(), pos);
                        }
                        Some(p) if p.epoch.is_none() => p.epoch = Some(epoch.clone()),
                        Some(_) => {}
                    }
                }
                let recovered = f.recovered;
                conn.asked.answer(&ch, |a| a == Asked::Sub);
                self.out.push_data(Event::Subscribed { ch: ch.clone(), seq, epoch, recovered });
                self.confirmed(&ch);
            }
            "reset" => {
                let ch = need(op, f.ch, "ch")?;
                let seq = need(op, f.seq, "seq")?;
                let epoch = need(op, f.epoch, "epoch")?;
                let reason = f.reason.unwrap_or_default();
                let oldest = f.oldest.unwrap_or(0);
                conn.chans.entry(ch.clone()).or_default().last = Some(seq);
                // The answer to a `sub` whose resume point is gone, or (Redis) a live reset.
                let answer = conn.asked.answer(&ch, |a| a == Asked::Sub).is_some();
                self.out.push_data(Event::Reset { ch: ch.clone(), seq, epoch, reason, oldest });
                if answer {
                    self.confirmed(&ch);
                }
            }
            "presence_diff" => {
                let ch = need(op, f.ch, "ch")?;
                let joins = need(op, f.joins, "joins")?;
                let leaves = need(op, f.leaves, "leaves")?;
                if self.subscribed(&ch) {
                    self.out.push_data(Event::PresenceDiff { ch, joins, leaves, raw: text.to_string() });
                }
            }
            "presence_reset" => {
                let ch = need(op, f.ch, "ch")?;
                if self.subscribed(&ch) {
                    self.out.push_data(Event::PresenceReset { ch, reconnected: false });
                }
            }
            "presence" | "presence_stats" => self.queries.answered(f, &mut conn.asked, &conn.writes)?,
            "ack" => {
                let id = need(op, f.id, "id")?;
                let seq = need(op, f.seq, "seq")?;
                // A resend after a reconnect can be acked twice; only the first counts.
                if let Some(i) = self.outbox.iter().position(|p| p.id == id) {
                    if let Some(p) = self.outbox.remove(i) {
                        let ch = f.ch.unwrap_or(p.ch);
                        let _ = p.reply.send(Ok(Ack { id, ch, seq, raw: text.to_string() }));
                        drop(p.permit);
                    }
                }
            }
            "error" if f.code.as_deref() == Some("token_expired") => self.refresh_token(conn),
            // Ended by the server (docs/api.md): not subscribed again after a reconnect.
            "unsubscribed" if f.reason.as_deref() == Some("server") => {
                if let Some(ch) = f.ch {
                    self.subs.retain(|s| s.ch != ch);
                    conn.chans.remove(&ch);
                    self.out.push_data(Event::Unsubscribed { ch });
                }
            }
            // The answer to an `unsub` (its channel was dropped from `subs` when it was sent).
            "unsubscribed" => {
                if let Some(ch) = &f.ch {
                    conn.asked.answer(ch, |a| a == Asked::Unsub);
                }
            }
            "refreshed" => {
                if let Some(t) = self.refreshing.take() {
                    self.held_token = Some(t);
                }
            }
            // `unavailable`: the server's broker cannot reach Redis (nothing stored);
            // `unknown_outcome`: it may be stored. Either way the request is safe to repeat
            // (a publish keeps its id, so the broker answers a stored one with its seq), so it
            // is sent again after the hint, not failed.
            "error" if matches!(f.code.as_deref(), Some("unavailable" | "unknown_outcome")) => {
                let retry_in = f.retry_after_ms.map_or(UNAVAILABLE_RETRY, Duration::from_millis);
                let at = Instant::now() + retry_in;
                let mut ch = f.ch.clone();
                let retried = if let Some(id) = f.id.clone().filter(|id| self.outbox.iter().any(|p| p.id == *id)) {
                    if let Some(p) = self.outbox.iter().find(|p| p.id == id) {
                        ch.get_or_insert_with(|| p.ch.clone());
                    }
                    self.retries.push((at, Retry::Pub(id)));
                    true
                } else if let Some(ch) = f.ch.clone().filter(|ch| self.subscribed(ch)) {
                    conn.chans.remove(&ch);
                    self.retries.push((at, Retry::Sub(ch)));
                    true
                } else {
                    false
                };
                if retried {
                    let (code, reason) = (f.code.unwrap_or_default(), f.reason.unwrap_or_default());
                    let ev = Event::Retrying { code, reason, id: f.id, ch, retry_in };
                    self.out.push_status(ev, &self.shared.counters);
                }
            }
            "error" => {
                let code = f.code.unwrap_or_default();
                let reason = f.reason.unwrap_or_default();
                let pending = f.id.as_ref().and_then(|id| self.outbox.iter().position(|p| p.id == *id));
                match pending.and_then(|i| self.outbox.remove(i)) {
                    Some(p) => {
                        let retry_after = f.retry_after_ms.map(Duration::from_millis);
                        let _ = p.reply.send(Err(ClientError::Refused { code, reason, retry_after }));
                    }
                    None => {
                        let final_refusal = matches!(code.as_str(), "forbidden" | "presence_off");
                        if let Some(ch) = f.ch.as_ref().filter(|_| final_refusal) {
                            // The token does not (or no longer) allow it, or the channel's rule
                            // has no join_leave: do not resubscribe.
                            self.subs.retain(|s| s.ch != *ch);
                            conn.chans.remove(ch);
                        }
                        self.out.push_data(Event::Error { code, reason, id: f.id, ch: f.ch })
                    }
                }
            }
            // Unknown ops are ignored so a newer server can add frames.
            _ => tracing::debug!(op, "ignoring unknown server frame"),
        }
        Ok(())
    }

    async fn finish(mut self, end: Ended) {
        let (err, done) = match end {
            Ended::Stop(e) => (e, None),
            Ended::Shutdown(done) => (ClientError::Shutdown, done),
            Ended::Reconnect { .. } => (ClientError::Shutdown, None),
        };
        *lock(&self.shared.terminal) = Some(err.clone());
        self.shared.room.close();
        self.queries.fail_all(&err);
        for p in self.outbox.drain(..) {
            let _ = p.reply.send(Err(err.clone()));
        }
        self.cmds.close();
        while let Ok(cmd) = self.cmds.try_recv() {
            match cmd {
                Command::Publish(p) => {
                    let _ = p.reply.send(Err(err.clone()));
                }
                Command::Close(d) => {
                    let _ = d.send(());
                }
                // A dropped query's caller gets the terminal error, set above.
                Command::Subscribe { .. } | Command::Unsubscribe(_) | Command::Query(_) => {}
            }
        }
        if let Some(done) = done {
            let _ = done.send(());
            return;
        }
        // On a stop the application still gets every message received before it; after
        // them `next_event` returns the error.
        for ev in self.out.q.drain(..).filter(|ev| !is_status(ev)) {
            if self.events.send(ev).await.is_err() {
                break;
            }
        }
    }
}
