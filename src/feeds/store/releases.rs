//! Release notifications across nodes over the broker's Redis pub/sub: the topic
//! `PREFIXfeeds:released` (payload: the feed id), for every lease store that is shared by
//! several nodes. The Redis store publishes on it from its release script
//! ([`super::redis`]); a store without pub/sub of its own (DynamoDB) publishes through
//! [`RedisReleases::publish`] after its release has been written. Both subscribe with
//! [`subscribe`].
//!
//! Delivery is Redis pub/sub's: at most once, to the subscribers connected at that moment. A
//! lost notification only delays a takeover to the next reconcile, since the release itself
//! (expiry 0) is in the store.

use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::Mutex;

use super::LeaseError;
use crate::config::Broker as BrokerConfig;
use crate::redis::link::Link;

fn store_err(e: impl std::fmt::Display) -> LeaseError {
    LeaseError::Store(e.to_string())
}

/// The release topic of the key prefix `prefix`: `PREFIXfeeds:released`
/// (`tether:feeds:released` with the default prefix).
pub fn released_topic(prefix: &str) -> String {
    format!("{prefix}feeds:released")
}

/// The Redis URL to subscribe on for `cfg`: `url`, or the first of `urls` for a Cluster
/// (a Cluster broadcasts a classic `PUBLISH` to every node, so one node is enough).
pub fn pubsub_url(cfg: &BrokerConfig) -> String {
    cfg.cluster_urls().and_then(|u| u.into_iter().next()).unwrap_or_else(|| cfg.url.clone())
}

/// Subscribes to `topic` on the Redis at `url` with a connection of its own; the receiver
/// yields each payload (a feed id) from the moment this returns, and ends when that
/// connection is lost. Errors: a bad URL, a refused connection, a refused `SUBSCRIBE`
/// ([`LeaseError::Store`]).
pub async fn subscribe(url: &str, topic: &str) -> Result<UnboundedReceiver<String>, LeaseError> {
    let client = redis::Client::open(url).map_err(store_err)?;
    let mut pubsub = client.get_async_pubsub().await.map_err(store_err)?;
    pubsub.subscribe(topic).await.map_err(store_err)?;
    let (tx, rx) = unbounded_channel();
    tokio::spawn(async move {
        use futures::StreamExt;
        let mut messages = pubsub.into_on_message();
        while let Some(msg) = messages.next().await {
            let Ok(id) = msg.get_payload::<String>() else { continue };
            if tx.send(id).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// Release notifications on the broker's Redis for a store that has no pub/sub of its own
/// (the DynamoDB store when `[broker] kind = "redis"`). Publishes go over one connection,
/// opened at the first publish and opened again after a failure, so the store never waits for
/// Redis at start and a Redis restart costs one lost notification at most.
pub struct RedisReleases {
    cfg: BrokerConfig,
    topic: String,
    pubsub_url: String,
    /// The publish connection, `None` until the first publish and after a failed one.
    link: Mutex<Option<Link>>,
}

impl RedisReleases {
    /// Notifications on the Redis of `cfg` (`url`, or `urls` for a Cluster; `key_prefix` names
    /// the topic; `request_timeout_ms` bounds connecting and each publish). Connects nothing
    /// yet.
    pub fn new(cfg: &BrokerConfig) -> RedisReleases {
        RedisReleases {
            topic: released_topic(&cfg.key_prefix),
            pubsub_url: pubsub_url(cfg),
            cfg: cfg.clone(),
            link: Mutex::new(None),
        }
    }

    /// The topic: `PREFIXfeeds:released`.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// `PUBLISH`es `id` on the topic, connecting first if needed; returns the number of
    /// subscribers Redis delivered it to. Errors: Redis cannot be reached or did not answer
    /// within `request_timeout_ms` ([`LeaseError::Store`]; the next call reconnects).
    pub async fn publish(&self, id: &str) -> Result<u64, LeaseError> {
        let timeout = Duration::from_millis(self.cfg.request_timeout_ms);
        let mut link = {
            let mut slot = self.link.lock().await;
            match slot.as_ref() {
                Some(l) => l.clone(),
                None => {
                    let l = Link::open(&self.cfg, None, timeout).await.map_err(store_err)?;
                    *slot = Some(l.clone());
                    l
                }
            }
        };
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&self.topic).arg(id);
        match tokio::time::timeout(timeout, publish.query_async::<u64>(&mut link)).await {
            Ok(Ok(n)) => Ok(n),
            failed => {
                // The connection may be broken: the next publish opens a fresh one.
                *self.link.lock().await = None;
                Err(match failed {
                    Ok(Err(e)) => store_err(format!("Redis PUBLISH {}: {e}", self.topic)),
                    _ => store_err(format!("Redis PUBLISH {}: no answer within {timeout:?}", self.topic)),
                })
            }
        }
    }

    /// Subscribes to the topic ([`subscribe`]): every node's releases, this one's included.
    pub async fn subscribe(&self) -> Result<UnboundedReceiver<String>, LeaseError> {
        subscribe(&self.pubsub_url, &self.topic).await
    }
}
