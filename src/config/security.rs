//! The security sections of the configuration (docs/security.md): `[auth]` (JWT connection
//! auth, HTTP publish keys), `[admin]` (the admin token) and `[limits.per_connection]` (abuse
//! limits), with their defaults and validation.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::{Config, ConfigError};

/// Connection authentication (`[auth]`, DESIGN §9). The section being absent means no auth at
/// all (development): any client may upgrade, subscribe and publish.
///
/// With `jwt_hs256_secret` or `jwt_public_key_file` set, a WebSocket upgrade needs a JWT
/// (`?token=…` on the upgrade URL, or `Authorization: Bearer …`); without one, or with an
/// invalid one, the upgrade gets HTTP 401. With `publish_keys` set, `POST /publish/{ch}` needs
/// `Authorization: Bearer <key>`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Auth {
    /// Shared secret for HS256 tokens (UTF-8 bytes as written). Default empty. At least 32
    /// bytes (RFC 7518 §3.2: the key must be at least as long as the hash). Exactly one of
    /// this and `jwt_public_key_file` may be set. Danger: anyone holding the secret can mint
    /// tokens; keep the config file readable only by the service user.
    pub jwt_hs256_secret: String,
    /// PEM file with the public key that verifies RS256, ES256 (P-256) or EdDSA (Ed25519)
    /// tokens; the key type decides the one algorithm accepted. Default empty. Read once at
    /// start; an unreadable file or a key of another type refuses to start, naming this key.
    pub jwt_public_key_file: PathBuf,
    /// When non-empty, a token's `iss` claim must equal it (401 otherwise). Default empty.
    pub jwt_issuer: String,
    /// When non-empty, a token's `aud` claim must contain it (401 otherwise). Default empty.
    pub jwt_audience: String,
    /// Clock skew tolerated on `exp` and `nbf`, in milliseconds. Default 0, at most 300,000.
    /// Trade-off: it keeps clients whose token issuer's clock runs ahead from being refused,
    /// and lets an expired token live this much longer.
    pub jwt_leeway_ms: u64,
    /// Milliseconds a connection whose token reached `exp` has to send `{"op":"refresh",…}`
    /// after its `error` `token_expired`, before it is closed with 4001. Default 30,000,
    /// between 1,000 and 86,400,000. Deliveries continue during the grace.
    pub token_refresh_grace_ms: u64,
    /// API keys for `POST /publish/{ch}`: with any set, the request needs
    /// `Authorization: Bearer <key>` naming one of them (compared in constant time), else 401.
    /// Default empty (HTTP publish open). Each at least 16 bytes.
    pub publish_keys: Vec<String>,
}

impl Default for Auth {
    fn default() -> Self {
        Auth {
            jwt_hs256_secret: String::new(),
            jwt_public_key_file: PathBuf::new(),
            jwt_issuer: String::new(),
            jwt_audience: String::new(),
            jwt_leeway_ms: 0,
            token_refresh_grace_ms: 30_000,
            publish_keys: Vec::new(),
        }
    }
}

impl Auth {
    /// Whether WebSocket upgrades need a JWT (a secret or a public key is configured).
    pub fn jwt_enabled(&self) -> bool {
        !self.jwt_hs256_secret.is_empty() || !self.jwt_public_key_file.as_os_str().is_empty()
    }
}

/// The admin API guard (`[admin]`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    /// `Authorization: Bearer <token>` required by `GET /connections` and every admin
    /// endpoint (feeds, status), compared in constant time; wrong or missing → 401. Default
    /// empty: then `/connections` is served only to peers in `local_peers`, and 401 to others.
    /// At least 16 bytes when set.
    pub token: String,
    /// Put `/metrics` behind the admin token too. Default `false` (Prometheus convention:
    /// scrapers expect it open). Needs `token`.
    pub protect_metrics: bool,
    /// Peer addresses that count as local when no `token` is set: they may read
    /// `/connections` without one. Default empty, meaning every loopback address
    /// (`127.0.0.0/8`, `::1`). Danger: behind a reverse proxy on the same box every client
    /// looks local; set a token there.
    pub local_peers: Vec<IpAddr>,
}

impl Admin {
    /// Whether `peer` may read the admin endpoints without a token (only when no token is
    /// configured): one of `local_peers`, or any loopback address when that list is empty.
    /// An IPv4-mapped IPv6 address counts as its IPv4 address.
    pub fn is_local(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        if self.local_peers.is_empty() {
            peer.is_loopback()
        } else {
            self.local_peers.contains(&peer)
        }
    }
}

/// Abuse limits on one connection (`[limits.per_connection]`, docs/security.md,
/// "Per-connection limits"). Each refusal is an `error` with code `limit` (or, for a control
/// frame, no answer), counted in `tether_limit_refusals_total{limit}`, and the connection
/// stays, except where said.
///
/// The rates are token buckets on the core's clock (10 ms ticks): a bucket holds at most its
/// burst, refills continuously at its rate, and a refused request takes nothing. "Past 10×
/// the rate" is exact: the refusals of one bucket within one second (a window that opens at
/// its first refusal) exceed 10 × its burst; the connection is then closed with 1008 and the
/// JSON reason `{"reason":"limit","limit":"<key>"}`. A client that waits `retry_after_ms`
/// after a refusal never gets there.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PerConnection {
    /// Subscriptions one connection may hold; the next `sub` gets `error` `limit`. Default
    /// 1024, between 1 and 1,000,000. Trade-off: each subscription costs its connection and
    /// the channel a few dozen bytes.
    pub max_subscriptions: usize,
    /// WebSocket `pub` messages per second per connection (token bucket, burst = rate); an
    /// excess `pub` gets `error` `limit` with its `id` and `retry_after_ms` (when the bucket
    /// holds a token again, rounded up to 10 ms) and is not published; more than 10 × the rate
    /// refused within one second closes the connection with 1008. Default 0 = unlimited (a
    /// backend publisher may send thousands per second): set it where browsers publish. HTTP
    /// publishes are not counted (`auth.publish_keys` guards those).
    pub publish_rate: u32,
    /// WebSocket `pub` bytes (the `data` JSON as sent) per second per connection, token
    /// bucket with a burst of one second's worth but at least `limits.max_message_bytes` (so
    /// every accepted message can pass); same answers as `publish_rate`, and refused bytes
    /// beyond 10 × the burst within one second close with 1008. Default 0 = unlimited.
    pub publish_bytes_rate: u64,
    /// Control frames a client may send per second (token bucket, burst = rate): pings, and
    /// pongs that answer none of the server's heartbeat pings (the one pong answering each
    /// heartbeat ping is free). A ping beyond the rate is not answered; more than 10 × the
    /// rate refused within one second closes the connection with 1008. Default 100, 0 =
    /// unlimited. Trade-off: each ping costs the server a pong; a browser sends none, a client
    /// library a few per minute.
    pub control_frames_rate: u32,
    /// `sub` and `unsub` requests per second (token bucket; burst the rate, and at least 2 ×
    /// `max_subscriptions`, so a client can drop and retake all it may hold at once). Beyond
    /// it: `error` `limit` with `ch` and `retry_after_ms`; more than 10 × the burst refused in
    /// one second closes with 1008. Default 500, 0 = unlimited. Trade-off: each costs a
    /// channel lookup and a broker request; a client subscribes a few times per connection.
    pub subscribe_rate: u32,
    /// `refresh` requests per second (burst = rate), every one counted, also one that sends the
    /// token already held. Beyond it: `error` `limit` with `retry_after_ms`; more than 10 ×
    /// the rate refused in one second closes with 1008. Default 2, 0 = unlimited. Trade-off:
    /// each costs a signature verification (about 0.4 ms for ES256); a client refreshes once
    /// per token lifetime.
    pub refresh_rate: u32,
    /// Malformed or unknown requests per second (burst = rate): those answered `bad_json`,
    /// `bad_request`, `bad_op` or `bad_channel`, and binary frames. Within it each gets its
    /// own error; beyond it `error` `limit`; more than 10 × the rate refused in one second
    /// closes with 1008. Default 20, 0 = unlimited.
    pub bad_request_rate: u32,
    /// `presence` and `presence_stats` requests per second (burst = rate). Beyond it: `error`
    /// `limit` with `ch` and `retry_after_ms`; more than 10 × the rate refused in one second
    /// closes with 1008. Default 10, 0 = unlimited. Trade-off: a `presence` page costs the
    /// channel's home up to `presence.page_size` members encoded; a client asks after a
    /// `presence_reset` and when it joins.
    pub presence_rate: u32,
}

impl Default for PerConnection {
    fn default() -> Self {
        PerConnection {
            max_subscriptions: 1024,
            publish_rate: 0,
            publish_bytes_rate: 0,
            control_frames_rate: 100,
            subscribe_rate: 500,
            refresh_rate: 2,
            bad_request_rate: 20,
            presence_rate: 10,
        }
    }
}

impl PerConnection {
    /// The keys as the "config in effect" log line shows them: ` limits.per_connection.KEY=V`
    /// for each, in declaration order.
    pub fn summary(&self) -> String {
        let keys: [(&str, u64); 8] = [
            ("max_subscriptions", self.max_subscriptions as u64),
            ("publish_rate", self.publish_rate.into()),
            ("publish_bytes_rate", self.publish_bytes_rate),
            ("control_frames_rate", self.control_frames_rate.into()),
            ("subscribe_rate", self.subscribe_rate.into()),
            ("refresh_rate", self.refresh_rate.into()),
            ("bad_request_rate", self.bad_request_rate.into()),
            ("presence_rate", self.presence_rate.into()),
        ];
        keys.iter().map(|(k, v)| format!(" limits.per_connection.{k}={v}")).collect()
    }
}

/// Shortest HS256 secret in bytes (RFC 7518 §3.2).
const MIN_HS256_SECRET: usize = 32;
/// Shortest publish key or admin token in bytes.
const MIN_KEY_BYTES: usize = 16;

/// The `[auth]`, `[admin]` and `[limits.per_connection]` checks of [`Config::validate`].
pub(super) fn validate(c: &Config) -> Result<(), ConfigError> {
    let hidden = "\"…\"";
    if let Some(a) = &c.auth {
        if !a.jwt_hs256_secret.is_empty() && !a.jwt_public_key_file.as_os_str().is_empty() {
            return Err(ConfigError::new(
                "auth.jwt_public_key_file",
                format!("{:?}", a.jwt_public_key_file),
                "set either auth.jwt_hs256_secret or auth.jwt_public_key_file, not both",
            ));
        }
        if !a.jwt_hs256_secret.is_empty() && a.jwt_hs256_secret.len() < MIN_HS256_SECRET {
            return Err(ConfigError::new(
                "auth.jwt_hs256_secret",
                hidden,
                format!("must be at least {MIN_HS256_SECRET} bytes (RFC 7518 §3.2)"),
            ));
        }
        super::validate::range("auth.jwt_leeway_ms", a.jwt_leeway_ms, 0, 300_000)?;
        super::validate::range("auth.token_refresh_grace_ms", a.token_refresh_grace_ms, 1_000, 86_400_000)?;
        for (i, k) in a.publish_keys.iter().enumerate() {
            key_shape(&format!("auth.publish_keys[{i}]"), k)?;
        }
    }
    let ad = &c.admin;
    if !ad.token.is_empty() {
        key_shape("admin.token", &ad.token)?;
    } else if ad.protect_metrics {
        return Err(ConfigError::new("admin.protect_metrics", true, "needs admin.token to be set"));
    }
    let p = &c.limits.per_connection;
    super::validate::range("limits.per_connection.max_subscriptions", p.max_subscriptions, 1, 1_000_000)?;
    super::validate::range("limits.max_channels", c.limits.max_channels, 1, usize::MAX)?;
    Ok(())
}

/// A bearer key: long enough, and only visible ASCII (it travels in a header).
fn key_shape(key: &str, v: &str) -> Result<(), ConfigError> {
    if v.len() < MIN_KEY_BYTES {
        return Err(ConfigError::new(key, "\"…\"", format!("must be at least {MIN_KEY_BYTES} bytes")));
    }
    if !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::new(key, "\"…\"", "must be visible ASCII (no spaces or control characters)"));
    }
    Ok(())
}
