//! The lease store a node uses, chosen by `[feeds] store` (docs/feeds.md). [`LeaseStore`] uses
//! `impl Future` and is not object safe, so the runtime holds this enum over the backends.
//! It also counts the feed items each call wrote (`tether_feed_store_items_written_total`):
//! one per successful write, none for a refused one.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;

use super::metrics::StoreRequests;
use super::record::{Feed, FeedDef};
use super::store::{LeaseError, LeaseStore, Renewal};
use super::{MemoryLeaseStore, RedisLeaseStore};
#[cfg(feature = "dynamodb")]
use crate::config::BrokerKind;
use crate::config::{Config, FeedStoreKind};

/// One of the lease store backends. Each method forwards to the backend's [`LeaseStore`]
/// method of the same name (same arguments, same errors), counting the items it wrote in
/// [`AnyStore::requests`].
pub enum AnyStore {
    /// `store = "memory"`: this process only.
    Memory(MemoryLeaseStore),
    /// `store = "redis"`: the broker's Redis (boxed: its connection and scripts are large,
    /// and the enum is held once per process).
    Redis(Box<RedisLeaseStore>),
    /// `store = "dynamodb"`: the table `dynamodb_table` (cargo feature `dynamodb`).
    #[cfg(feature = "dynamodb")]
    Dynamodb(Box<super::DynamoLeaseStore>),
}

/// Calls `$call` on whichever backend `$s` holds.
macro_rules! each {
    ($s:expr, $b:ident => $call:expr) => {
        match $s {
            AnyStore::Memory($b) => $call,
            AnyStore::Redis($b) => $call,
            #[cfg(feature = "dynamodb")]
            AnyStore::Dynamodb($b) => $call,
        }
    };
}

impl AnyStore {
    /// Opens the store `config.feeds.store` names (Redis: connects with `[broker]`'s URL and
    /// prefix; DynamoDB: the table `dynamodb_table` at `dynamodb_endpoint` or AWS, credentials
    /// and region from the AWS SDK's chain, the table must exist; with `[broker] kind =
    /// "redis"` its releases are announced on the broker's Redis, see
    /// [`super::releases::RedisReleases`], connected at the first release). Errors: the store cannot be reached ([`LeaseError::Store`]), or the binary
    /// lacks the backend (`dynamodb` without the cargo feature; config validation refuses it
    /// first).
    pub async fn open(config: &Config) -> Result<AnyStore, LeaseError> {
        match config.feeds.store {
            FeedStoreKind::Memory => Ok(AnyStore::Memory(MemoryLeaseStore::new())),
            FeedStoreKind::Redis => Ok(AnyStore::Redis(Box::new(RedisLeaseStore::connect(&config.broker).await?))),
            #[cfg(feature = "dynamodb")]
            FeedStoreKind::Dynamodb => {
                let f = &config.feeds;
                let endpoint = Some(f.dynamodb_endpoint.clone()).filter(|e| !e.is_empty());
                let cfg = super::DynamoConfig { endpoint, ..super::DynamoConfig::new(f.dynamodb_table.clone()) };
                let mut store = super::DynamoLeaseStore::connect(&cfg).await?;
                // Several nodes always share a Redis broker: releases reach them on its pub/sub.
                if config.broker.kind == BrokerKind::Redis {
                    store = store.with_redis_releases(super::releases::RedisReleases::new(&config.broker));
                }
                Ok(AnyStore::Dynamodb(Box::new(store)))
            }
            #[cfg(not(feature = "dynamodb"))]
            FeedStoreKind::Dynamodb => Err(LeaseError::Store(
                "feeds.store = \"dynamodb\": this binary has no DynamoDB store (build with --features dynamodb)".into(),
            )),
        }
    }

    /// The backend's request counters ([`LeaseStore::requests`]).
    pub fn requests(&self) -> &Arc<StoreRequests> {
        each!(self, s => s.requests())
    }

    /// Counts one item written when `r` is a success.
    fn wrote_if<T>(&self, r: Result<T, LeaseError>) -> Result<T, LeaseError> {
        if r.is_ok() {
            self.requests().wrote(1);
        }
        r
    }

    /// See [`LeaseStore::put`].
    pub async fn put(&self, def: &FeedDef) -> Result<bool, LeaseError> {
        self.wrote_if(each!(self, s => s.put(def).await))
    }

    /// See [`LeaseStore::get`].
    pub async fn get(&self, id: &str) -> Result<Option<Feed>, LeaseError> {
        each!(self, s => s.get(id).await)
    }

    /// See [`LeaseStore::delete`].
    pub async fn delete(&self, id: &str) -> Result<bool, LeaseError> {
        let r = each!(self, s => s.delete(id).await);
        if r == Ok(true) {
            self.requests().wrote(1);
        }
        r
    }

    /// See [`LeaseStore::acquire`].
    pub async fn acquire(&self, id: &str, owner: &str, now_ms: u64, lease_ms: u64) -> Result<u64, LeaseError> {
        self.wrote_if(each!(self, s => s.acquire(id, owner, now_ms, lease_ms).await))
    }

    /// See [`LeaseStore::renew`].
    pub async fn renew(
        &self,
        id: &str,
        owner: &str,
        token: u64,
        now_ms: u64,
        lease_ms: u64,
        last_seq: Option<&str>,
    ) -> Result<(), LeaseError> {
        self.wrote_if(each!(self, s => s.renew(id, owner, token, now_ms, lease_ms, last_seq).await))
    }

    /// See [`LeaseStore::renew_many`].
    pub async fn renew_many(
        &self,
        owner: &str,
        now_ms: u64,
        lease_ms: u64,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
        let r = each!(self, s => s.renew_many(owner, now_ms, lease_ms, leases).await);
        if let Ok(results) = &r {
            self.requests().wrote(results.iter().filter(|x| x.is_ok()).count() as u64);
        }
        r
    }

    /// See [`LeaseStore::release`].
    pub async fn release(&self, id: &str, owner: &str, token: u64, last_seq: Option<&str>) -> Result<(), LeaseError> {
        self.wrote_if(each!(self, s => s.release(id, owner, token, last_seq).await))
    }

    /// See [`LeaseStore::get_many`].
    pub async fn get_many(&self, ids: &[String]) -> Result<Vec<Option<Feed>>, LeaseError> {
        each!(self, s => s.get_many(ids).await)
    }

    /// See [`LeaseStore::list`].
    pub async fn list(&self) -> Result<Vec<Feed>, LeaseError> {
        each!(self, s => s.list().await)
    }

    /// See [`LeaseStore::released`].
    pub async fn released(&self) -> Result<UnboundedReceiver<String>, LeaseError> {
        each!(self, s => s.released().await)
    }
}
