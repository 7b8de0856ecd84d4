//! [`MemoryLeaseStore`]: feeds and leases in this process only (`[feeds] store = "memory"`,
//! one node, development). A std mutex guards the map: every critical section is a few
//! field reads and writes with no `.await` inside, so a tokio mutex would add nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::metrics::{StoreOp, StoreRequests};
use super::record::{validate_id, Feed, FeedDef, Lease};
use super::store::{check_lease_args, check_renewals, LeaseError, LeaseStore, Renewal};

/// A lease store in this process's memory. Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct MemoryLeaseStore {
    inner: Mutex<Inner>,
    /// One request per call: the store has no server, a call is its round trip.
    requests: Arc<StoreRequests>,
}

#[derive(Default)]
struct Inner {
    feeds: HashMap<String, Feed>,
    /// Subscribers of [`LeaseStore::released`]; closed ones are dropped on the next release.
    released: Vec<UnboundedSender<String>>,
}

impl MemoryLeaseStore {
    /// An empty store.
    pub fn new() -> MemoryLeaseStore {
        MemoryLeaseStore::default()
    }

    /// Counts the call, then locks the map.
    fn lock_for(&self, op: StoreOp) -> std::sync::MutexGuard<'_, Inner> {
        self.requests.add(op, 1);
        self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a feed half-written (each section
        // assigns whole values), so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn lost(lease: &Lease) -> LeaseError {
    LeaseError::Lost {
        owner: lease.lease_owner.clone(),
        fencing_token: lease.fencing_token,
        expires_at_ms: lease.lease_expires_at_ms,
    }
}

fn holder_matches(lease: &Lease, owner: &str, token: u64) -> bool {
    lease.lease_owner.as_deref() == Some(owner) && lease.fencing_token == token
}

/// `renew`'s rule on one feed of the map (`None`: no such feed).
fn renew_in(
    feed: Option<&mut Feed>,
    owner: &str,
    token: u64,
    now_ms: u64,
    lease_ms: u64,
    last_seq: Option<&str>,
) -> Result<(), LeaseError> {
    let lease = &mut feed.ok_or(LeaseError::NotFound)?.lease;
    if !holder_matches(lease, owner, token) || !lease.is_held(now_ms) {
        return Err(lost(lease));
    }
    lease.lease_expires_at_ms = now_ms.saturating_add(lease_ms);
    if let Some(s) = last_seq {
        lease.last_seq = Some(s.to_owned());
    }
    Ok(())
}

impl LeaseStore for MemoryLeaseStore {
    async fn put(&self, def: &FeedDef) -> Result<bool, LeaseError> {
        def.validate()?;
        let mut g = self.lock_for(StoreOp::Put);
        match g.feeds.get_mut(&def.id) {
            Some(f) => {
                f.def = def.clone();
                Ok(false)
            }
            None => {
                g.feeds.insert(def.id.clone(), Feed { def: def.clone(), lease: Lease::default() });
                Ok(true)
            }
        }
    }

    async fn get(&self, id: &str) -> Result<Option<Feed>, LeaseError> {
        validate_id(id)?;
        Ok(self.lock_for(StoreOp::Get).feeds.get(id).cloned())
    }

    async fn delete(&self, id: &str) -> Result<bool, LeaseError> {
        validate_id(id)?;
        Ok(self.lock_for(StoreOp::Delete).feeds.remove(id).is_some())
    }

    async fn acquire(&self, id: &str, owner: &str, now_ms: u64, lease_ms: u64) -> Result<u64, LeaseError> {
        check_lease_args(id, owner, Some(lease_ms), None)?;
        let mut g = self.lock_for(StoreOp::Acquire);
        let lease = &mut g.feeds.get_mut(id).ok_or(LeaseError::NotFound)?.lease;
        if lease.is_held(now_ms) {
            return Err(LeaseError::Held {
                owner: lease.lease_owner.clone().unwrap_or_default(),
                expires_at_ms: lease.lease_expires_at_ms,
            });
        }
        lease.fencing_token += 1;
        lease.lease_owner = Some(owner.to_owned());
        lease.lease_expires_at_ms = now_ms.saturating_add(lease_ms);
        Ok(lease.fencing_token)
    }

    async fn renew(
        &self,
        id: &str,
        owner: &str,
        token: u64,
        now_ms: u64,
        lease_ms: u64,
        last_seq: Option<&str>,
    ) -> Result<(), LeaseError> {
        check_lease_args(id, owner, Some(lease_ms), last_seq)?;
        let mut g = self.lock_for(StoreOp::Renew);
        renew_in(g.feeds.get_mut(id), owner, token, now_ms, lease_ms, last_seq)
    }

    async fn renew_many(
        &self,
        owner: &str,
        now_ms: u64,
        lease_ms: u64,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
        check_renewals(owner, lease_ms, leases)?;
        let mut g = self.lock_for(StoreOp::RenewMany);
        Ok(leases
            .iter()
            .map(|r| renew_in(g.feeds.get_mut(r.id), owner, r.token, now_ms, lease_ms, r.last_seq))
            .collect())
    }

    async fn release(&self, id: &str, owner: &str, token: u64, last_seq: Option<&str>) -> Result<(), LeaseError> {
        check_lease_args(id, owner, None, last_seq)?;
        let mut g = self.lock_for(StoreOp::Release);
        let lease = &mut g.feeds.get_mut(id).ok_or(LeaseError::NotFound)?.lease;
        if !holder_matches(lease, owner, token) {
            return Err(lost(lease));
        }
        lease.lease_expires_at_ms = 0;
        if let Some(s) = last_seq {
            lease.last_seq = Some(s.to_owned());
        }
        g.released.retain(|tx| tx.send(id.to_owned()).is_ok());
        Ok(())
    }

    async fn get_many(&self, ids: &[String]) -> Result<Vec<Option<Feed>>, LeaseError> {
        for id in ids {
            validate_id(id)?;
        }
        let g = self.lock_for(StoreOp::GetMany);
        Ok(ids.iter().map(|id| g.feeds.get(id).cloned()).collect())
    }

    async fn list(&self) -> Result<Vec<Feed>, LeaseError> {
        Ok(self.lock_for(StoreOp::List).feeds.values().cloned().collect())
    }

    async fn released(&self) -> Result<UnboundedReceiver<String>, LeaseError> {
        let (tx, rx) = unbounded_channel();
        self.lock_for(StoreOp::Released).released.push(tx);
        Ok(rx)
    }

    fn requests(&self) -> &Arc<StoreRequests> {
        &self.requests
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

    /// A simulated clock: the tests step it explicitly.
    struct Clock(u64);

    #[tokio::test]
    async fn lease_lifecycle_on_a_simulated_clock() {
        let s = MemoryLeaseStore::new();
        let mut clock = Clock(1_000_000);
        assert!(s.put(&def("a")).await.unwrap());
        assert_eq!(s.acquire("a", "n1", clock.0, 1_000).await, Ok(1));
        assert!(matches!(s.acquire("a", "n2", clock.0 + 999, 1_000).await, Err(LeaseError::Held { .. })));
        clock.0 += 500;
        s.renew("a", "n1", 1, clock.0, 1_000, Some("7")).await.unwrap();
        // The renew moved the expiry to clock + 1,000: still held just before it.
        assert!(matches!(s.acquire("a", "n2", clock.0 + 999, 1_000).await, Err(LeaseError::Held { .. })));
        clock.0 += 1_000; // exactly at expiry: free
        assert_eq!(s.acquire("a", "n2", clock.0, 1_000).await, Ok(2));
        assert!(matches!(s.renew("a", "n1", 1, clock.0, 1_000, None).await, Err(LeaseError::Lost { .. })));
        assert!(matches!(s.release("a", "n1", 1, Some("9")).await, Err(LeaseError::Lost { .. })));
        // The holder's own renew fails once its lease has expired, even with nobody else in.
        clock.0 += 5_000;
        let e = s.renew("a", "n2", 2, clock.0, 1_000, None).await.unwrap_err();
        assert!(matches!(e, LeaseError::Lost { fencing_token: 2, .. }), "{e:?}");
        let f = s.get("a").await.unwrap().unwrap();
        assert_eq!(f.lease.last_seq.as_deref(), Some("7"));
        assert_eq!(f.lease.lease_owner.as_deref(), Some("n2"));
    }

    #[tokio::test]
    async fn bad_arguments_are_refused_with_the_field() {
        let s = MemoryLeaseStore::new();
        s.put(&def("a")).await.unwrap();
        let field = |e: LeaseError| match e {
            LeaseError::Invalid(f) => f.field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(s.acquire("a", "", 0, 1_000).await.unwrap_err()), "lease_owner");
        assert_eq!(field(s.acquire("a", "n", 0, 0).await.unwrap_err()), "lease_ms");
        assert_eq!(field(s.acquire("a:b", "n", 0, 10).await.unwrap_err()), "id");
        assert_eq!(field(s.renew("a", "n", 1, 0, 10, Some("")).await.unwrap_err()), "last_seq");
        assert_eq!(s.acquire("zz", "n", 0, 10).await, Err(LeaseError::NotFound));
    }
}
