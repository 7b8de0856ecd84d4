//! The TOML configuration (docs/configuration.md): its shape, its defaults and its validation.
//!
//! Every key is optional; a missing key takes the default documented on its field, which is the
//! value shown in docs/configuration.md and in the example file `systemd/tether.toml`. Unknown
//! keys are errors (a typo must not silently fall back to a default), and [`Config::validate`]
//! checks every value, and pairs of values against each other, at load, so a running server
//! never meets a nonsensical or contradictory limit. Every error is a
//! [`ConfigError`] naming the dotted key (`limits.queue_max_bytes`, `channels[1].overflow`) and
//! the offending value; `tether serve` prints it and exits 2.
//!
//! # Layout
//!
//! - this file: the types, their defaults and their documentation, loading, lookups.
//! - `validate`: the range and shape checks behind [`Config::validate`].
//! - `summary`: [`Config::summary`], the configuration in effect as one log line.
//! - `broker`: the `[broker]` section (memory or Redis).
//! - `io`: the `[io]` section (the send path).
//! - `compression`: the `[compression]` section (permessage-deflate).
//! - `tls`: the `[tls]` section (certificate, key, TLS listener).
//! - `toml_error`: turning a `toml` parse or type error into a [`ConfigError`] with a key path.

mod broker;
mod compression;
pub mod feed_def;
mod feeds;
mod io;
mod presence;
mod security;
mod summary;
mod tls;
mod toml_error;
mod validate;

pub use broker::{Broker, BrokerKind};
pub use compression::Compression;
pub use feed_def::{DesiredState, FeedDef};
pub use feeds::{FeedStoreKind, Feeds};
pub use io::{Io, Readiness, SendBatch};
pub use presence::{Presence, MAX_PRESENCE_MEMBERS};
pub use security::{Admin, Auth, PerConnection};
pub use tether_proto::duration::parse_duration;
pub use tls::Tls;
pub use validate::{QUEUE_CONTROL_RESERVE, SHIPPED_UNIT_STOP_TIMEOUT_MS};

#[cfg(test)]
mod tests;

use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::LazyLock;

/// The whole server configuration (docs/configuration.md). Built with [`Config::from_toml_str`],
/// [`Config::load`] or [`Config::default`]; command-line flags (`--listen`, `--cores`) override
/// fields after loading, and the caller should call [`Config::validate`] again afterwards.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address every core's `SO_REUSEPORT` listener binds. Default `0.0.0.0:8080`.
    /// Trade-off: `0.0.0.0` accepts on every interface; bind a single address to keep the
    /// server private. Danger: ports below 1024 need `CAP_NET_BIND_SERVICE`, which the shipped
    /// systemd unit does not grant.
    pub listen: SocketAddr,
    /// Number of cores, i.e. monoio runtimes, each pinned to one CPU with its own listener.
    /// `0` (default) means one per CPU this process may run on ([`Config::effective_cores`]).
    /// Trade-off: fewer cores leave CPU to other processes (a load generator on the same box);
    /// more cores than CPUs only add context switches. At most 1024.
    pub cores: usize,
    /// Upgraded WebSocket connections this process holds at once; beyond it the handshake gets
    /// HTTP 503 with `Retry-After` (docs/operations.md, admission). Default 1,000,000.
    /// Trade-off: it must fit under `RLIMIT_NOFILE` (`tether check-limits` says whether it
    /// does) and under memory (about 0.2 KiB user + 4 KiB kernel per idle connection,
    /// docs/operations.md "What a connection costs"). Danger: a
    /// value above what the box can hold turns overload into `EMFILE`/OOM instead of a clean 503.
    pub max_connections: usize,
    /// New connections accepted per second per process; `0` (default) = unlimited.
    /// Trade-off: a cap smooths a reconnect storm (handshakes cost CPU and TLS terminators
    /// upstream) at the price of slower recovery; the excess waits in the kernel accept queue
    /// (`net.core.somaxconn`). Danger: a cap far below the storm rate makes clients time out
    /// and retry, which lengthens the storm.
    pub accept_rate: u32,
    /// Handshake, header, message and queue limits.
    pub limits: Limits,
    /// Server pings and the pong deadline (docs/operations.md, heartbeats).
    pub heartbeat: Heartbeat,
    /// Graceful shutdown on SIGTERM (docs/operations.md, drain).
    pub drain: Drain,
    /// Per-channel policies; the first rule whose `pattern` matches a channel name wins
    /// ([`Config::channel_rule`]). Default: one rule, pattern `*`, overflow `disconnect`,
    /// history 1000. A channel no rule matches gets that default rule.
    pub channels: Vec<ChannelRule>,
    /// Publish deduplication by `pub.id` / `Idempotency-Key`.
    pub dedup: Dedup,
    /// Where channel seq numbers, history and cross-node fan-out live.
    pub broker: Broker,
    /// Optional `Origin` allow-list (docs/operations.md, admission), top-level key `allowed_origins`,
    /// e.g. `["https://app.example.com"]`. Empty (default) = any origin. Entries are
    /// serialized origins, `scheme://host[:port]` without a path, or `null`; the comparison
    /// is ASCII case-insensitive. A handshake with no `Origin` header is admitted either way
    /// (non-browser clients send none; the allow-list guards against cross-site browsers).
    /// Danger: it is not authentication; any non-browser client can send any Origin.
    pub allowed_origins: Vec<String>,
    /// JWT connection auth and HTTP publish keys (`[auth]`, docs/security.md). `None` (the
    /// section absent, the default) = no auth: anyone who reaches the port may connect,
    /// subscribe and publish.
    pub auth: Option<Auth>,
    /// The admin token guarding `/connections` and the other admin endpoints (`[admin]`).
    pub admin: Admin,
    /// Upstream feeds owned by leases: the lease store, the lease timings and the feeds
    /// declared in the file (`[feeds]`, `[[feeds.static]]`, docs/feeds.md).
    pub feeds: Feeds,
    /// How cores write to sockets (`[io]`): the send path of a fan-out pass.
    pub io: Io,
    /// How presence works where a `[[channels]]` rule turns it on (`[presence]`).
    pub presence: Presence,
    /// permessage-deflate (`[compression]`, RFC 7692): offered, what is compressed, how hard.
    pub compression: Compression,
    /// TLS on tether itself (`[tls]`, docs/configuration.md "TLS"): `wss://` and `https://`.
    /// `None` (section absent, the default): plain TCP only, TLS terminated by a proxy in front
    /// if at all (docs/operations.md).
    pub tls: Option<Tls>,
}

/// Handshake, header, message and outbound-queue limits (`[limits]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Milliseconds from accept until the upgrade request must be complete; a slower client
    /// is dropped (slowloris defence). Also the idle timeout of an HTTP keep-alive connection
    /// between requests. Default 5000, between 100 and 86,400,000 (one day); above 60,000 is
    /// warned about at start.
    /// Trade-off: too short drops clients on slow mobile links; too long lets idle sockets pin
    /// file descriptors during an attack.
    pub handshake_timeout_ms: u64,
    /// Largest HTTP request head (request line plus headers) in bytes. Default 8192, between
    /// 1024 and 1 MiB. A larger head gets 431. Trade-off: big cookies need more; every byte is
    /// buffered per pending handshake.
    pub max_header_bytes: usize,
    /// Largest client WebSocket message in bytes, summed over its fragments; larger closes
    /// with 1009 (RFC 6455 §7.4.1). Default 65536, between 125 (the largest control frame
    /// payload, RFC 6455 §5.5) and 1 GiB. Danger: a partial message is buffered per
    /// connection, so this is also the worst-case read buffer per connection.
    pub max_message_bytes: usize,
    /// Largest `POST /publish/{channel}` body in bytes; larger gets 413. Default 1048576,
    /// between 1 and 1 GiB. Trade-off: a published message is held once in history and once
    /// in flight however many subscribers it has, but each subscriber's queue counts it
    /// against `queue_max_bytes`. It and `max_message_bytes`, plus the `msg` envelope
    /// ([`crate::protocol::MSG_FRAME_OVERHEAD`]) and [`QUEUE_CONTROL_RESERVE`], must fit
    /// `queue_max_bytes` (validation refuses otherwise: such a message could never be
    /// delivered).
    pub max_publish_bytes: usize,
    /// Outbound queue bound per connection in bytes (frames are shared `Bytes`, so this counts
    /// the frames a connection still has to write, not copies). Default 2097152 (2 MiB), at
    /// least 1024 and at least the largest accepted message (`max_publish_bytes`,
    /// `max_message_bytes`) + 193 bytes of envelope + 4096 bytes for control frames. When full
    /// the channel's overflow policy applies (docs/operations.md, slow subscribers).
    /// Trade-off: larger rides out longer stalls before a 1013, but bounds worst-case memory
    /// at `max_connections × queue_max_bytes`. The default is twice the 1 MiB of the design's
    /// first draft so a 1 MiB publish fits with room for the frames around it
    /// (docs/configuration.md says why).
    pub queue_max_bytes: usize,
    /// Outbound queue bound per connection in messages. Default 4096, at least 1. Bounds the
    /// queue's bookkeeping (one entry per frame) when messages are tiny.
    pub queue_max_messages: usize,
    /// Close-handshake deadline in milliseconds (docs/protocol.md, close handshake): after
    /// sending a close frame the server keeps the socket for at most this long waiting for the
    /// peer's close, then drops the TCP connection. Default 5000, between 100 and 86,400,000. Trade-off: a slow subscriber that
    /// resumes reading within it still receives its 1013; the socket stays open meanwhile.
    pub close_timeout_ms: u64,
    /// Channels this process keeps at once; a `sub` or publish that would create one more
    /// gets `error` `limit` with `retry_after_ms` 5000 (HTTP 503 with `Retry-After: 5` for an
    /// HTTP publish); existing channels are unaffected. Counted in `tether_channels`. Default
    /// 1,000,000, at least 1. Bounds the memory that unique channel names can claim.
    /// With the memory broker a channel is kept on its home core from its first `sub` or
    /// publish until it is forgotten: at once when its last subscriber leaves and nothing was
    /// published to it, else once it has had no subscriber and no publish for
    /// `dedup.window_ms` (checked every 5 s). With the Redis broker channels live in Redis:
    /// this bounds the channels with subscribers on this node (one task each), and a publish
    /// is never refused by it. docs/security.md.
    pub max_channels: usize,
    /// Abuse limits per connection (`[limits.per_connection]`).
    pub per_connection: PerConnection,
}

/// Server pings and the pong deadline (`[heartbeat]`, docs/operations.md, heartbeats).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Heartbeat {
    /// Milliseconds between pings to one connection; pings are spread over the interval, not
    /// sent in lock-step. Default 25000 (below the 60 s idle cut of common load balancers and
    /// nginx), between 100 and 86,400,000; 60,000 or more is warned about. Trade-off: shorter
    /// detects dead peers sooner and keeps more middleboxes happy, at `connections / interval`
    /// pings per second (40,000/s at 1M and 25 s).
    pub ping_interval_ms: u64,
    /// Milliseconds a pinged connection has to show life (any inbound frame) before it is
    /// reaped and its TCP connection closed. Default 10000, between 1 and 86,400,000; not
    /// below `ping_interval_ms` is warned about (no ping goes out while a pong is awaited, so
    /// detection takes interval + timeout). Danger: shorter than a real round trip under load
    /// reaps healthy clients, which then all reconnect.
    pub pong_timeout_ms: u64,
}

/// Longest wait for close answers after the drain window, in milliseconds: a drain ends at
/// most `drain.window_ms` + min(`limits.close_timeout_ms`, this) after it began.
pub const DRAIN_CLOSE_WAIT_MS: u64 = 2000;

/// Graceful shutdown on SIGTERM (`[drain]`, docs/operations.md, drain).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Drain {
    /// Milliseconds over which connection closes are spread after SIGTERM, so clients do not
    /// all reconnect in the same instant. Default 10000; 0 closes everything at once; at most
    /// 3,600,000. Danger: the service manager's stop timeout (`TimeoutStopSec` in
    /// `systemd/tether.service`, 30 s) must exceed this plus the last close handshakes (at most
    /// 2 s), or the process is killed mid-drain; a window that does not fit the shipped unit
    /// is warned about at start.
    pub window_ms: u64,
    /// Close code sent to every connection on drain. Default 1012 (service restart). Allowed:
    /// 1000 (normal), 1001 (going away: the server is not coming back here), 1012 (service
    /// restart: reconnect), 1013 (try again later). Clients reconnect on 1001, 1012 and 1013
    /// but not on 1000 (docs/protocol.md, close codes); any other code would tell clients
    /// something false about why they were closed.
    pub close_code: u16,
}

/// What a full outbound queue does to a subscriber: defined with the outbound queue it governs
/// (`tether_proto::session::queue`).
pub use crate::session::queue::Overflow;

/// One `[[channels]]` rule: the policy for channels whose name matches `pattern`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelRule {
    /// Glob on channel names (required): `*` matches any run of characters, `?` exactly one
    /// ([`glob_match`]), e.g. `"prices.*"`. 1–128 bytes of `[A-Za-z0-9._:-]`, `*` and `?`.
    pub pattern: String,
    /// Overflow policy for matching channels. Default `"disconnect"`.
    #[serde(default = "default_overflow")]
    pub overflow: Overflow,
    /// Messages kept per channel for resume (`sub` with `from`); 0 = none. Default 1000, at
    /// most 10,000,000. Trade-off: a longer history lets clients resume after longer
    /// outages instead of getting a `reset`; it costs memory per channel on its home core
    /// (history × message size, held even with no subscribers); a rule whose worst case
    /// (history × the largest accepted message) exceeds a quarter of the box's memory is
    /// warned about at start.
    #[serde(default = "default_history")]
    pub history: usize,
    /// Track who is in matching channels (docs/protocol.md, "Presence"): clients may ask
    /// `presence` and `presence_stats` (with the channel's `sub` right). Default false: off
    /// costs nothing (no per-connection or per-channel state). Cluster-wide with the Redis
    /// broker (docs/redis.md).
    #[serde(default)]
    pub presence: bool,
    /// Let subscribers ask for joins and leaves (`sub` with `"join_leave": true`): coalesced
    /// `presence_diff` frames, one per `presence.window_ms`. Needs `presence = true`. Default
    /// false.
    #[serde(default)]
    pub join_leave: bool,
    /// Most members a matching channel tracks. A connection that subscribes past it is
    /// subscribed as usual but not tracked (not listed, not counted, no join sent for it), and
    /// counted in `tether_presence_untracked_total`. Default 100,000, between 1 and
    /// 10,000,000. Bounds the home's memory per channel (about 100 B per member plus its
    /// `user` and `info`). Only with `presence = true` (refused otherwise): read it with
    /// [`ChannelRule::max_members`].
    #[serde(default)]
    pub presence_max_members: Option<usize>,
}

impl ChannelRule {
    /// `presence_max_members`, or its default (100,000) when the rule does not set it.
    pub fn max_members(&self) -> usize {
        self.presence_max_members.unwrap_or(DEFAULT_PRESENCE_MAX_MEMBERS)
    }
}

/// Publish deduplication (`[dedup]`): a `pub` whose `id` (or an HTTP publish whose
/// `Idempotency-Key`) was seen within the window gets the original ack and is not published
/// again.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dedup {
    /// Milliseconds a publish id is remembered. Default 300000 (5 min), between 1000 and
    /// 86,400,000; below 30,000 is warned about. Trade-off: must outlast a client's retry after
    /// a reconnect (backoff caps at 30 s) or a retried publish is delivered twice; longer costs
    /// memory per remembered id.
    pub window_ms: u64,
    /// Most ids remembered per process; past it the oldest are forgotten early. Default
    /// 1,000,000, at least 1. Bounds dedup memory ([`DEDUP_BYTES_PER_ID`], about 103 B per
    /// id: 103 MB at the default) whatever the publish rate. Danger: if the publish rate ×
    /// window exceeds this, duplicates can slip through.
    pub max_entries: usize,
}

/// A configuration error naming the key and the bad value.
///
/// `key` is a dotted path (`limits.queue_max_bytes`, `channels[1].overflow`); it is empty
/// only when no key applies (an unreadable file, a TOML syntax error before any key).
/// Displays as `config: limits.queue_max_bytes = 0: must be at least 1024`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key path, e.g. `channels[1].overflow`.
    pub key: String,
    /// What is wrong, e.g. `must be at least 1024`; for TOML errors it starts with the line
    /// and column.
    pub message: String,
    /// The offending value as written (TOML syntax), when known.
    pub value: Option<String>,
}

impl ConfigError {
    /// An error about `key` holding `value`.
    pub fn new(key: impl Into<String>, value: impl fmt::Display, message: impl Into<String>) -> Self {
        ConfigError { key: key.into(), message: message.into(), value: Some(value.to_string()) }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("config: ")?;
        if !self.key.is_empty() {
            f.write_str(&self.key)?;
            if let Some(v) = &self.value {
                write!(f, " = {v}")?;
            }
            f.write_str(": ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

fn default_overflow() -> Overflow {
    Overflow::Disconnect
}

fn default_history() -> usize {
    1000
}

/// `presence_max_members` when a rule does not set it.
const DEFAULT_PRESENCE_MAX_MEMBERS: usize = 100_000;

impl Default for ChannelRule {
    /// Pattern `*`, overflow `disconnect`, history 1000.
    fn default() -> Self {
        ChannelRule {
            pattern: "*".to_owned(),
            overflow: default_overflow(),
            history: default_history(),
            presence: false,
            join_leave: false,
            presence_max_members: None,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake_timeout_ms: 5000,
            max_header_bytes: 8192,
            max_message_bytes: 65536,
            max_publish_bytes: 1_048_576,
            queue_max_bytes: 2_097_152,
            queue_max_messages: 4096,
            close_timeout_ms: 5000,
            max_channels: 1_000_000,
            per_connection: PerConnection::default(),
        }
    }
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat { ping_interval_ms: 25_000, pong_timeout_ms: 10_000 }
    }
}

impl Default for Drain {
    fn default() -> Self {
        Drain { window_ms: 10_000, close_code: 1012 }
    }
}

impl Default for Dedup {
    fn default() -> Self {
        Dedup { window_ms: 300_000, max_entries: 1_000_000 }
    }
}

impl Default for Config {
    /// The defaults listed in docs/configuration.md.
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            cores: 0,
            max_connections: 1_000_000,
            accept_rate: 0,
            limits: Limits::default(),
            heartbeat: Heartbeat::default(),
            drain: Drain::default(),
            channels: vec![ChannelRule::default()],
            dedup: Dedup::default(),
            broker: Broker::default(),
            allowed_origins: Vec::new(),
            auth: None,
            admin: Admin::default(),
            feeds: Feeds::default(),
            io: Io::default(),
            presence: Presence::default(),
            compression: Compression::default(),
            tls: None,
        }
    }
}

/// Memory per remembered publish id (`[dedup]`), bytes. Measured by
/// `tests/dedup_memory_per_id.rs` (a counting allocator around 1,000,000 inserts into the dedup
/// table): 102.8 B per id held (a 32-byte hash-table slot plus its control byte at the table's
/// power-of-two size, and a 32-byte expiry entry), 137 B per id for a moment while the table
/// doubles. Used for the memory warning of [`Config::warnings`].
pub const DEDUP_BYTES_PER_ID: u64 = 104;

/// The rule for channels no configured rule matches.
static FALLBACK_RULE: LazyLock<ChannelRule> = LazyLock::new(ChannelRule::default);

impl Config {
    /// Parses a TOML document and validates it.
    ///
    /// Errors: a TOML syntax error, an unknown key, a value of the wrong type (each naming the
    /// key when one can be located, plus line and column), or any [`Config::validate`] error.
    pub fn from_toml_str(s: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(s).map_err(|e| toml_error::to_config_error(s, &e))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads `path` and parses it with [`Config::from_toml_str`]. An unreadable file gives an
    /// error with an empty key naming the path.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            key: String::new(),
            message: format!("cannot read {}: {e}", path.display()),
            value: None,
        })?;
        Config::from_toml_str(&text).map_err(|mut e| {
            e.message = format!("{} ({})", e.message, path.display());
            e
        })
    }

    /// Checks every value against the ranges documented on its field, and pairs of values
    /// against each other (the largest accepted message must fit the outbound queue); the
    /// first violation is returned, naming the key and the value. `broker.kind = "redis"` is
    /// refused (not built yet). Call again after overriding fields from flags.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate::validate(self)
    }

    /// Values that work but are probably not meant, each naming its key (same shape as a
    /// [`ConfigError`]; `tether serve` logs them as warnings at start): one channel's history
    /// or the dedup table above a quarter of `memory_bytes` (the box's `MemTotal`, when known),
    /// `heartbeat.pong_timeout_ms` not below `ping_interval_ms`, a ping interval at or above
    /// the 60 s idle cut of common load balancers, a drain longer than the shipped systemd
    /// unit's `TimeoutStopSec`, a dedup window shorter than the client's backoff cap, fewer than
    /// 4 queue slots, a handshake timeout above 60 s.
    pub fn warnings(&self, memory_bytes: Option<u64>) -> Vec<ConfigError> {
        validate::warnings(self, memory_bytes)
    }

    /// First rule whose glob `pattern` matches `channel` (`*` matches any run of characters,
    /// `?` exactly one); the default rule (`*`, disconnect, history 1000) when none does.
    pub fn channel_rule(&self, channel: &str) -> &ChannelRule {
        self.channels.iter().find(|r| glob_match(&r.pattern, channel)).unwrap_or(&FALLBACK_RULE)
    }

    /// Effective number of cores: `cores`, or when it is 0 the number of CPUs this process
    /// may run on (`std::thread::available_parallelism`, which honours the affinity mask and
    /// cgroup quota), or 1 if that cannot be determined.
    pub fn effective_cores(&self) -> usize {
        if self.cores > 0 {
            return self.cores;
        }
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }

    /// Whether a handshake's `Origin` header value passes `allowed_origins`: true when the
    /// list is empty, when the header is absent (non-browser clients send none), or when it
    /// names the same origin as an entry, compared as RFC 6454 serializations: scheme and host
    /// ignore ASCII case, and a default port (80 for http, 443 for https) is implied. A refused
    /// origin gets HTTP 403.
    pub fn origin_allowed(&self, origin: Option<&str>) -> bool {
        let Some(o) = origin else { return true };
        if self.allowed_origins.is_empty() {
            return true;
        }
        let o = normalize_origin(o.trim());
        self.allowed_origins.iter().any(|a| normalize_origin(a) == o)
    }
}

/// An origin in the RFC 6454 §6.2 serialization with scheme and host lowercased and a
/// default port removed (`HTTPS://App.Example:443` → `https://app.example`). Anything that
/// is not `scheme://host[:port]` (the opaque `null`, say) is only lowercased.
pub(crate) fn normalize_origin(o: &str) -> String {
    let lower = o.to_ascii_lowercase();
    let Some((scheme, rest)) = lower.split_once("://") else { return lower };
    let default = match scheme {
        "http" | "ws" => ":80",
        "https" | "wss" => ":443",
        _ => return lower,
    };
    match rest.strip_suffix(default) {
        Some(host) if !host.contains(['/', '@']) => format!("{scheme}://{host}"),
        _ => lower,
    }
}

/// Glob match of a channel `name` against `pattern`: `*` matches any run of characters
/// (including none), `?` exactly one character, anything else itself. Linear backtracking on
/// the last `*`, so worst case O(len(pattern) × len(name)); no allocation.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0usize, 0usize);
    // Position after the last `*` seen, and the name position it is currently matched up to.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == b'*' {
            pi += 1;
            star = Some((pi, ni));
        } else if pi < p.len() && p[pi] == b'?' {
            pi += 1;
            ni += utf8_len(n[ni]);
        } else if pi < p.len() && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            // Let the last `*` swallow one more character and retry from there.
            let next = sn + utf8_len(n[sn]);
            star = Some((sp, next));
            pi = sp;
            ni = next;
        } else {
            return false;
        }
    }
    p[pi.min(p.len())..].iter().all(|&c| c == b'*') && ni == n.len()
}

/// Length of the UTF-8 sequence starting with `lead`, so `?` consumes one character.
fn utf8_len(lead: u8) -> usize {
    match lead {
        0xF0..=0xFF => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}
