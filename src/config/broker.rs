//! The broker section of the configuration (`[broker]`): which broker holds channel state,
//! and how tether reaches Redis when it is Redis (docs/redis.md).

use serde::Deserialize;

/// Which broker holds channel state (`[broker]`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BrokerKind {
    /// Embedded, single process. Seq numbers and history die with the process (a restart
    /// changes every channel's epoch). TOML `"memory"`.
    Memory,
    /// Redis: seq, history and dedup ids live in Redis, fan-out between nodes uses Redis
    /// pub/sub (sharded pub/sub on a Redis Cluster), so clients can resume on any node. TOML
    /// `"redis"`. See docs/redis.md.
    Redis,
}

impl BrokerKind {
    /// The TOML spelling: `memory`, `redis`.
    pub fn as_str(self) -> &'static str {
        match self {
            BrokerKind::Memory => "memory",
            BrokerKind::Redis => "redis",
        }
    }
}

/// Broker selection (`[broker]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Broker {
    /// `"memory"` (default) or `"redis"`.
    pub kind: BrokerKind,
    /// Redis URL, used only when `kind = "redis"`: `redis://host:port/db`, `rediss://` (TLS)
    /// or `unix:///path/to/redis.sock`. Default `redis://127.0.0.1:6379`. Danger: credentials
    /// in the URL end up in the config file; keep it readable only by the service user.
    pub url: String,
    /// Seed nodes of a Redis Cluster (each `redis://` or `rediss://`). Setting it implies
    /// `cluster = true`; `url` is then ignored. Default empty.
    pub urls: Vec<String>,
    /// Whether Redis is a Redis Cluster (sharded pub/sub, `SSUBSCRIBE`/`SPUBLISH`, Redis 7).
    /// Default `false`.
    pub cluster: bool,
    /// Prefix of every key and pub/sub topic tether writes, e.g. `tether:{news}:m`. Default
    /// `tether:`; must not contain `{` or `}` (the channel name is the cluster hash tag).
    pub key_prefix: String,
    /// A channel's stream and meta hash expire after this many milliseconds without a publish
    /// (a node refreshes them while it has subscribers of the channel). Default 86,400,000
    /// (24 h), range 60,000 ..= 31,536,000,000.
    pub history_ttl_ms: u64,
    /// How long one Redis request may take before it counts as failed, in milliseconds.
    /// A publish (or a feed lease write) carries this as its deadline: Redis runs it only
    /// before it (checked against Redis `TIME`), and its reply is awaited 500 ms longer. No
    /// reply by then: the answer is `unknown_outcome` / HTTP 504 (perhaps stored; a retry
    /// with the same id is safe); a definite "not stored" is `unavailable` / 503
    /// (docs/redis.md). Short values turn a slow Redis into refusals sooner; long ones hold
    /// publishers longer. Default 2,000, range 100 ..= 60,000.
    pub request_timeout_ms: u64,
}

impl Broker {
    /// The cluster seed URLs when this is a cluster (`urls`, or `url` alone), else `None`.
    pub fn cluster_urls(&self) -> Option<Vec<String>> {
        if !self.urls.is_empty() {
            Some(self.urls.clone())
        } else if self.cluster {
            Some(vec![self.url.clone()])
        } else {
            None
        }
    }
}

impl Default for Broker {
    fn default() -> Self {
        Broker {
            kind: BrokerKind::Memory,
            url: "redis://127.0.0.1:6379".to_owned(),
            urls: Vec::new(),
            cluster: false,
            key_prefix: "tether:".to_owned(),
            history_ttl_ms: 86_400_000,
            request_timeout_ms: 2_000,
        }
    }
}
