//! The per-core table of interned grants: one copy of each distinct [`Grant`] however many
//! connections hold it, addressed by a `u32` the session keeps, reference-counted so a grant
//! leaves the table with its last connection.
//!
//! Cores share nothing, so each core has its own table (a grant held on two cores is stored
//! twice, not once per connection). 100,000 connections of one user with the same token
//! claims cost one entry plus 8 bytes each in their sessions.

use std::collections::HashMap;
use std::rc::Rc;

use slab::Slab;

use super::Grant;

struct Entry {
    grant: Rc<Grant>,
    refs: u32,
}

/// Interned grants of one core. Not `Send`: it lives on its core's thread.
#[derive(Default)]
pub struct Grants {
    entries: Slab<Entry>,
    /// Grant → its index in `entries`; the key shares the entry's allocation.
    index: HashMap<Rc<Grant>, u32>,
}

impl Grants {
    /// Takes one reference to `grant`: the index of its entry, created if it is new.
    pub fn acquire(&mut self, grant: Grant) -> u32 {
        if let Some(&i) = self.index.get(&grant) {
            self.entries[i as usize].refs += 1;
            return i;
        }
        let grant = Rc::new(grant);
        let i = self.entries.insert(Entry { grant: grant.clone(), refs: 1 }) as u32;
        self.index.insert(grant, i);
        i
    }

    /// The grant at `i`, while someone holds a reference.
    pub fn get(&self, i: u32) -> Option<&Grant> {
        self.entries.get(i as usize).map(|e| &*e.grant)
    }

    /// Drops one reference to entry `i`; the entry is freed with its last reference. An index
    /// not in the table is ignored.
    pub fn release(&mut self, i: u32) {
        let Some(e) = self.entries.get_mut(i as usize) else { return };
        e.refs -= 1;
        if e.refs == 0 {
            let e = self.entries.remove(i as usize);
            self.index.remove(&*e.grant);
        }
    }

    /// The indices of the grants of `user` (the `sub` claim) held now: one per distinct set of
    /// claims, usually one. A walk of the table, which holds one entry per distinct grant,
    /// not per connection.
    pub fn of_user(&self, user: &str) -> Vec<u32> {
        self.entries.iter().filter(|(_, e)| &*e.grant.user == user).map(|(i, _)| i as u32).collect()
    }

    /// Distinct grants held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no grant is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// References to entry `i` (0 when it is not in the table).
    pub fn refs(&self, i: u32) -> u32 {
        self.entries.get(i as usize).map_or(0, |e| e.refs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(user: &str, sub: &[&str]) -> Grant {
        Grant {
            user: user.into(),
            subscribe: sub.iter().map(|s| (*s).into()).collect(),
            publish: vec!["chat.1".into()].into(),
            info: None,
        }
    }

    #[test]
    fn same_claims_share_one_entry_freed_with_the_last_holder() {
        let mut t = Grants::default();
        let n = 100_000;
        let ids: Vec<u32> = (0..n).map(|_| t.acquire(grant("alice", &["news.*"]))).collect();
        assert_eq!(t.len(), 1, "one entry for {n} connections with the same claims");
        assert!(ids.iter().all(|&i| i == ids[0]));
        assert_eq!(t.refs(ids[0]), n as u32);
        assert!(t.get(ids[0]).is_some_and(|g| g.may_subscribe("news.a") && !g.may_subscribe("admin.x")));

        let other = t.acquire(grant("bob", &["news.*"]));
        assert_ne!(other, ids[0]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.of_user("alice"), [ids[0]]);
        assert!(t.of_user("carol").is_empty());

        for &i in &ids[1..] {
            t.release(i);
        }
        assert_eq!(t.len(), 2, "alice's entry stays while one connection holds it");
        t.release(ids[0]);
        assert_eq!(t.len(), 1);
        assert_eq!(t.refs(ids[0]), 0);
        assert!(t.get(ids[0]).is_none());
        t.release(other);
        assert!(t.is_empty(), "distinct users coming and going leave nothing behind");
        assert!(t.index.is_empty());
        // A stale index is ignored.
        t.release(other);
    }

    #[test]
    fn a_freed_slot_is_reused_for_new_claims() {
        let mut t = Grants::default();
        for round in 0..1000 {
            let i = t.acquire(grant(&format!("user{round}"), &["a.*"]));
            assert_eq!(t.len(), 1);
            t.release(i);
        }
        assert!(t.is_empty());
        assert!(t.entries.capacity() <= 4, "churn does not grow the table");
    }
}
