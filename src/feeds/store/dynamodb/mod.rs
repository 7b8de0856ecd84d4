//! [`DynamoLeaseStore`]: feeds and leases in a DynamoDB table (`[feeds] store = "dynamodb"`,
//! `dynamodb_table`, `dynamodb_endpoint`; cargo feature `dynamodb`), one item per feed, each
//! compare-and-set one conditional `UpdateItem` (docs/feeds.md, "The DynamoDB store").
//!
//! | call | request | condition |
//! |---|---|---|
//! | `put` | `UpdateItem` `SET` the definition attributes (lease attributes only `if_not_exists`) | none: creates or replaces |
//! | `acquire` | `UpdateItem` `SET lease_owner, lease_expires_at_ms ADD fencing_token 1` | `attribute_exists(id) AND (attribute_not_exists(lease_owner) OR lease_expires_at_ms <= :now)` |
//! | `renew` | `UpdateItem` `SET lease_expires_at_ms[, last_seq]` | `attribute_exists(id) AND lease_owner = :owner AND fencing_token = :token AND lease_expires_at_ms > :now` |
//! | `release` | `UpdateItem` `SET lease_expires_at_ms = 0[, last_seq]` | `attribute_exists(id) AND lease_owner = :owner AND fencing_token = :token` |
//! | `get` | `GetItem`, strongly consistent | |
//! | `renew_many` | `TransactWriteItems` of up to 100 `renew` `Update`s ([`renew_many`]) | `renew`'s, per item |
//! | `get_many` | `BatchGetItem`, 100 keys a request, strongly consistent, `UnprocessedKeys` retried | |
//! | `list` | `Scan`, strongly consistent, every page | |
//! | `delete` | `DeleteItem` | |
//!
//! A failed condition returns the item as it was (`ReturnValuesOnConditionCheckFailure =
//! ALL_OLD`), so `Held` and `Lost` report the state that refused the write, read in the same
//! atomic step; an item that does not exist is `NotFound` (confirmed by a strongly consistent
//! `GetItem`, for an emulator that ignores `ALL_OLD`). Attribute names go through
//! `ExpressionAttributeNames`, so no DynamoDB reserved word can break an expression.
//!
//! Time is the caller's `now_ms`, as for the other stores (the clock assumption of
//! [`crate::feeds`]). Releases: DynamoDB has no pub/sub. With the Redis broker
//! ([`DynamoLeaseStore::with_redis_releases`], what `[broker] kind = "redis"` gives), each
//! release is published on the broker's Redis topic `PREFIXfeeds:released`, as the Redis store
//! does, and [`LeaseStore::released`] subscribes to it: every node's releases. Without it
//! (the memory broker: one node), [`LeaseStore::released`] delivers this process's releases.
//!
//! # Layout
//! - [`config`]: [`DynamoConfig`], [`DynamoCredentials`] and the SDK client they build;
//! - `item`: the item of a feed and short error messages for failed calls;
//! - [`renew_many`]: the batched renew, one transaction per 100 leases.

pub mod config;
mod item;
pub mod renew_many;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, KeysAndAttributes, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TableStatus,
};
use aws_sdk_dynamodb::Client;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

pub use config::{DynamoConfig, DynamoCredentials};
use item::{
    def_values, feed_of, item_id, key, lease_of, n, s, sdk_err, Item, DEF_FIELDS, EXPIRES, ID, LAST_SEQ, OWNER, TOKEN,
};

use super::releases::RedisReleases;
use super::{LeaseError, LeaseStore, LeaseTerm, Renewal};
use crate::feeds::metrics::{StoreOp, StoreRequests};
use crate::feeds::record::{validate_id, Feed, FeedDef, Lease};

/// Most keys in one `BatchGetItem` (DynamoDB's limit).
pub const BATCH_KEYS: usize = 100;
/// `BatchGetItem` requests of one `get_many` in flight at once.
const BATCHES_IN_FLIGHT: usize = 8;
/// Retries of a batch's `UnprocessedKeys` (throttling), after waits of 25, 50, … 800 ms.
const UNPROCESSED_RETRIES: u32 = 6;
/// How long `ensure_table` waits for a created table to become `ACTIVE`.
const ACTIVE_LIMIT: Duration = Duration::from_secs(60);

/// `renew`'s condition (also each item's of `renew_many`): the caller still holds the lease.
const RENEW_CONDITION: &str = "attribute_exists(#id) AND #o = :owner AND #t = :token AND #e > :now";

/// The DynamoDB operations the store sends, counted by [`DynamoLeaseStore::calls`].
#[derive(Clone, Copy)]
enum Op {
    GetItem,
    UpdateItem,
    DeleteItem,
    BatchGetItem,
    Scan,
    DescribeTable,
    CreateTable,
    TransactWriteItems,
}

/// Requests sent since the store was connected, per DynamoDB operation (each attempt counts,
/// whatever its outcome). For measuring what the lease store costs per node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DynamoCalls {
    /// `GetItem` (`get`, and confirming a missing item after a failed condition).
    pub get_item: u64,
    /// `UpdateItem` (`put`, `acquire`, `renew`, `release`).
    pub update_item: u64,
    /// `DeleteItem` (`delete`).
    pub delete_item: u64,
    /// `BatchGetItem` (`get_many`, `list` does not use it), retries of unprocessed keys included.
    pub batch_get_item: u64,
    /// `Scan` pages (`list`).
    pub scan: u64,
    /// `DescribeTable` (`ensure_table`).
    pub describe_table: u64,
    /// `CreateTable` (`ensure_table`).
    pub create_table: u64,
    /// `TransactWriteItems` (`renew_many`, retries of a cancelled transaction included).
    pub transact_write_items: u64,
}

/// A lease store in a DynamoDB table. Cheap to share behind an `Arc`; the SDK client pools
/// its HTTPS connections.
pub struct DynamoLeaseStore {
    client: Client,
    table: String,
    timeout_ms: u64,
    calls: [AtomicU64; 8],
    /// Requests per lease store method (`tether_feed_store_requests_total`).
    requests: Arc<StoreRequests>,
    /// Subscribers of [`LeaseStore::released`] without `redis_releases`; closed ones are
    /// dropped on the next release.
    released: Mutex<Vec<UnboundedSender<String>>>,
    /// Where releases are announced to every node, when the broker is Redis.
    redis_releases: Option<RedisReleases>,
}

/// `ExpressionAttributeNames` for the lease attributes, as `(placeholder, name)`.
fn names(with: &[(&str, &str)]) -> HashMap<String, String> {
    with.iter().map(|(p, n)| ((*p).to_owned(), (*n).to_owned())).collect()
}

/// The lease of a feed whose conditional write was refused, as it was when refused.
struct Refused(Lease);

impl Refused {
    /// A holder's write refused: it is no longer the holder.
    fn lost(self) -> LeaseError {
        let Refused(lease) = self;
        LeaseError::Lost {
            owner: lease.lease_owner,
            fencing_token: lease.fencing_token,
            expires_at_ms: lease.lease_expires_at_ms,
        }
    }
}

impl DynamoLeaseStore {
    /// Builds the client for `cfg` ([`DynamoConfig`]); sends nothing yet (the table is not
    /// checked: see [`DynamoLeaseStore::ensure_table`]). Errors: [`LeaseError::Invalid`]
    /// naming a bad field, or no region.
    pub async fn connect(cfg: &DynamoConfig) -> Result<DynamoLeaseStore, LeaseError> {
        Ok(DynamoLeaseStore {
            client: cfg.client().await?,
            table: cfg.table.clone(),
            timeout_ms: cfg.call_timeout_ms,
            calls: Default::default(),
            requests: Arc::default(),
            released: Mutex::new(Vec::new()),
            redis_releases: None,
        })
    }

    /// Announces releases to every node through `releases` (the broker's Redis): `release`
    /// publishes the feed id there once its write succeeded, and [`LeaseStore::released`]
    /// subscribes there, instead of the in-process list.
    pub fn with_redis_releases(mut self, releases: RedisReleases) -> DynamoLeaseStore {
        self.redis_releases = Some(releases);
        self
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The SDK client, to inspect the table (tests, tools). Writing through it bypasses the
    /// lease rules.
    pub fn sdk_client(&self) -> &Client {
        &self.client
    }

    /// Requests sent so far, per operation.
    pub fn calls(&self) -> DynamoCalls {
        let c = |op: Op| self.calls[op as usize].load(Ordering::Relaxed);
        DynamoCalls {
            get_item: c(Op::GetItem),
            update_item: c(Op::UpdateItem),
            delete_item: c(Op::DeleteItem),
            batch_get_item: c(Op::BatchGetItem),
            scan: c(Op::Scan),
            describe_table: c(Op::DescribeTable),
            create_table: c(Op::CreateTable),
            transact_write_items: c(Op::TransactWriteItems),
        }
    }

    fn count(&self, op: Op) {
        self.calls[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one `op` request sent for the lease store method `by`.
    fn sent(&self, op: Op, by: StoreOp) {
        self.count(op);
        self.requests.add(by, 1);
    }

    /// Creates the table if it does not exist (on-demand capacity, `PAY_PER_REQUEST`; hash
    /// key `id`, S) and waits, up to 60 s, until it is `ACTIVE`. For development and tests:
    /// in production the table is made by infrastructure as code, and the node needs no
    /// `CreateTable` right. Returns `true` if it created the table. Errors:
    /// [`LeaseError::Store`] when the call fails, or when an existing table's key is not
    /// `id` (S) alone.
    pub async fn ensure_table(&self) -> Result<bool, LeaseError> {
        if self.describe_table().await?.is_some() {
            return Ok(false);
        }
        self.count(Op::CreateTable);
        let id_key = KeySchemaElement::builder().attribute_name(ID).key_type(KeyType::Hash).build();
        let id_attr = AttributeDefinition::builder().attribute_name(ID).attribute_type(ScalarAttributeType::S).build();
        let (id_key, id_attr) = match (id_key, id_attr) {
            (Ok(k), Ok(a)) => (k, a),
            (Err(e), _) | (_, Err(e)) => return Err(LeaseError::Store(format!("CreateTable request: {e}"))),
        };
        let created = self
            .client
            .create_table()
            .table_name(&self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .key_schema(id_key)
            .attribute_definitions(id_attr)
            .send()
            .await;
        let created = match created {
            Ok(_) => true,
            // Another node created it between our DescribeTable and CreateTable.
            Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => false,
            Err(e) => return Err(sdk_err("CreateTable", self.timeout_ms, e)),
        };
        let end = Instant::now() + ACTIVE_LIMIT;
        loop {
            if self.describe_table().await? == Some(TableStatus::Active) {
                return Ok(created);
            }
            if Instant::now() >= end {
                return Err(LeaseError::Store(format!("table {} not ACTIVE within {ACTIVE_LIMIT:?}", self.table)));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The table's status, `None` if it does not exist; checks its key schema.
    async fn describe_table(&self) -> Result<Option<TableStatus>, LeaseError> {
        self.count(Op::DescribeTable);
        let out = match self.client.describe_table().table_name(&self.table).send().await {
            Ok(out) => out,
            Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => return Ok(None),
            Err(e) => return Err(sdk_err("DescribeTable", self.timeout_ms, e)),
        };
        let desc =
            out.table().ok_or_else(|| LeaseError::Store(format!("DescribeTable {}: no description", self.table)))?;
        let hash_id = desc.key_schema().iter().all(|k| k.attribute_name() == ID && *k.key_type() == KeyType::Hash);
        let id_is_s = desc
            .attribute_definitions()
            .iter()
            .any(|a| a.attribute_name() == ID && *a.attribute_type() == ScalarAttributeType::S);
        if desc.key_schema().len() != 1 || !hash_id || !id_is_s {
            return Err(LeaseError::Store(format!(
                "table {} exists but its key is not `id` (S) alone: not a tether feeds table",
                self.table
            )));
        }
        Ok(Some(desc.table_status().cloned().unwrap_or(TableStatus::Active)))
    }

    /// The item `id`, strongly consistent, read for the method `by`.
    async fn get_item(&self, id: &str, by: StoreOp) -> Result<Option<Item>, LeaseError> {
        self.sent(Op::GetItem, by);
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_err("GetItem", self.timeout_ms, e))?;
        Ok(out.item().cloned())
    }

    /// The item a failed condition check was about: the one returned with the failure
    /// (`ALL_OLD`), else a strongly consistent read; `None` when the feed does not exist.
    async fn refused_item(&self, id: &str, returned: Option<&Item>, by: StoreOp) -> Result<Option<Item>, LeaseError> {
        match returned {
            Some(item) if !item.is_empty() => Ok(Some(item.clone())),
            _ => self.get_item(id, by).await,
        }
    }

    /// One conditional `UpdateItem` of the lease attributes of feed `id`: `SET`s `update`
    /// (plus `last_seq` when given) if `condition` holds. `#id`, `#o`, `#t`, `#e` name the
    /// key, owner, token and expiry attributes. Returns the new values of the updated
    /// attributes, or [`Refused`] with the lease that failed the condition (read in the same
    /// atomic step); [`LeaseError::NotFound`] when there is no such feed.
    async fn conditional_update(
        &self,
        by: StoreOp,
        id: &str,
        update: &str,
        condition: &str,
        mut values: Item,
        last_seq: Option<&str>,
    ) -> Result<Result<Item, Refused>, LeaseError> {
        let mut names = names(&[("#id", ID), ("#o", OWNER), ("#t", TOKEN), ("#e", EXPIRES)]);
        let mut update = update.to_owned();
        if let Some(seq) = last_seq {
            update.push_str(", #s = :seq");
            names.insert("#s".into(), LAST_SEQ.into());
            values.insert(":seq".into(), s(seq));
        }
        self.sent(Op::UpdateItem, by);
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(id)))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::UpdatedNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let err = match sent {
            Ok(mut out) => return Ok(Ok(out.attributes.take().unwrap_or_default())),
            Err(e) => e,
        };
        let Some(UpdateItemError::ConditionalCheckFailedException(failed)) = err.as_service_error() else {
            return Err(sdk_err("UpdateItem", self.timeout_ms, err));
        };
        let item = self.refused_item(id, failed.item(), by).await?.ok_or(LeaseError::NotFound)?;
        Ok(Err(Refused(lease_of(&item, id)?)))
    }

    /// One `BatchGetItem` of at most [`BATCH_KEYS`] distinct ids, strongly consistent, its
    /// `UnprocessedKeys` retried with backoff; the items found.
    async fn batch_get(&self, ids: &[&str]) -> Result<Vec<Item>, LeaseError> {
        let mut pending: Vec<Item> = ids.iter().map(|id| key(id)).collect();
        let mut found = Vec::with_capacity(ids.len());
        for attempt in 0..=UNPROCESSED_RETRIES {
            if attempt > 0 {
                let cap = 25u64 << (attempt - 1);
                tokio::time::sleep(Duration::from_millis(rand::random_range(cap / 2..=cap))).await;
            }
            let keys = KeysAndAttributes::builder()
                .set_keys(Some(std::mem::take(&mut pending)))
                .consistent_read(true)
                .build()
                .map_err(|e| LeaseError::Store(format!("BatchGetItem request: {e}")))?;
            self.sent(Op::BatchGetItem, StoreOp::GetMany);
            let mut out = self
                .client
                .batch_get_item()
                .request_items(&self.table, keys)
                .send()
                .await
                .map_err(|e| sdk_err("BatchGetItem", self.timeout_ms, e))?;
            if let Some(items) = out.responses.as_mut().and_then(|r| r.remove(&self.table)) {
                found.extend(items);
            }
            pending =
                out.unprocessed_keys.as_mut().and_then(|u| u.remove(&self.table)).map(|k| k.keys).unwrap_or_default();
            if pending.is_empty() {
                return Ok(found);
            }
        }
        Err(LeaseError::Store(format!(
            "BatchGetItem: {} keys still unprocessed after {UNPROCESSED_RETRIES} retries (throttled)",
            pending.len()
        )))
    }

    /// Announces the release of `id`: on Redis when configured (a failure is logged: the
    /// release is written, other nodes take the feed at their next reconcile), else to this
    /// process's subscribers.
    async fn notify_released(&self, id: &str) {
        if let Some(r) = &self.redis_releases {
            if let Err(e) = r.publish(id).await {
                tracing::warn!(feed = %id, error = %e, "feeds: release written but not announced; other nodes take it at their next reconcile");
            }
            return;
        }
        // Each section only pushes or filters the list, so a poisoned lock is still consistent.
        let mut subs = self.released.lock().unwrap_or_else(|p| p.into_inner());
        subs.retain(|tx| tx.send(id.to_owned()).is_ok());
    }
}

impl LeaseStore for DynamoLeaseStore {
    async fn put(&self, def: &FeedDef) -> Result<bool, LeaseError> {
        debug_assert!(def.validate().is_ok(), "checked by the front door");
        let mut names = names(&[("#t", TOKEN), ("#e", EXPIRES)]);
        let mut values: Item = HashMap::from([(":zero".to_owned(), n(0))]);
        let mut sets = Vec::with_capacity(DEF_FIELDS.len() + 2);
        for (i, (field, value)) in DEF_FIELDS.iter().zip(def_values(def)).enumerate() {
            names.insert(format!("#f{i}"), (*field).to_owned());
            values.insert(format!(":f{i}"), value);
            sets.push(format!("#f{i} = :f{i}"));
        }
        // A new feed starts with token 0 and a free lease; an existing one keeps its lease.
        sets.push("#t = if_not_exists(#t, :zero)".into());
        sets.push("#e = if_not_exists(#e, :zero)".into());
        self.sent(Op::UpdateItem, StoreOp::Put);
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(&def.id)))
            .update_expression(format!("SET {}", sets.join(", ")))
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|e| sdk_err("UpdateItem", self.timeout_ms, e))?;
        Ok(out.attributes().is_none_or(HashMap::is_empty))
    }

    async fn get(&self, id: &str) -> Result<Option<Feed>, LeaseError> {
        self.get_item(id, StoreOp::Get).await?.as_ref().map(feed_of).transpose()
    }

    async fn delete(&self, id: &str) -> Result<bool, LeaseError> {
        self.sent(Op::DeleteItem, StoreOp::Delete);
        let out = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key(id)))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|e| sdk_err("DeleteItem", self.timeout_ms, e))?;
        Ok(out.attributes().is_some_and(|a| !a.is_empty()))
    }

    async fn acquire(&self, id: &str, term: LeaseTerm<'_>) -> Result<u64, LeaseError> {
        let LeaseTerm { owner, now_ms, lease_ms } = term;
        let values = HashMap::from([
            (":owner".to_owned(), s(owner)),
            (":exp".to_owned(), n(now_ms.saturating_add(lease_ms))),
            (":now".to_owned(), n(now_ms)),
            (":one".to_owned(), n(1)),
        ]);
        let update = "SET #o = :owner, #e = :exp ADD #t :one";
        let condition = "attribute_exists(#id) AND (attribute_not_exists(#o) OR #e <= :now)";
        match self.conditional_update(StoreOp::Acquire, id, update, condition, values, None).await? {
            Ok(new) => match lease_of(&new, id)?.fencing_token {
                0 => {
                    Err(LeaseError::Store(format!("DynamoDB UpdateItem {id}: the new fencing_token was not returned")))
                }
                token => Ok(token),
            },
            Err(Refused(lease)) => Err(LeaseError::Held {
                owner: lease.lease_owner.unwrap_or_default(),
                expires_at_ms: lease.lease_expires_at_ms,
            }),
        }
    }

    async fn renew(&self, term: LeaseTerm<'_>, lease: Renewal<'_>) -> Result<(), LeaseError> {
        let (LeaseTerm { owner, now_ms, lease_ms }, Renewal { id, token, last_seq }) = (term, lease);
        let values = HashMap::from([
            (":owner".to_owned(), s(owner)),
            (":token".to_owned(), n(token)),
            (":now".to_owned(), n(now_ms)),
            (":exp".to_owned(), n(now_ms.saturating_add(lease_ms))),
        ]);
        self.conditional_update(StoreOp::Renew, id, "SET #e = :exp", RENEW_CONDITION, values, last_seq)
            .await?
            .map_err(Refused::lost)?;
        Ok(())
    }

    async fn renew_many(
        &self,
        term: LeaseTerm<'_>,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
        self.transact_renew(term, leases).await
    }

    async fn release(&self, id: &str, owner: &str, token: u64, last_seq: Option<&str>) -> Result<(), LeaseError> {
        let values = HashMap::from([
            (":owner".to_owned(), s(owner)),
            (":token".to_owned(), n(token)),
            (":zero".to_owned(), n(0)),
        ]);
        let condition = "attribute_exists(#id) AND #o = :owner AND #t = :token";
        self.conditional_update(StoreOp::Release, id, "SET #e = :zero", condition, values, last_seq)
            .await?
            .map_err(Refused::lost)?;
        self.notify_released(id).await;
        Ok(())
    }

    async fn get_many(&self, ids: &[String]) -> Result<Vec<Option<Feed>>, LeaseError> {
        // BatchGetItem refuses a request naming one key twice.
        let mut seen = HashSet::with_capacity(ids.len());
        let distinct: Vec<&str> = ids.iter().map(String::as_str).filter(|id| seen.insert(*id)).collect();
        let requests: Vec<_> = distinct.chunks(BATCH_KEYS).map(|chunk| self.batch_get(chunk)).collect();
        let batches: Vec<Vec<Item>> = futures::stream::iter(requests).buffered(BATCHES_IN_FLIGHT).try_collect().await?;
        let mut by_id: HashMap<String, Feed> = HashMap::with_capacity(distinct.len());
        for item in batches.iter().flatten() {
            let feed = feed_of(item)?;
            by_id.insert(feed.def.id.clone(), feed);
        }
        Ok(ids.iter().map(|id| by_id.get(id).cloned()).collect())
    }

    async fn list(&self) -> Result<Vec<Feed>, LeaseError> {
        let mut feeds = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            self.sent(Op::Scan, StoreOp::List);
            let out = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| sdk_err("Scan", self.timeout_ms, e))?;
            for item in out.items() {
                // An item whose id is not a feed id was written by something else: skipped,
                // as the Redis store skips such an index entry, rather than failing the list.
                if item_id(item).is_some_and(|id| validate_id(id).is_ok()) {
                    feeds.push(feed_of(item)?);
                }
            }
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(feeds),
            }
        }
    }

    async fn released(&self) -> Result<UnboundedReceiver<String>, LeaseError> {
        self.requests.add(StoreOp::Released, 1);
        if let Some(r) = &self.redis_releases {
            return r.subscribe().await;
        }
        let (tx, rx) = unbounded_channel();
        self.released.lock().unwrap_or_else(|p| p.into_inner()).push(tx);
        Ok(rx)
    }

    fn requests(&self) -> &Arc<StoreRequests> {
        &self.requests
    }
}
