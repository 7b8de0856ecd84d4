//! [`MemoryLeaseStore`]: feeds and leases in this process only (`[feeds] store = "memory"`,
//! one node, development). A std mutex guards the map: every critical section is a few
//! field reads and writes with no `.await` inside, so a tokio mutex would add nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::{LeaseError, LeaseStore, LeaseTerm, Renewal};
use crate::feeds::metrics::{StoreOp, StoreRequests};
use crate::feeds::record::{Feed, FeedDef, Lease};

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
fn renew_in(feed: Option<&mut Feed>, term: LeaseTerm<'_>, r: Renewal<'_>) -> Result<(), LeaseError> {
    let lease = &mut feed.ok_or(LeaseError::NotFound)?.lease;
    if !holder_matches(lease, term.owner, r.token) || !lease.is_held(term.now_ms) {
        return Err(lost(lease));
    }
    lease.lease_expires_at_ms = term.now_ms.saturating_add(term.lease_ms);
    if let Some(s) = r.last_seq {
        lease.last_seq = Some(s.to_owned());
    }
    Ok(())
}

impl LeaseStore for MemoryLeaseStore {
    async fn put(&self, def: &FeedDef) -> Result<bool, LeaseError> {
        debug_assert!(def.validate().is_ok(), "checked by the front door");
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
        Ok(self.lock_for(StoreOp::Get).feeds.get(id).cloned())
    }

    async fn delete(&self, id: &str) -> Result<bool, LeaseError> {
        Ok(self.lock_for(StoreOp::Delete).feeds.remove(id).is_some())
    }

    async fn acquire(&self, id: &str, term: LeaseTerm<'_>) -> Result<u64, LeaseError> {
        let LeaseTerm { owner, now_ms, lease_ms } = term;
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

    async fn renew(&self, term: LeaseTerm<'_>, lease: Renewal<'_>) -> Result<(), LeaseError> {
        let mut g = self.lock_for(StoreOp::Renew);
        renew_in(g.feeds.get_mut(lease.id), term, lease)
    }

    async fn renew_many(
        &self,
        term: LeaseTerm<'_>,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
        let mut g = self.lock_for(StoreOp::RenewMany);
        Ok(leases.iter().map(|r| renew_in(g.feeds.get_mut(r.id), term, *r)).collect())
    }

    async fn release(&self, id: &str, owner: &str, token: u64, last_seq: Option<&str>) -> Result<(), LeaseError> {
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

    /// A lease of 1,000 ms for `owner` at `now_ms`.
    fn term(owner: &str, now_ms: u64) -> LeaseTerm<'_> {
        LeaseTerm { owner, now_ms, lease_ms: 1_000 }
    }

    /// A simulated clock: the tests step it explicitly.
    struct Clock(u64);

    #[tokio::test]
    async fn lease_lifecycle_on_a_simulated_clock() {
        let s = MemoryLeaseStore::new();
        let mut clock = Clock(1_000_000);
        assert!(s.put(&def("a")).await.unwrap());
        assert_eq!(s.acquire("a", term("n1", clock.0)).await, Ok(1));
        assert!(matches!(s.acquire("a", term("n2", clock.0 + 999)).await, Err(LeaseError::Held { .. })));
        clock.0 += 500;
        s.renew(term("n1", clock.0), Renewal { id: "a", token: 1, last_seq: Some("7") }).await.unwrap();
        // The renew moved the expiry to clock + 1,000: still held just before it.
        assert!(matches!(s.acquire("a", term("n2", clock.0 + 999)).await, Err(LeaseError::Held { .. })));
        clock.0 += 1_000; // exactly at expiry: free
        assert_eq!(s.acquire("a", term("n2", clock.0)).await, Ok(2));
        assert!(matches!(
            s.renew(term("n1", clock.0), Renewal { id: "a", token: 1, last_seq: None }).await,
            Err(LeaseError::Lost { .. })
        ));
        assert!(matches!(s.release("a", "n1", 1, Some("9")).await, Err(LeaseError::Lost { .. })));
        // The holder's own renew fails once its lease has expired, even with nobody else in.
        clock.0 += 5_000;
        let e = s.renew(term("n2", clock.0), Renewal { id: "a", token: 2, last_seq: None }).await.unwrap_err();
        assert!(matches!(e, LeaseError::Lost { fencing_token: 2, .. }), "{e:?}");
        let f = s.get("a").await.unwrap().unwrap();
        assert_eq!(f.lease.last_seq.as_deref(), Some("7"));
        assert_eq!(f.lease.lease_owner.as_deref(), Some("n2"));
    }
}
