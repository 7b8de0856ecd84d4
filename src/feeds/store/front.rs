//! The front door of the lease store: [`AnyStore`], the backend `[feeds] store` names
//! (docs/feeds.md). [`LeaseStore`] uses `impl Future` and is not object safe, so the runtime
//! holds this enum over the backends. Every call passes here first: each argument is checked
//! once, before any backend sees it (a malformed one is refused with [`LeaseError::Invalid`]
//! naming the field, and nothing is sent), and the feed items each call wrote are counted
//! (`tether_feed_store_items_written_total`): one per successful write, none for a refused
//! one. The backends behind it only store.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;

use super::{LeaseError, LeaseStore, LeaseTerm, MemoryLeaseStore, RedisLeaseStore, Renewal};
#[cfg(feature = "dynamodb")]
use crate::config::BrokerKind;
use crate::config::{Config, FeedStoreKind};
use crate::feeds::metrics::StoreRequests;
use crate::feeds::record::{validate_id, validate_owner, validate_seq, Feed, FeedDef, FeedError};

/// One of the lease store backends, behind the checks. Each [`LeaseStore`] method checks its
/// arguments, then forwards to the backend's method of the same name (same errors), counting
/// the items it wrote in [`LeaseStore::requests`].
pub enum AnyStore {
    /// `store = "memory"`: this process only.
    Memory(MemoryLeaseStore),
    /// `store = "redis"`: the broker's Redis (boxed: its connection and scripts are large,
    /// and the enum is held once per process).
    Redis(Box<RedisLeaseStore>),
    /// `store = "dynamodb"`: the table `dynamodb_table` (cargo feature `dynamodb`).
    #[cfg(feature = "dynamodb")]
    Dynamodb(Box<super::dynamodb::DynamoLeaseStore>),
}

impl From<MemoryLeaseStore> for AnyStore {
    fn from(s: MemoryLeaseStore) -> Self {
        AnyStore::Memory(s)
    }
}

impl From<RedisLeaseStore> for AnyStore {
    fn from(s: RedisLeaseStore) -> Self {
        AnyStore::Redis(Box::new(s))
    }
}

#[cfg(feature = "dynamodb")]
impl From<super::dynamodb::DynamoLeaseStore> for AnyStore {
    fn from(s: super::dynamodb::DynamoLeaseStore) -> Self {
        AnyStore::Dynamodb(Box::new(s))
    }
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

/// Longest lease: one day, in milliseconds.
const MAX_LEASE_MS: u64 = 86_400_000;

/// Largest `now_ms + lease_ms` a store is asked to compute: the Redis scripts' Lua numbers
/// are doubles, exact up to 2^53 (year 287,396 in Unix epoch ms); every backend refuses the
/// same times.
const MAX_EXACT_MS: u64 = 1 << 53;

/// Checks a [`LeaseTerm`]: the owner, `lease_ms` (1 ..= [`MAX_LEASE_MS`]) and that
/// `now_ms + lease_ms` stays within [`MAX_EXACT_MS`]. Errors name the field.
fn check_term(term: LeaseTerm<'_>) -> Result<(), FeedError> {
    validate_owner(term.owner)?;
    if !(1..=MAX_LEASE_MS).contains(&term.lease_ms) {
        let reason = format!("{} is not 1 ..= {MAX_LEASE_MS} ms", term.lease_ms);
        return Err(FeedError { field: "lease_ms", reason });
    }
    if term.now_ms.saturating_add(term.lease_ms) > MAX_EXACT_MS {
        return Err(FeedError { field: "now_ms", reason: format!("{} + lease_ms is past 2^53 ms", term.now_ms) });
    }
    Ok(())
}

/// Checks the arguments of `renew_many`: the term, each lease, and that no id appears twice
/// (errors name `id`).
fn check_renewals(term: LeaseTerm<'_>, leases: &[Renewal<'_>]) -> Result<(), FeedError> {
    check_term(term)?;
    let mut seen = HashSet::with_capacity(leases.len());
    for r in leases {
        validate_id(r.id)?;
        r.last_seq.map(validate_seq).transpose()?;
        if !seen.insert(r.id) {
            return Err(FeedError { field: "id", reason: format!("{:?} given twice in one renew_many", r.id) });
        }
    }
    Ok(())
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
                let cfg = super::dynamodb::DynamoConfig {
                    endpoint,
                    ..super::dynamodb::DynamoConfig::new(f.dynamodb_table.clone())
                };
                let mut store = super::dynamodb::DynamoLeaseStore::connect(&cfg).await?;
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

    /// Counts one item written when `r` is a success.
    fn wrote_if<T>(&self, r: Result<T, LeaseError>) -> Result<T, LeaseError> {
        if r.is_ok() {
            self.requests().wrote(1);
        }
        r
    }
}

impl LeaseStore for AnyStore {
    async fn put(&self, def: &FeedDef) -> Result<bool, LeaseError> {
        def.validate()?;
        self.wrote_if(each!(self, s => s.put(def).await))
    }

    async fn get(&self, id: &str) -> Result<Option<Feed>, LeaseError> {
        validate_id(id)?;
        each!(self, s => s.get(id).await)
    }

    async fn delete(&self, id: &str) -> Result<bool, LeaseError> {
        validate_id(id)?;
        let r = each!(self, s => s.delete(id).await);
        if r == Ok(true) {
            self.requests().wrote(1);
        }
        r
    }

    async fn acquire(&self, id: &str, term: LeaseTerm<'_>) -> Result<u64, LeaseError> {
        validate_id(id)?;
        check_term(term)?;
        self.wrote_if(each!(self, s => s.acquire(id, term).await))
    }

    async fn renew(&self, term: LeaseTerm<'_>, lease: Renewal<'_>) -> Result<(), LeaseError> {
        validate_id(lease.id)?;
        check_term(term)?;
        lease.last_seq.map(validate_seq).transpose()?;
        self.wrote_if(each!(self, s => s.renew(term, lease).await))
    }

    async fn renew_many(
        &self,
        term: LeaseTerm<'_>,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
        check_renewals(term, leases)?;
        let r = each!(self, s => s.renew_many(term, leases).await);
        if let Ok(results) = &r {
            self.requests().wrote(results.iter().filter(|x| x.is_ok()).count() as u64);
        }
        r
    }

    async fn release(&self, id: &str, owner: &str, token: u64, last_seq: Option<&str>) -> Result<(), LeaseError> {
        validate_id(id)?;
        validate_owner(owner)?;
        last_seq.map(validate_seq).transpose()?;
        self.wrote_if(each!(self, s => s.release(id, owner, token, last_seq).await))
    }

    async fn get_many(&self, ids: &[String]) -> Result<Vec<Option<Feed>>, LeaseError> {
        for id in ids {
            validate_id(id)?;
        }
        each!(self, s => s.get_many(ids).await)
    }

    async fn list(&self) -> Result<Vec<Feed>, LeaseError> {
        each!(self, s => s.list().await)
    }

    async fn released(&self) -> Result<UnboundedReceiver<String>, LeaseError> {
        each!(self, s => s.released().await)
    }

    fn requests(&self) -> &Arc<StoreRequests> {
        each!(self, s => s.requests())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feeds::DesiredState;

    fn def(id: &str) -> FeedDef {
        FeedDef {
            id: id.into(),
            url: "ws://127.0.0.1:1/".into(),
            channel: format!("feed.{id}"),
            desired_state: DesiredState::Started,
            subscribe: String::new(),
            resume_query: String::new(),
            seq_pointer: "/seq".into(),
        }
    }

    #[tokio::test]
    async fn bad_arguments_are_refused_with_the_field_before_the_backend() {
        let s = AnyStore::from(MemoryLeaseStore::new());
        s.put(&def("a")).await.unwrap();
        let asked = s.requests().total();
        let field = |e: LeaseError| match e {
            LeaseError::Invalid(f) => f.field,
            other => panic!("{other:?}"),
        };
        let term = |owner, lease_ms| LeaseTerm { owner, now_ms: 0, lease_ms };
        let lease = |id, last_seq| Renewal { id, token: 1, last_seq };
        assert_eq!(field(s.acquire("a", term("", 1_000)).await.unwrap_err()), "lease_owner");
        assert_eq!(field(s.acquire("a", term("n", 0)).await.unwrap_err()), "lease_ms");
        assert_eq!(field(s.acquire("a:b", term("n", 10)).await.unwrap_err()), "id");
        assert_eq!(field(s.renew(term("n", 10), lease("a", Some(""))).await.unwrap_err()), "last_seq");
        let late = LeaseTerm { owner: "n", now_ms: MAX_EXACT_MS, lease_ms: 1 };
        assert_eq!(field(s.renew(late, lease("a", None)).await.unwrap_err()), "now_ms");
        let twice = [lease("a", None), lease("a", None)];
        assert_eq!(field(s.renew_many(term("n", 10), &twice).await.unwrap_err()), "id");
        assert_eq!(field(s.release("a", "n b", 1, None).await.unwrap_err()), "lease_owner");
        assert_eq!(s.requests().total(), asked, "nothing refused reached the backend");
        assert_eq!(s.acquire("zz", term("n", 10)).await, Err(LeaseError::NotFound));
    }
}
