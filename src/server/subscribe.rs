//! Subscriptions as a subscriber's core sees them: `sub`/`unsub` from clients, the home
//! core's confirmation, and the local subscriber lists kept in step.

use std::sync::Arc;

use super::bus::{ConnRef, CoreMsg, Resume};
use super::conn_state::*;
use super::core::CoreState;
use super::local::relocate_entry;
use crate::protocol;
use crate::ws::codec;

impl CoreState {
    /// A client `sub`: records a pending subscription and asks the channel's home core.
    pub fn client_sub(&mut self, id: ConnId, ch: &str, from: Option<u64>, epoch: Option<String>) {
        let cfg = &self.shared.config;
        let chan = self.local.find_or_create(ch, || cfg.channel_rule(ch).overflow);
        let Some(c) = self.conn(id) else { return };
        if c.subs.iter().any(|e| e.chan == chan && e.pos != CANCELLED) {
            let f = codec::encode_frame(0x1, &protocol::error_json("already_subscribed", &format!("already subscribed to {ch}"), None));
            self.reply(id, f);
            return;
        }
        c.subs.push(SubEntry { chan, pos: PENDING });
        let lc = &mut self.local.chans[chan as usize];
        lc.pending += 1;
        let name = lc.name.clone();
        let msg = CoreMsg::Subscribe { ch: name, conn: ConnRef { core: self.me as u16, id }, from, epoch: epoch.map(Into::into) };
        let home = self.home(ch);
        self.route(home, msg);
    }

    /// A client `unsub`.
    pub fn client_unsub(&mut self, id: ConnId, ch: &str) {
        let chan = self.local.find(ch);
        let entry = chan.and_then(|chan| {
            let c = self.conn(id)?;
            let i = c.subs.iter().position(|e| e.chan == chan && e.pos != CANCELLED)?;
            if let Some(rs) = c.replays.as_mut() {
                rs.retain(|r| r.chan != chan);
            }
            if c.subs[i].pos == PENDING {
                // Its reply is on the way: keep the entry, in order, to absorb it.
                c.subs[i].pos = CANCELLED;
                return Some(None);
            }
            Some(Some(c.subs.remove(i)))
        });
        match entry {
            Some(Some(e)) => self.drop_sub(e),
            Some(None) => {}
            None => {
                let f = codec::encode_frame(0x1, &protocol::error_json("not_subscribed", &format!("not subscribed to {ch}"), None));
                self.reply(id, f);
            }
        }
    }

    /// Ends one subscription entry (already removed from its connection).
    pub(crate) fn drop_sub(&mut self, e: SubEntry) {
        let Some(lc) = self.local.chans.get_mut(e.chan as usize) else { return };
        if !e.is_active() {
            // The Subscribed reply will find no entry and release the home's interest.
            lc.pending -= 1;
        } else {
            let name = lc.name.clone();
            self.local.remove(e.chan, e.pos);
            let home = self.home(&name);
            self.route(home, CoreMsg::Unsubscribe { ch: name, core: self.me as u16 });
        }
        self.tidy(e.chan);
    }

    /// Compacts or drops a local channel unless a delivery is walking it.
    pub fn tidy(&mut self, chan: u32) {
        if self.active_chan == Some(chan) {
            return;
        }
        let conns = &mut self.conns;
        self.local.tidy(chan, |id, chan, pos| {
            if let Some(c) = conns.get_mut(id.key as usize).filter(|c| c.gen == id.gen) {
                relocate_entry(&mut c.subs, chan, pos);
            }
        });
    }

    /// The home core confirmed a subscription: activate it and tell the client.
    pub(crate) fn subscribed(&mut self, ch: &Arc<str>, id: ConnId, head: u64, epoch: &str, resume: Resume) {
        let chan = self.local.find(ch);
        // Replies from one home core come back in request order, so this one answers the
        // oldest request still waiting for this channel (pending or cancelled).
        let entry = chan.and_then(|chan| {
            let c = self.conns.get_mut(id.key as usize).filter(|c| c.gen == id.gen)?;
            c.subs.iter().position(|e| e.chan == chan && !e.is_active())
        });
        let (Some(chan), Some(i)) = (chan, entry) else {
            // The connection left meanwhile: release the home's interest.
            let home = self.home(ch);
            self.route(home, CoreMsg::Unsubscribe { ch: ch.clone(), core: self.me as u16 });
            return;
        };
        let cancelled = self.conn(id).is_some_and(|c| c.subs[i].pos == CANCELLED);
        if cancelled || matches!(resume, Resume::Ahead) {
            self.local.chans[chan as usize].pending -= 1;
            if let Some(c) = self.conn(id) {
                c.subs.remove(i);
            }
            let home = self.home(ch);
            self.route(home, CoreMsg::Unsubscribe { ch: ch.clone(), core: self.me as u16 });
            if cancelled {
                self.tidy(chan);
                return;
            }
            let f = protocol::error_json("bad_request", &format!("from is beyond the head of {ch} ({head})"), None);
            self.reply(id, codec::encode_frame(0x1, &f));
            self.tidy(chan);
            return;
        }
        let lc = &mut self.local.chans[chan as usize];
        lc.pending -= 1;
        let pos = self.local.add(chan, id);
        if let Some(c) = self.conn(id) {
            c.subs[i].pos = pos;
        }
        let first = match &resume {
            Resume::Live => protocol::subscribed_json(ch, head, epoch, None),
            Resume::Recovered { .. } => protocol::subscribed_json(ch, head, epoch, Some(true)),
            Resume::Reset { reason, oldest } => protocol::reset_json(ch, head, epoch, *reason, *oldest),
            Resume::Ahead => unreachable!("handled above"),
        };
        self.enqueue(id, codec::encode_frame(0x1, &first), NO_CHAN, None);
        if let Resume::Recovered { from, frames, until } = resume {
            self.start_replay(id, chan, ch.clone(), epoch.into(), from, frames, until);
        }
        self.flush(id);
    }
}
