//! The tether client for ordinary tokio applications, the `tether sub` / `tether pub` /
//! `tether presence` command-line tools (docs/protocol.md, docs/clients.md), `tether feeds`,
//! the admin API's command line (docs/feeds.md), and `tether api`, the server API's
//! (docs/api.md).
//!
//! A [`Client`] owns one background task that holds the WebSocket connection to
//! `ws://HOST:PORT/ws`, reconnects with full-jitter backoff on the close codes of docs/protocol.md,
//! and after every reconnect resubscribes each channel from the last seq the application
//! **committed** and resends the publish outbox in its original order. Given several URLs
//! (several nodes sharing one broker), it moves to the next one on each reconnect, so a node's
//! death becomes a resume on another node ([`ClientConfig::urls`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), tether_client::ClientError> {
//! use tether_client::{Client, ClientConfig, Event};
//! let mut client = Client::connect(ClientConfig::new("ws://127.0.0.1:8080/ws"))?;
//! client.subscribe("news", None)?;
//! loop {
//!     match client.next_event().await? {
//!         Event::Message { ch, seq, data, .. } => {
//!             println!("{ch} #{seq}: {}", data.get()); // process and record it, then:
//!             client.commit(&ch, seq).await?;
//!         }
//!         Event::Reset { ch, .. } => { /* start over: re-fetch the state of `ch` */ }
//!         _ => {}
//!     }
//! }
//! # }
//! ```
//!
//! # Layout
//!
//! - [`close`]: which close codes reconnect and which stop; the `retry_after_ms` hint.
//! - `ended`: how a connection or an attempt ended (reconnect or stop), and the server's reason
//!   for a refused upgrade.
//! - `token`: [`TokenSource`], where the JWT comes from, and `?token=` on the URL.
//! - [`backoff`]: full-jitter reconnect delays.
//! - `urls`: the URL list: parsing, validation, and which URL each reconnect goes to.
//! - [`offsets`]: the offset file (committed positions that survive a process restart).
//! - `wire`: client frames out, server frames in (docs/protocol.md).
//! - `session`: the application side: [`Client`], [`Publisher`], [`AckHandle`],
//!   [`SubscribeOptions`].
//! - `presence`: [`Member`], [`PresenceStats`], and the `presence` / `presence_stats` queries
//!   waiting for their answers (matched per channel in request order).
//! - `shared`: resume positions, counters and commands shared by both sides.
//! - `task`: the background connection task: connect, resubscribe, outbox, dedup, reconnect.
//! - `conn`: one open connection as the task sees it: its writer, what was sent on it per
//!   channel, and the requests it has not answered yet.
//! - `cli`: [`run_sub`] and [`run_pub`], and what the commands share (URL argument, stderr
//!   lines, signals).
//! - `presence_cli`: [`run_presence`], `tether presence`.
//! - `feeds_cli`: [`FeedsArgs`], `tether feeds` (blocking HTTP/1.1 to a node's `/feeds` admin
//!   API; no tokio).
//! - `api_cli`: [`ApiArgs`], `tether api` (the server API under `/api/`, docs/api.md).
//! - `node_http`: what both call a node's HTTP API with (ureq), and their exit codes.

pub use tether_proto::protocol::backoff;
mod api_cli;
mod cli;
pub mod close;
mod conn;
mod ended;
mod feeds_cli;
mod node_http;
pub mod offsets;
mod presence;
mod presence_cli;
mod session;
mod shared;
mod task;
mod token;
mod urls;
mod wire;

#[cfg(test)]
mod tests_cli;
#[cfg(test)]
mod tests_e2e;
#[cfg(test)]
mod tests_presence;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::value::RawValue;

pub use api_cli::ApiArgs;
pub use backoff::{Backoff, BackoffConfig};
pub use cli::{notice, run_pub, run_sub, PubArgs, SubArgs};
pub use close::{classify_close, retry_hint, CloseAction};
pub use feeds_cli::FeedsArgs;
pub use offsets::{OffsetStore, Position};
pub use presence::{Member, PresenceStats};
pub use presence_cli::{run_presence, PresenceArgs};
pub use session::{AckHandle, Client, Publisher, SubscribeOptions};
pub use token::TokenSource;
pub use wire::{new_publish_id, valid_channel};

/// Why a client stopped or a request failed. Each variant says what the caller should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// The server closed the connection with a code that must not be retried (docs/protocol.md:
    /// 1002, 1003, 1007, 1008, 1009, 1010, and every code not listed as reconnectable,
    /// including 1000 and 1005). Fix the cause before reconnecting.
    Closed {
        /// RFC 6455 §7.4 close code (1005 when the close frame carried none).
        code: u16,
        /// The close reason text as received.
        reason: String,
    },
    /// The server answered a request with `error` (docs/protocol.md): the publish (or subscription)
    /// was refused and retrying the same request will not help.
    Refused {
        /// The server's `code` field as text (a JSON number is rendered in decimal):
        /// `forbidden`, `limit`, `presence_off`, … (docs/protocol.md, "Error codes").
        code: String,
        /// The server's `reason` field.
        reason: String,
        /// The server's `retry_after_ms`, when it sent one (a `limit` refusal: asking again
        /// sooner is refused again).
        retry_after: Option<Duration>,
    },
    /// The server refused the WebSocket upgrade with a non-retryable HTTP status (anything but
    /// 429, 500, 502, 503 and 504), e.g. 404 for a wrong path, 401 for a missing or invalid
    /// token (docs/security.md).
    Handshake {
        /// HTTP status code of the refusal.
        status: u16,
        /// The server's reason: the first line of the response body (tether's say e.g.
        /// `bad signature`, `token expired`), else the status's reason phrase.
        reason: String,
    },
    /// The URL cannot be used (not `ws://`, no host, unparsable), or the URL list is empty or
    /// has an empty entry. The text names the argument (`URL`, `ClientConfig::urls`) and, in a
    /// list, the entry.
    InvalidUrl(String),
    /// A channel name outside 1–128 bytes of `[A-Za-z0-9._:-]` (docs/protocol.md).
    InvalidChannel(String),
    /// Publish data that is not valid JSON, or that cannot be serialized.
    InvalidData(String),
    /// The server broke the wire protocol (non-JSON text, missing fields, binary frames, an
    /// RFC 6455 violation). The client closes with 1002 and stops.
    Protocol(String),
    /// A local I/O error (offset file, output file, stdout).
    Io(String),
    /// The client was closed by the application ([`Client::close`]) or dropped.
    Shutdown,
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Closed { code, reason } => write!(f, "server closed with {code}: {reason}"),
            Self::Refused { code, reason, .. } => write!(f, "refused by server ({code}): {reason}"),
            Self::Handshake { status, reason } => write!(f, "WebSocket upgrade refused: HTTP {status}: {reason}"),
            Self::InvalidUrl(e) => write!(f, "invalid URL: {e}"),
            Self::InvalidChannel(ch) => {
                write!(f, "invalid channel name {ch:?}: expected 1-128 bytes of [A-Za-z0-9._:-]")
            }
            Self::InvalidData(e) => write!(f, "invalid publish data: {e}"),
            Self::Protocol(e) => write!(f, "protocol error from server: {e}"),
            Self::Io(e) => write!(f, "I/O error: {e}"),
            Self::Shutdown => write!(f, "client was shut down"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e.to_string())
    }
}

/// What the background task reports to the application, in connection order.
///
/// `Subscribed`, `Message`, `Reset`, `PresenceDiff`, `PresenceReset` and `Error` are never
/// dropped: while the application does not consume them the client stops reading from the
/// socket (the server's slow-subscriber policy then applies, docs/operations.md), except while
/// a [`Client::presence`] or [`Client::presence_stats`] waits for its answer (see there). `Connected` and `Disconnected` are informational and are
/// dropped when 64 events are already waiting.
#[derive(Debug, Clone)]
pub enum Event {
    /// A WebSocket connection is open; subscriptions and the outbox have been (re)sent on it.
    Connected {
        /// The node it is open to: one of [`ClientConfig::urls`], its userinfo and query
        /// values redacted (`tether_proto::redact::redact_url`), the token never included.
        url: String,
    },
    /// The server confirmed a subscription (`subscribed`, docs/protocol.md).
    Subscribed {
        /// Channel name.
        ch: String,
        /// The channel's head seq at subscribe time (0 before any publish).
        seq: u64,
        /// The channel's epoch, an opaque string echoed back on resume.
        epoch: String,
        /// `Some(true)` when the resume from `from` succeeded; `None` when no `from` was sent.
        recovered: Option<bool>,
    },
    /// One message. Call [`Client::commit`] once it is processed and recorded.
    Message {
        /// Channel name.
        ch: String,
        /// Per-channel sequence number (1, 2, 3, …).
        seq: u64,
        /// The `data` JSON exactly as the server sent it.
        data: Box<RawValue>,
        /// The whole `msg` frame text exactly as received (`{"op":"msg",…}`).
        raw: String,
    },
    /// The resume point is gone (evicted from history, or the epoch changed): start over
    /// (re-fetch state elsewhere); messages continue live at `seq + 1`.
    Reset {
        /// Channel name.
        ch: String,
        /// The channel's head seq; the next message is `seq + 1`.
        seq: u64,
        /// The channel's current epoch.
        epoch: String,
        /// `evicted` or `epoch` (docs/protocol.md).
        reason: String,
        /// The oldest seq still in the channel's history.
        oldest: u64,
    },
    /// The server ended a subscription the client did not ask to end
    /// (`{"op":"unsubscribed","ch":…,"reason":"server"}`: a backend's `POST
    /// /api/unsubscribe`, docs/api.md). The client does not subscribe to it again; a later
    /// [`Client::subscribe`] does.
    Unsubscribed {
        /// Channel name.
        ch: String,
    },
    /// The server refused a request that is not a pending publish (e.g. a `sub` for an invalid
    /// channel, or a `from` beyond the head), or ended a subscription its refreshed token no
    /// longer allows (`forbidden` with `ch`: the client does not subscribe to it again).
    Error {
        /// The server's `code` as text.
        code: String,
        /// The server's `reason`.
        reason: String,
        /// The request id, when the server echoed one.
        id: Option<String>,
        /// The channel, when the refusal names one (a refused `sub`).
        ch: Option<String>,
    },
    /// The server refused a request for now and the client sends it again by itself after
    /// `retry_in` (code `unavailable`: the server's broker cannot reach Redis, nothing was
    /// stored). The request stays pending: a publish keeps its id, a subscription its place.
    Retrying {
        /// The server's `code` (`unavailable`).
        code: String,
        /// The server's `reason`.
        reason: String,
        /// The publish id, for a publish.
        id: Option<String>,
        /// The channel, when the answer names one.
        ch: Option<String>,
        /// When the request is sent again: the server's `retry_after_ms`, or 1 s without one.
        retry_in: Duration,
    },
    /// Who joined and who left `ch` in one window of the server's `presence.window_ms`
    /// (`presence_diff`, docs/protocol.md "Presence"), for a subscription made with
    /// [`SubscribeOptions::join_leave`]. A member that joined and left within one window is in
    /// neither list.
    PresenceDiff {
        /// Channel name.
        ch: String,
        /// Members that joined, each once.
        joins: Vec<Member>,
        /// Members that left, each once.
        leaves: Vec<Member>,
        /// The whole `presence_diff` frame text exactly as received.
        raw: String,
    },
    /// The application's view of who is in `ch` may be wrong: ask again with
    /// [`Client::presence`] and apply the [`Event::PresenceDiff`]s that follow to that answer.
    ///
    /// Either the server said so (`presence_reset`: more changed in one window than its
    /// `presence.max_diff`; `reconnected` is `false`), or the client did: a `join_leave`
    /// subscription was made again on a new connection (`reconnected` is `true`), and joins and
    /// leaves while no connection was open were not seen. The client's reset comes right after
    /// that subscription's [`Event::Subscribed`] (or [`Event::Reset`]) on each connection but
    /// the first, and before any diff of that connection.
    PresenceReset {
        /// Channel name.
        ch: String,
        /// `true` when the client raised it after a resubscription, `false` for the server's
        /// `presence_reset`.
        reconnected: bool,
    },
    /// The connection (or a connection attempt) ended with a reconnectable code or an I/O
    /// error; the client reconnects after `retry_in`, to the next of [`ClientConfig::urls`]
    /// when there are several.
    Disconnected {
        /// The close code received, or `None` when the connection ended without a close frame
        /// (I/O error, timeout: RFC 6455 §7.1.5 "abnormal closure", 1006).
        code: Option<u16>,
        /// Close reason or error text.
        reason: String,
        /// The delay before the next connection attempt (the rule: [`ClientConfig::urls`]).
        retry_in: Duration,
    },
}

/// The server's acknowledgement of a publish (`ack`, docs/protocol.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The publish id (client-generated or caller-given).
    pub id: String,
    /// Channel name.
    pub ch: String,
    /// The seq the message is stored as.
    pub seq: u64,
    /// The `ack` frame text exactly as received.
    pub raw: String,
}

/// Counters of a client since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// WebSocket connections opened.
    pub connects: u64,
    /// Messages dropped because their seq was at or below one already delivered on the same
    /// connection, or at or below the committed seq.
    pub duplicates_dropped: u64,
    /// Messages whose seq skipped ahead of the previous one (a drop-oldest or conflate policy,
    /// docs/operations.md). They are delivered anyway.
    pub gaps: u64,
    /// `Connected` / `Disconnected` events dropped because the application was not reading.
    pub status_events_dropped: u64,
}

/// How a [`Client`] connects, reconnects and keeps offsets.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Server URLs, each `ws://HOST:PORT/ws` (TLS, `wss://`, is not built in); at least one.
    /// Several are for several tether nodes sharing one broker, where a resume with
    /// `from`/`epoch` works on any node.
    ///
    /// The first connection goes to the first URL; every reconnect goes to the next one,
    /// round-robin. After a failure the next URL is tried promptly, after
    /// [`Backoff::switch_delay`] (uniform in `[0, base]`), while the failures in a row are
    /// fewer than the URLs; each time the whole list has failed in a row, the wait is the usual
    /// full jitter ([`Backoff::next_delay`]) and the attempt count grows, so a deploy or an
    /// outage does not turn into a herd. A connection up for `backoff.stable_after` starts a
    /// new row; a server's `retry_after_ms` / `Retry-After` hint is the floor of every wait.
    /// With one URL this is exactly the single-server backoff. Subscriptions resume with
    /// `from`/`epoch` and the outbox is resent with the same ids whichever URL answers.
    ///
    /// [`Client::connect`] refuses an empty list and any entry that is not `ws://`.
    pub urls: Vec<String>,
    /// Reconnect delays (docs/protocol.md, the reference client).
    pub backoff: BackoffConfig,
    /// Seed for the backoff jitter; `None` seeds from the OS. Set it in tests.
    pub seed: Option<u64>,
    /// Limit on TCP connect plus WebSocket upgrade. Default 10 s.
    pub connect_timeout: Duration,
    /// Reconnect when no frame at all arrives for this long. The server pings every 25 s by default
    /// (docs/operations.md, heartbeats), so the default of 60 s only fires on a dead path (a NAT or
    /// proxy that dropped the connection without telling either side). `None` disables it.
    pub idle_timeout: Option<Duration>,
    /// Offset file holding committed positions across process restarts. At-least-once: a
    /// crash between processing a message and its commit repeats that one message.
    pub offset_file: Option<PathBuf>,
    /// Most publishes awaiting their ack; `Publisher::send` waits for room beyond it.
    /// Default 10,000.
    pub max_outbox: usize,
    /// Data events buffered for the application before the client stops reading the socket.
    /// Default 1,024.
    pub event_buffer: usize,
    /// The JWT for a server with `[auth]` (docs/security.md): asked for before each connection
    /// attempt and sent as `?token=` on the URL; asked again when the server says
    /// `token_expired`, and a newer token is sent as `refresh` (the connection stays). A close
    /// 4001 (expired, no refresh) reconnects with a fresh token and resumes; 4003 (refresh
    /// refused) stops. Default `None`: no token.
    pub token: Option<TokenSource>,
}

impl ClientConfig {
    /// The defaults for `url`: backoff 500 ms base / 30 s cap / 10 s stable, OS seed, 10 s
    /// connect timeout, 60 s idle timeout, no offset file.
    ///
    /// `url` may be a comma-separated list, `ws://a:8080/ws,ws://b:8080/ws` (spaces around
    /// the commas are ignored), which becomes [`urls`](Self::urls) in that order; a single URL
    /// is one entry. (A comma inside a URL must be written `%2C`.)
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_urls(urls::split_urls(&url.into()))
    }

    /// The defaults of [`new`](Self::new) for the URL list `urls`, tried in this order
    /// ([`urls`](Self::urls)); each item is one URL, not split on commas.
    pub fn with_urls<I>(urls: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Self {
            urls: urls.into_iter().map(Into::into).collect(),
            backoff: BackoffConfig::default(),
            seed: None,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(60)),
            offset_file: None,
            max_outbox: 10_000,
            event_buffer: 1024,
            token: None,
        }
    }

    /// This configuration with `token` as [`token`](Self::token).
    pub fn with_token(mut self, token: TokenSource) -> Self {
        self.token = Some(token);
        self
    }
}
