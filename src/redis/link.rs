//! Connections to Redis: one Redis instance or a Redis Cluster behind one type, [`Link`].
//!
//! The broker thread keeps two links: a command link (publish scripts, history reads) and a
//! pub/sub link (RESP3, its pushes go to the broker thread's dispatcher). They are separate
//! so that losing the pub/sub link (`CLIENT KILL TYPE pubsub`, an output buffer limit) does
//! not fail publishes, and a slow history read never delays a pub/sub message.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, IntoConnectionInfo, Pipeline, ProtocolVersion, PushInfo, RedisFuture, Value};
use tokio::sync::mpsc::UnboundedSender;

use crate::config::Broker as BrokerConfig;

/// A connection to one Redis or to a Redis Cluster. Clones share the connection (requests
/// are multiplexed on it, in the order they are made).
#[derive(Clone)]
pub enum Link {
    /// One Redis instance.
    Single(MultiplexedConnection),
    /// A Redis Cluster (commands routed by their keys' slot).
    Cluster(ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Single(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Single(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
        }
    }
}

impl Link {
    /// Opens a link as `[broker]` says; `push` receives pub/sub messages (RESP3) when given.
    /// Errors: a bad URL, a refused or timed-out connection, a failed handshake.
    pub async fn open(
        cfg: &BrokerConfig,
        push: Option<UnboundedSender<PushInfo>>,
        timeout: Duration,
    ) -> redis::RedisResult<Link> {
        Link::open_with(cfg, push, timeout, timeout).await
    }

    /// [`Link::open`] with its own bound on connecting (`timeout`) and on each reply
    /// (`response_timeout`).
    pub async fn open_with(
        cfg: &BrokerConfig,
        push: Option<UnboundedSender<PushInfo>>,
        timeout: Duration,
        response_timeout: Duration,
    ) -> redis::RedisResult<Link> {
        if let Some(urls) = cfg.cluster_urls() {
            let mut b = redis::cluster::ClusterClientBuilder::new(urls)
                .connection_timeout(timeout)
                .response_timeout(response_timeout)
                .retries(2);
            if let Some(tx) = push {
                b = b.use_protocol(ProtocolVersion::RESP3).push_sender(tx);
            }
            let client = b.build()?;
            return Ok(Link::Cluster(client.get_async_connection().await?));
        }
        let mut info = cfg.url.as_str().into_connection_info()?;
        let mut config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(response_timeout));
        if let Some(tx) = push {
            let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
            info = info.set_redis_settings(settings);
            config = config.set_push_sender(tx);
        }
        let client = redis::Client::open(info)?;
        Ok(Link::Single(client.get_multiplexed_async_connection_with_config(&config).await?))
    }

    /// Subscribes to `topics` (`SSUBSCRIBE` on a cluster, one topic per command since each
    /// lives in its own slot, all sent at once), returning once Redis confirmed all.
    pub async fn subscribe(&mut self, topics: &[String]) -> redis::RedisResult<()> {
        match self {
            Link::Single(c) => c.subscribe(topics).await,
            Link::Cluster(c) => {
                let calls = topics.iter().map(|t| {
                    let mut c = c.clone();
                    async move { c.ssubscribe(t).await }
                });
                futures::future::try_join_all(calls).await.map(drop)
            }
        }
    }

    /// Unsubscribes from `topics` (`SUNSUBSCRIBE` on a cluster).
    pub async fn unsubscribe(&mut self, topics: &[String]) -> redis::RedisResult<()> {
        match self {
            Link::Single(c) => c.unsubscribe(topics).await,
            Link::Cluster(c) => c.sunsubscribe(topics).await,
        }
    }

    /// The publish command the scripts use on this link: `SPUBLISH` on a cluster (sharded
    /// pub/sub, Redis 7), else `PUBLISH`.
    pub fn publish_command(cfg: &BrokerConfig) -> &'static str {
        if cfg.cluster_urls().is_some() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }
}
