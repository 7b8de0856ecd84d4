//! The feeds sections of the configuration (docs/feeds.md): `[feeds]` (where leases live and
//! the lease timings) and `[[feeds.static]]` (feeds declared in the file), with their defaults
//! and validation.

use serde::Deserialize;

use super::FeedDef;
use super::{BrokerKind, Config, ConfigError};

/// Where feed records and their leases live (`feeds.store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeedStoreKind {
    /// In this process only (default): one node, the leases die with it.
    #[default]
    Memory,
    /// The broker's Redis (`[broker] url` / `urls`, `key_prefix`): shared by every node.
    Redis,
    /// A DynamoDB table (`dynamodb_table`, `dynamodb_endpoint`), conditional writes; needs a
    /// binary built with `--features dynamodb`.
    Dynamodb,
}

impl FeedStoreKind {
    /// The config spelling: `"memory"`, `"redis"` or `"dynamodb"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FeedStoreKind::Memory => "memory",
            FeedStoreKind::Redis => "redis",
            FeedStoreKind::Dynamodb => "dynamodb",
        }
    }
}

/// Upstream feeds owned by leases (`[feeds]`, DESIGN §6, docs/feeds.md).
///
/// Timing rule (checked): `renew_ms + skew_margin_ms < lease_ms`, so a holder renews at least
/// once before it must give up (`lease_expires_at_ms - skew_margin_ms`). A takeover after a
/// crash takes up to `lease_ms` plus `reconcile_ms` (or less when a release notification or
/// an earlier reconcile comes first); after a SIGTERM it is immediate (the lease is released).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Feeds {
    /// Where the feed records and leases live: `"memory"` (default; one node), `"redis"` (the
    /// broker's Redis: `[broker] url`/`urls` and `key_prefix`, whatever `broker.kind`), or
    /// `"dynamodb"` (needs the `dynamodb` cargo feature). Danger: with `"memory"` every node
    /// owns its own copy of each feed, so several nodes each connect upstream.
    pub store: FeedStoreKind,
    /// DynamoDB table of the feeds (`store = "dynamodb"`). Default `"tether_feeds"`; 3–255
    /// bytes of `[A-Za-z0-9_.-]` (the DynamoDB table name rule).
    pub dynamodb_table: String,
    /// DynamoDB endpoint, e.g. `http://127.0.0.1:5000` for a local emulator; empty (default)
    /// = the AWS endpoint of the region in the environment. `http://` or `https://` when set.
    pub dynamodb_endpoint: String,
    /// How often a holder renews each lease it holds (and stores `last_seq` with it), in
    /// milliseconds. Default 5,000, between 10 and 3,600,000. Trade-off: shorter notices a
    /// stopped or deleted feed sooner and loses less `last_seq` progress on a crash, at one
    /// store write per feed per interval.
    pub renew_ms: u64,
    /// Lease length in milliseconds: a renew extends the lease to now + `lease_ms`. Default
    /// 20,000, between 100 and 86,400,000, and above `renew_ms + skew_margin_ms`. Trade-off:
    /// shorter means a faster takeover after a crash; too short and a store hiccup longer than
    /// `lease_ms - skew_margin_ms` stops every feed of the node.
    pub lease_ms: u64,
    /// How often every node reads all feeds and acquires each STARTED one whose lease is free,
    /// in milliseconds (also at start, and at once on a release notification). Default
    /// 60,000, between 100 and 86,400,000. Trade-off: it bounds the takeover after a crash
    /// (`lease_ms + reconcile_ms`) at one read of all feeds per node per interval.
    pub reconcile_ms: u64,
    /// How long before its lease's end a holder that could not renew stops its upstream
    /// connection, in milliseconds. Default 2,000. It must cover the clock difference between
    /// nodes (leases compare each node's own Unix clock: run NTP); danger: a clock ahead by
    /// more than this lets another node take the feed while the holder is still connected
    /// (fencing then refuses the old holder's publishes, but both connect upstream).
    pub skew_margin_ms: u64,
    /// Feeds declared in the file (`[[feeds.static]]`): each is written to the store at start
    /// (create or replace its definition; the lease is kept), so every node declaring it agrees.
    #[serde(rename = "static")]
    pub static_feeds: Vec<FeedDef>,
}

impl Default for Feeds {
    fn default() -> Self {
        Feeds {
            store: FeedStoreKind::Memory,
            dynamodb_table: "tether_feeds".into(),
            dynamodb_endpoint: String::new(),
            renew_ms: 5_000,
            lease_ms: 20_000,
            reconcile_ms: 60_000,
            skew_margin_ms: 2_000,
            static_feeds: Vec::new(),
        }
    }
}

/// Checks `[feeds]` and `[[feeds.static]]`; errors name the key (`feeds.lease_ms`,
/// `feeds.static[2].url`).
pub(super) fn validate(c: &Config) -> Result<(), ConfigError> {
    let f = &c.feeds;
    super::validate::range("feeds.renew_ms", f.renew_ms, 10, 3_600_000)?;
    super::validate::range("feeds.lease_ms", f.lease_ms, 100, 86_400_000)?;
    super::validate::range("feeds.reconcile_ms", f.reconcile_ms, 100, 86_400_000)?;
    if f.renew_ms.saturating_add(f.skew_margin_ms) >= f.lease_ms {
        return Err(ConfigError::new(
            "feeds.lease_ms",
            f.lease_ms,
            format!(
                "must be above feeds.renew_ms + feeds.skew_margin_ms ({} + {} ms): a holder must renew before it \
                 gives up at lease end - skew_margin_ms",
                f.renew_ms, f.skew_margin_ms
            ),
        ));
    }
    match f.store {
        FeedStoreKind::Memory => {}
        FeedStoreKind::Redis => {
            if c.broker.kind != BrokerKind::Redis {
                super::validate::validate_redis(&c.broker).map_err(|mut e| {
                    e.message = format!("{} (feeds.store = \"redis\" uses the broker's Redis)", e.message);
                    e
                })?;
            }
        }
        FeedStoreKind::Dynamodb => validate_dynamodb(f)?,
    }
    let mut seen = std::collections::HashSet::new();
    for (i, def) in f.static_feeds.iter().enumerate() {
        def.validate().map_err(|e| {
            let value = match e.field {
                "id" => format!("{:?}", def.id),
                "url" => format!("{:?}", crate::logging::redact_url(&def.url)),
                "channel" => format!("{:?}", def.channel),
                "resume_query" => format!("{:?}", def.resume_query),
                "seq_pointer" => format!("{:?}", def.seq_pointer),
                _ => String::new(),
            };
            ConfigError { key: format!("feeds.static[{i}].{}", e.field), message: e.reason, value: Some(value) }
                .without_empty_value()
        })?;
        if !seen.insert(def.id.as_str()) {
            return Err(ConfigError::new(
                format!("feeds.static[{i}].id"),
                format!("{:?}", def.id),
                "declared twice in [[feeds.static]]",
            ));
        }
    }
    Ok(())
}

fn validate_dynamodb(f: &Feeds) -> Result<(), ConfigError> {
    let t = &f.dynamodb_table;
    if !(3..=255).contains(&t.len()) || !t.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Err(ConfigError::new(
            "feeds.dynamodb_table",
            format!("{t:?}"),
            "must be 3–255 bytes of [A-Za-z0-9_.-] (a DynamoDB table name)",
        ));
    }
    let e = &f.dynamodb_endpoint;
    if !e.is_empty() && !e.starts_with("http://") && !e.starts_with("https://") {
        return Err(ConfigError::new(
            "feeds.dynamodb_endpoint",
            format!("{e:?}"),
            "must start with http:// or https:// (or be empty for the AWS endpoint)",
        ));
    }
    if !cfg!(feature = "dynamodb") {
        return Err(ConfigError::new(
            "feeds.store",
            "\"dynamodb\"",
            "this binary was built without DynamoDB support; build it with `cargo build --release --features \
             dynamodb`, or use \"memory\" or \"redis\"",
        ));
    }
    Ok(())
}

impl ConfigError {
    /// Drops an empty `value` so the message reads `key: reason`.
    fn without_empty_value(mut self) -> ConfigError {
        if self.value.as_deref() == Some("") {
            self.value = None;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(toml: &str) -> ConfigError {
        Config::from_toml_str(toml).expect_err(toml)
    }

    const TEST_TIMINGS: &str = "[feeds]\nrenew_ms = 250\nlease_ms = 1000\nreconcile_ms = 1000\nskew_margin_ms = 250\n";

    #[test]
    fn defaults_and_a_static_feed_load() {
        let c = Config::from_toml_str(
            "[feeds]\n[[feeds.static]]\nid = \"btc\"\nurl = \"wss://up.example/s\"\nchannel = \"prices.btc\"\n\
             seq_pointer = \"/seq\"\nresume_query = \"from\"\n",
        )
        .unwrap();
        assert_eq!(c.feeds.store, FeedStoreKind::Memory);
        assert_eq!(
            (c.feeds.renew_ms, c.feeds.lease_ms, c.feeds.reconcile_ms, c.feeds.skew_margin_ms),
            (5000, 20000, 60000, 2000)
        );
        assert_eq!(c.feeds.static_feeds[0].id, "btc");
        assert_eq!(c.feeds.static_feeds[0].desired_state, crate::config::DesiredState::Started);
        Config::from_toml_str(TEST_TIMINGS).unwrap();
    }

    #[test]
    fn bad_static_fields_name_the_key() {
        let e = err("[[feeds.static]]\nid = \"btc\"\nurl = \"http://x/\"\nchannel = \"c\"\nseq_pointer = \"/seq\"\n");
        assert_eq!(e.key, "feeds.static[0].url", "{e}");
        let e = err("[[feeds.static]]\nid = \"a:b\"\nurl = \"ws://x/\"\nchannel = \"c\"\nseq_pointer = \"/seq\"\n");
        assert_eq!(e.key, "feeds.static[0].id", "{e}");
        let e = err("[[feeds.static]]\nid = \"a\"\nurl = \"ws://x/\"\nchannel = \"c\"\nseq_pointer = \"seq\"\n");
        assert_eq!(e.key, "feeds.static[0].seq_pointer", "{e}");
        let one = "[[feeds.static]]\nid = \"a\"\nurl = \"ws://x/\"\nchannel = \"c\"\nseq_pointer = \"/seq\"\n";
        assert_eq!(err(&format!("{one}{one}")).key, "feeds.static[1].id");
        let e = err(
            "[[feeds.static]]\nid = \"a\"\nurl = \"ws://x/\"\nchannel = \"c\"\nseq_pointer = \"/s\"\nsubscrib = \"\"\n",
        );
        assert!(e.key.starts_with("feeds.static"), "{e}");
        assert!(e.message.contains("unknown"), "{e}");
        let e = err("[[feeds.static]]\nid = \"a\"\nurl = \"ws://x/\"\nchannel = \"c\"\nseq_pointer = \"/s\"\ndesired_state = \"RUNNING\"\n");
        assert!(e.key.contains("desired_state"), "{e}");
    }

    #[test]
    fn timings_are_checked_against_each_other() {
        assert_eq!(err("[feeds]\nrenew_ms = 5000\nlease_ms = 6000\n").key, "feeds.lease_ms");
        assert_eq!(err("[feeds]\nrenew_ms = 0\n").key, "feeds.renew_ms");
        assert_eq!(err("[feeds]\nreconcile_ms = 1\n").key, "feeds.reconcile_ms");
        assert_eq!(err("[feeds]\nstor = \"redis\"\n").key, "feeds.stor");
        assert_eq!(err("[feeds]\nstore = \"etcd\"\n").key, "feeds.store");
    }

    #[test]
    fn redis_store_needs_a_redis_url_and_dynamodb_needs_the_feature() {
        Config::from_toml_str("[feeds]\nstore = \"redis\"\n").unwrap();
        let e = err("[broker]\nurl = \"http://x\"\n[feeds]\nstore = \"redis\"\n");
        assert_eq!(e.key, "broker.url", "{e}");
        assert!(e.message.contains("feeds.store"), "{e}");
        let e = err("[feeds]\nstore = \"dynamodb\"\ndynamodb_table = \"x\"\n");
        assert_eq!(e.key, "feeds.dynamodb_table", "{e}");
        let e = err("[feeds]\nstore = \"dynamodb\"\ndynamodb_endpoint = \"127.0.0.1:5000\"\n");
        assert_eq!(e.key, "feeds.dynamodb_endpoint", "{e}");
        let r = Config::from_toml_str("[feeds]\nstore = \"dynamodb\"\ndynamodb_endpoint = \"http://127.0.0.1:5000\"\n");
        if cfg!(feature = "dynamodb") {
            r.unwrap();
        } else {
            let e = r.unwrap_err();
            assert_eq!(e.key, "feeds.store", "{e}");
            assert!(e.message.contains("--features dynamodb"), "{e}");
        }
    }
}
