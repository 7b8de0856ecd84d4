//! This core's side of the subscription index: for each channel with local subscribers, the
//! list of their connection ids.
//!
//! Removal writes a tombstone instead of moving entries, so a delivery that yielded halfway
//! through a list never skips or repeats anyone; the list is compacted later, between
//! deliveries, when tombstones outnumber the living.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use slab::Slab;

use super::conn::{ConnId, SubEntry};
use crate::config::Overflow;

/// One channel as seen by one core.
pub struct LocalChannel {
    /// Channel name.
    pub name: Arc<str>,
    /// Subscribers, with [`ConnId::DEAD`] tombstones.
    pub subs: Vec<ConnId>,
    /// Tombstones in `subs`.
    pub dead: u32,
    /// Subscriptions sent to the home core and not yet confirmed.
    pub pending: u32,
    /// Overflow policy from the first matching `[[channels]]` rule.
    pub overflow: Overflow,
    /// Whether that rule turns presence on.
    pub presence: bool,
    /// The connections of this core that asked for the channel's joins and leaves (`sub` with
    /// `join_leave`), from the request on (an entry whose subscription is not active yet gets
    /// nothing); `None` (8 bytes per channel) until one asks.
    pub join_leave: Option<Box<HashSet<ConnId>>>,
    /// The channel's epoch as this core last heard it from the home (a subscription's answer,
    /// a `reset`): the epoch of the deliveries that follow, which SSE event ids name
    /// (`id: CH:EPOCH:SEQ`). `None` until the first answer.
    pub epoch: Option<Arc<str>>,
}

impl LocalChannel {
    /// Living subscribers.
    pub fn live(&self) -> usize {
        self.subs.len() - self.dead as usize
    }
}

/// The local channel table.
#[derive(Default)]
pub struct LocalChannels {
    by_name: HashMap<Arc<str>, u32>,
    /// Channels by index (the index is what connections and queued frames refer to).
    pub chans: Slab<LocalChannel>,
}

impl LocalChannels {
    /// Index of `name`, if it has local subscribers or pending subscriptions.
    pub fn find(&self, name: &str) -> Option<u32> {
        self.by_name.get(name).copied()
    }

    /// Index of `name`, creating the entry with the overflow policy and presence switch of its
    /// rule (`rule()`) when absent.
    pub fn find_or_create(&mut self, name: &str, rule: impl FnOnce() -> (Overflow, bool)) -> u32 {
        if let Some(i) = self.find(name) {
            return i;
        }
        let name: Arc<str> = name.into();
        let (overflow, presence) = rule();
        let i = self.chans.insert(LocalChannel {
            name: name.clone(),
            subs: Vec::new(),
            dead: 0,
            pending: 0,
            overflow,
            presence,
            join_leave: None,
            epoch: None,
        }) as u32;
        self.by_name.insert(name, i);
        i
    }

    /// Records that connection `id` asked for the joins and leaves of `chan`.
    pub fn want_join_leave(&mut self, chan: u32, id: ConnId) {
        if let Some(c) = self.chans.get_mut(chan as usize) {
            c.join_leave.get_or_insert_with(Default::default).insert(id);
        }
    }

    /// Forgets that connection `id` asked for the joins and leaves of `chan` (its
    /// subscription ended or was refused).
    pub fn forget_join_leave(&mut self, chan: u32, id: ConnId) {
        let Some(c) = self.chans.get_mut(chan as usize) else { return };
        if let Some(set) = &mut c.join_leave {
            set.remove(&id);
            if set.is_empty() {
                c.join_leave = None;
            }
        }
    }

    /// Appends `id` to channel `chan`; returns its position.
    pub fn add(&mut self, chan: u32, id: ConnId) -> u32 {
        let c = &mut self.chans[chan as usize];
        c.subs.push(id);
        (c.subs.len() - 1) as u32
    }

    /// Tombstones the subscriber at `pos` of `chan`.
    pub fn remove(&mut self, chan: u32, pos: u32) {
        if let Some(c) = self.chans.get_mut(chan as usize) {
            if let Some(slot) = c.subs.get_mut(pos as usize) {
                if *slot != ConnId::DEAD {
                    *slot = ConnId::DEAD;
                    c.dead += 1;
                }
            }
        }
    }

    /// Compacts `chan` if tombstones dominate, or drops it when nothing refers to it any more.
    /// Must not run while a delivery is walking this channel. `relocate(id, chan, new_pos)` is
    /// called for every subscriber that moved, so its [`SubEntry`] can follow.
    pub fn tidy(&mut self, chan: u32, mut relocate: impl FnMut(ConnId, u32, u32)) {
        let Some(c) = self.chans.get_mut(chan as usize) else { return };
        if c.live() == 0 && c.pending == 0 {
            let c = self.chans.remove(chan as usize);
            self.by_name.remove(&c.name);
            return;
        }
        if c.dead >= 16 && c.dead as usize * 2 > c.subs.len() {
            c.subs.retain(|id| *id != ConnId::DEAD);
            c.dead = 0;
            for (pos, id) in c.subs.iter().enumerate() {
                relocate(*id, chan, pos as u32);
            }
            if c.subs.capacity() > 4 * c.subs.len().max(4) {
                c.subs.shrink_to_fit();
            }
        }
    }
}

impl LocalChannels {
    /// Gives back the spare capacity of the channel table when it is mostly spare
    /// ([`super::reclaim::spare`]): the map is rehashed, the slab loses its vacant tail (no
    /// channel index moves). Returns whether it shrank.
    pub fn shrink_if_spare(&mut self) -> bool {
        let map = super::reclaim::spare(self.by_name.len(), self.by_name.capacity());
        let slab = super::reclaim::spare(self.chans.len(), self.chans.capacity());
        if map {
            self.by_name.shrink_to_fit();
        }
        if slab {
            self.chans.shrink_to_fit();
        }
        map || slab
    }
}

/// Points the subscription of `subs` on `chan` at `pos`.
pub fn relocate_entry(subs: &mut [SubEntry], chan: u32, pos: u32) {
    if let Some(e) = subs.iter_mut().find(|e| e.chan == chan && e.is_active()) {
        e.pos = pos;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_keep_positions_and_tidy_compacts() {
        let mut t = LocalChannels::default();
        let c = t.find_or_create("a", || (Overflow::Disconnect, false));
        let ids: Vec<ConnId> = (0..40).map(|k| ConnId { key: k, gen: 1 }).collect();
        for id in &ids {
            t.add(c, *id);
        }
        for pos in 0..30 {
            t.remove(c, pos);
        }
        assert_eq!(t.chans[c as usize].subs[35], ids[35]);
        let mut moved = Vec::new();
        t.tidy(c, |id, _, pos| moved.push((id, pos)));
        assert_eq!(t.chans[c as usize].live(), 10);
        assert_eq!(moved[0], (ids[30], 0));
        for pos in 0..10 {
            t.remove(c, pos);
        }
        t.tidy(c, |_, _, _| {});
        assert!(t.find("a").is_none());
    }

    #[test]
    fn pending_keeps_channel_alive() {
        let mut t = LocalChannels::default();
        let c = t.find_or_create("a", || (Overflow::Conflate, false));
        t.chans[c as usize].pending = 1;
        t.tidy(c, |_, _, _| {});
        assert_eq!(t.find("a"), Some(c));
    }
}
