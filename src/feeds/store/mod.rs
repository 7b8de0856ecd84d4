//! The lease store seam (STYLE 5): one small async trait, three backends, and the front door
//! the runtime calls them through.
//!
//! # Layout
//! - this file: the [`LeaseStore`] trait, [`LeaseError`], the arguments [`LeaseTerm`] and
//!   [`Renewal`];
//! - [`front`]: [`AnyStore`], the front door: the backend `[feeds] store` names; it checks
//!   every argument once, before any backend sees it, and counts the items written;
//! - [`memory`]: [`MemoryLeaseStore`], for one process;
//! - [`redis`]: [`RedisLeaseStore`], the broker's Redis, one Lua script per compare-and-set
//!   (per 500 leases for the batched renew);
//! - `dynamodb` (cargo feature `dynamodb`): `DynamoLeaseStore`, a DynamoDB table, one
//!   conditional `UpdateItem` per compare-and-set (one `TransactWriteItems` per 100 leases for
//!   the batched renew);
//! - [`releases`]: release notifications on the broker's Redis pub/sub, shared by the Redis
//!   store and (with the Redis broker) the DynamoDB store.
//!
//! The backends only store: they trust their arguments (checked with `debug_assert!` in debug
//! builds). Call them through [`AnyStore`], which refuses a malformed argument with
//! [`LeaseError::Invalid`] naming the field.

#[cfg(feature = "dynamodb")]
pub mod dynamodb;
pub mod front;
pub mod memory;
pub mod redis;
pub mod releases;

pub use front::AnyStore;
pub use memory::MemoryLeaseStore;
pub use redis::RedisLeaseStore;

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;

use super::metrics::StoreRequests;
use super::record::{Feed, FeedDef, FeedError};

/// Why a lease store call did not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseError {
    /// An argument or definition field is malformed; nothing was written.
    Invalid(FeedError),
    /// No feed with that id.
    NotFound,
    /// `acquire`: someone holds an unexpired lease. Retry after `expires_at_ms` or on a
    /// release notification.
    Held {
        /// The holder.
        owner: String,
        /// When its lease ends (ms, the holder's clock).
        expires_at_ms: u64,
    },
    /// `renew` / `release`: the caller is not the current holder (another owner or a newer
    /// fencing token: it was taken over), or (`renew` only) its lease has expired. The caller
    /// must stop the feed at once.
    Lost {
        /// The owner now recorded (`None` if never acquired).
        owner: Option<String>,
        /// The fencing token now recorded.
        fencing_token: u64,
        /// The expiry now recorded (ms).
        expires_at_ms: u64,
    },
    /// The store failed (not connected, refused the request, a read failed). The Redis store
    /// answers a write so only when it certainly did not happen (not sent, refused before it
    /// ran, or run past its deadline); a store that cannot tell may answer so too. Retry;
    /// for a renew, treat the lease as lost once its margin passes.
    Store(String),
    /// A write was sent and no answer came in time, or the connection failed while it was
    /// out: it may or may not have taken effect (admin endpoints answer 504 with
    /// `"outcome":"unknown"`). Read the feed to learn; retrying is safe (every write is a
    /// compare-and-set or an overwrite); for a renew, as [`LeaseError::Store`].
    Unknown(String),
}

impl std::fmt::Display for LeaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseError::Invalid(e) => write!(f, "invalid {e}"),
            LeaseError::NotFound => f.write_str("no such feed"),
            LeaseError::Held { owner, expires_at_ms } => {
                write!(f, "lease held by {owner} until {expires_at_ms} ms")
            }
            LeaseError::Lost { owner, fencing_token, expires_at_ms } => write!(
                f,
                "lease lost: now owner {}, fencing token {fencing_token}, expires {expires_at_ms} ms",
                owner.as_deref().unwrap_or("(none)")
            ),
            LeaseError::Store(e) => write!(f, "lease store failed: {e}"),
            LeaseError::Unknown(e) => {
                write!(f, "lease store did not answer in time ({e}); the write may or may not have happened")
            }
        }
    }
}

impl std::error::Error for LeaseError {}

impl From<FeedError> for LeaseError {
    fn from(e: FeedError) -> Self {
        LeaseError::Invalid(e)
    }
}

/// Who asks for a lease and for how long: the term shared by [`LeaseStore::acquire`],
/// [`LeaseStore::renew`] and every lease of a [`LeaseStore::renew_many`]. The lease runs
/// until `now_ms + lease_ms`.
///
/// Checked by the front door ([`AnyStore`]) before any backend sees it; errors
/// ([`LeaseError::Invalid`]) name `lease_owner` (not 1–128 bytes of printable ASCII without
/// spaces, [`super::record::validate_owner`]), `lease_ms` (not 1 ..= 86,400,000, one day) or
/// `now_ms` (`now_ms + lease_ms` past 2^53 ms, the Redis scripts' exact range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTerm<'a> {
    /// The node asking (the lease's `lease_owner`).
    pub owner: &'a str,
    /// The caller's clock, Unix epoch milliseconds.
    pub now_ms: u64,
    /// How long the lease runs from `now_ms`, milliseconds.
    pub lease_ms: u64,
}

/// One held lease to renew: the feed and the fencing token the caller holds for it, plus the
/// progress to store. What [`LeaseStore::renew`] takes, and each lease of a
/// [`LeaseStore::renew_many`]. Checked by the front door: errors name `id` or `last_seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewal<'a> {
    /// The feed id.
    pub id: &'a str,
    /// The fencing token the caller holds for it.
    pub token: u64,
    /// The last upstream seq to store with the renew, if any.
    pub last_seq: Option<&'a str>,
}

/// The results of a `renew_many` sent as requests of `chunk` leases each, `replies` one per
/// request in order: the whole call's error when every request failed (nothing was renewed;
/// with [`LeaseError::Unknown`], perhaps some were), else one result per lease, the
/// request's error for each lease of a failed one.
fn merge_chunks(
    leases: &[Renewal<'_>],
    chunk: usize,
    replies: Vec<Result<Vec<Result<(), LeaseError>>, LeaseError>>,
) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
    if replies.iter().all(Result::is_err) {
        if let Some(Err(e)) = replies.into_iter().next() {
            return Err(e);
        }
        return Ok(Vec::new());
    }
    let mut out = Vec::with_capacity(leases.len());
    for (part, r) in leases.chunks(chunk).zip(replies) {
        match r {
            Ok(v) => out.extend(v),
            Err(e) => out.extend(part.iter().map(|_| Err(e.clone()))),
        }
    }
    Ok(out)
}

/// Where feeds and their leases live. Every method is one atomic step of the store (one Lua
/// script or one command on Redis, one critical section in memory); the lease rules are those
/// of the module doc ([`crate::feeds`]). Times are milliseconds given by the caller, so the
/// lease rules never read the store's clock (the Redis store reads Redis `TIME` only for
/// its writes' deadlines, [`LeaseError::Unknown`]). Ids, owners, `lease_ms` and `last_seq`
/// are checked by the front door ([`AnyStore`]), which refuses a malformed one with
/// [`LeaseError::Invalid`] naming the field; a backend trusts its arguments.
pub trait LeaseStore: Send + Sync {
    /// Creates or replaces a feed definition after [`FeedDef::validate`]; the lease fields
    /// of an existing feed are kept. Returns `true` if the feed was created.
    fn put(&self, def: &FeedDef) -> impl Future<Output = Result<bool, LeaseError>> + Send;

    /// The feed `id`, or `None`.
    fn get(&self, id: &str) -> impl Future<Output = Result<Option<Feed>, LeaseError>> + Send;

    /// Deletes the feed `id` with its lease; returns whether it existed. A holder's next
    /// renew then fails with [`LeaseError::NotFound`].
    fn delete(&self, id: &str) -> impl Future<Output = Result<bool, LeaseError>> + Send;

    /// Takes the lease of feed `id` for `term.owner` until `term.now_ms + term.lease_ms` if it
    /// is free at `term.now_ms` (`lease_expires_at_ms <= now_ms`); returns the new fencing
    /// token (the previous one plus one). Errors: [`LeaseError::Held`],
    /// [`LeaseError::NotFound`]. The desired state is not checked: the caller decides which
    /// feeds to run.
    fn acquire(&self, id: &str, term: LeaseTerm<'_>) -> impl Future<Output = Result<u64, LeaseError>> + Send;

    /// Extends the lease `lease.id` of `term.owner` holding fencing token `lease.token` to
    /// `term.now_ms + term.lease_ms` and stores `lease.last_seq` when given. Errors:
    /// [`LeaseError::Lost`] when the owner or token differ or the lease expired at
    /// `term.now_ms`; [`LeaseError::NotFound`].
    fn renew(&self, term: LeaseTerm<'_>, lease: Renewal<'_>) -> impl Future<Output = Result<(), LeaseError>> + Send;

    /// Renews many leases of one `term` (owner, `now_ms`, `lease_ms`): for each of `leases`, what
    /// [`LeaseStore::renew`] does, by the same rules, in as few requests as the backend
    /// allows (memory: one critical section; Redis: one script call per 500 leases; DynamoDB:
    /// one `TransactWriteItems` per 100). Returns one result per lease, in order: `Ok(())`,
    /// [`LeaseError::Lost`] (with what the store now holds), [`LeaseError::NotFound`], or
    /// [`LeaseError::Store`] for the leases of a request that failed while others went
    /// through. The whole call fails with [`LeaseError::Invalid`] (nothing sent) when an
    /// argument is malformed or an id appears twice, and with [`LeaseError::Store`] when the
    /// store failed before any lease was renewed.
    fn renew_many(
        &self,
        term: LeaseTerm<'_>,
        leases: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<Result<(), LeaseError>>, LeaseError>> + Send;

    /// Gives the lease up: `lease_expires_at_ms = 0`, `last_seq` stored when given (kept
    /// otherwise), and the id sent to every [`LeaseStore::released`] subscriber. Allowed past
    /// expiry as long as nobody acquired since (same token). Errors: [`LeaseError::Lost`],
    /// [`LeaseError::NotFound`].
    fn release(
        &self,
        id: &str,
        owner: &str,
        token: u64,
        last_seq: Option<&str>,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;

    /// The feeds `ids`, in order (`None` where missing), read in one round trip: the
    /// reconcile's read.
    fn get_many(&self, ids: &[String]) -> impl Future<Output = Result<Vec<Option<Feed>>, LeaseError>> + Send;

    /// Every feed, in no particular order.
    fn list(&self) -> impl Future<Output = Result<Vec<Feed>, LeaseError>> + Send;

    /// A stream of released feed ids (any node's releases, for a shared store), from the
    /// moment this returns. Delivery is best effort (Redis pub/sub: at most once); the
    /// periodic reconcile covers a missed one. The stream ends (`recv` gives `None`) if the
    /// store's notification connection is lost; call again to resubscribe.
    fn released(&self) -> impl Future<Output = Result<UnboundedReceiver<String>, LeaseError>> + Send;

    /// This store's request counters: every round trip it made, per method
    /// ([`StoreRequests`]); shown as `tether_feed_store_requests_total` by the feed runtime.
    fn requests(&self) -> &Arc<StoreRequests>;
}
