//! Subscriptions as a subscriber's core sees them: `sub`/`unsub` from clients, the broker's
//! confirmation, and the local subscriber lists kept in step.

use std::sync::Arc;

use super::broker::Request;
use super::broker::Resume;
use super::bus::ConnRef;
use super::conn::{ConnId, SubEntry, CANCELLED, PENDING};
use super::core::CoreState;
use super::local::relocate_entry;
use crate::protocol::{self, codes, ResetReason};
use crate::session::{Limit, NO_CHAN};
use crate::ws::codec;

impl CoreState {
    /// A client `sub`: records a pending subscription and asks the broker. Beyond
    /// `limits.per_connection.max_subscriptions` (counting pending ones, not those cancelled
    /// while pending) it is answered with `error` `limit` naming the channel instead.
    ///
    /// On a presence channel the connection joins its presence once the home registers the
    /// subscription; with `join_leave` (which the channel's rule must allow) it also receives
    /// the channel's `presence_diff` / `presence_reset` frames.
    pub fn client_sub(&mut self, id: ConnId, ch: &str, from: Option<u64>, epoch: Option<String>, join_leave: bool) {
        let max = self.shared.config.limits.per_connection.max_subscriptions;
        let Some(s) = self.conns.get(id) else { return };
        if s.subs.len() >= max && s.subs.iter().filter(|e| e.pos != CANCELLED).count() >= max {
            let chan = self.local.find(ch);
            if !s.subs.iter().any(|e| Some(e.chan) == chan && e.pos != CANCELLED) {
                self.metrics().session.limit_refused(Limit::MaxSubscriptions);
                let reason = format!("max_subscriptions ({max}) reached: unsub from a channel first");
                let e = protocol::with_channel(protocol::error_json(codes::LIMIT, &reason, None), ch);
                return self.reply(id, codec::text_frame(&e));
            }
        }
        let shared = self.shared.clone();
        let rule = shared.config.channel_rule(ch);
        if join_leave && !rule.join_leave {
            let reason = format!("join_leave is off for {ch} (its [[channels]] rule has no join_leave = true)");
            let e = protocol::with_channel(protocol::error_json(codes::PRESENCE_OFF, &reason, None), ch);
            return self.reply(id, codec::text_frame(&e));
        }
        let chan = self.local.find_or_create(ch, || (rule.overflow, rule.presence));
        let Some(s) = self.conn(id) else { return };
        if s.subs.iter().any(|e| e.chan == chan && e.pos != CANCELLED) {
            let e = protocol::error_json(codes::ALREADY_SUBSCRIBED, &format!("already subscribed to {ch}"), None);
            return self.reply(id, codec::text_frame(&protocol::with_channel(e, ch)));
        }
        s.subs.push(SubEntry { chan, pos: PENDING });
        if join_leave {
            self.local.want_join_leave(chan, id);
        }
        let member = rule.presence.then(|| Box::new(self.member_of(id)));
        let lc = &mut self.local.chans[chan as usize];
        lc.pending += 1;
        let ch = lc.name.clone();
        let conn = ConnRef { core: self.me as u16, id };
        let epoch = epoch.map(Into::into);
        self.broker.request(&mut self.router, Request::Subscribe { ch, conn, from, epoch, member });
    }

    /// A client `unsub`: answered `unsubscribed`, or `error` `not_subscribed`, naming `ch`.
    /// (A `sub` of `ch` still waiting for its answer holds the `unsub` behind it:
    /// `server::requests`.)
    pub fn client_unsub(&mut self, id: ConnId, ch: &str) {
        let e = if self.end_subscription(id, ch) {
            protocol::unsubscribed_json(ch)
        } else {
            let e = protocol::error_json(codes::NOT_SUBSCRIBED, &format!("not subscribed to {ch}"), None);
            protocol::with_channel(e, ch)
        };
        self.reply(id, codec::text_frame(&e));
    }

    /// Ends `id`'s subscription to `ch` without an answer (a `refresh` whose grant no longer
    /// allows it says why itself); one still waiting for the broker is marked cancelled, and
    /// its answer absorbed. Returns whether there was one.
    pub(crate) fn end_subscription(&mut self, id: ConnId, ch: &str) -> bool {
        let chan = self.local.find(ch);
        let entry = chan.and_then(|chan| {
            let c = self.conns.get(id)?;
            let i = c.subs.iter().position(|e| e.chan == chan && e.pos != CANCELLED)?;
            c.session.cancel_replay(chan);
            if c.subs[i].pos == PENDING {
                // Its answer is on the way: keep the entry, in order, to absorb it.
                c.subs[i].pos = CANCELLED;
                return Some(None);
            }
            // Its frames still queued go out, but the channel's index may go to another
            // channel, whose overflow policy must not take them for its own.
            c.session.release_channel(chan);
            Some(Some(c.subs.remove(i)))
        });
        match entry {
            Some(Some(e)) => self.drop_sub(id, e),
            Some(None) => {}
            None => return false,
        }
        true
    }

    /// Ends one subscription entry of connection `id` (already removed from it).
    pub(crate) fn drop_sub(&mut self, id: ConnId, e: SubEntry) {
        self.local.forget_join_leave(e.chan, id);
        let Some(lc) = self.local.chans.get_mut(e.chan as usize) else { return };
        if !e.is_active() {
            // The Subscribed answer will find no entry and release the home's interest.
            lc.pending -= 1;
        } else {
            let ch = lc.name.clone();
            self.local.remove(e.chan, e.pos);
            self.unsubscribe_at_home(ch, id);
        }
        self.tidy(e.chan);
    }

    /// Releases one subscription of connection `id` at the home of `ch` (and, on a presence
    /// channel, its membership there).
    fn unsubscribe_at_home(&mut self, ch: Arc<str>, id: ConnId) {
        let member = self.shared.config.channel_rule(&ch).presence.then_some(id);
        self.broker.request(&mut self.router, Request::Unsubscribe { ch, core: self.me as u16, member });
    }

    /// Compacts or drops a local channel unless a delivery is walking it.
    pub fn tidy(&mut self, chan: u32) {
        if self.active_chan == Some(chan) {
            return;
        }
        let slab = &mut self.conns.slab;
        self.local.tidy(chan, |id, chan, pos| {
            if let Some(c) = super::core::conn(slab, id) {
                relocate_entry(&mut c.subs, chan, pos);
            }
        });
    }

    /// The broker answered a subscription: activate it (or not) and tell the client; then the
    /// requests `id` sent about `ch` behind it are served (`server::requests`).
    pub(crate) fn subscribed(&mut self, ch: &Arc<str>, id: ConnId, head: u64, epoch: &str, resume: Resume) {
        self.answer_subscription(ch, id, head, epoch, resume);
        self.serve_held(id, Some(ch.as_ref()));
    }

    fn answer_subscription(&mut self, ch: &Arc<str>, id: ConnId, head: u64, epoch: &str, resume: Resume) {
        let chan = self.local.find(ch);
        // Answers from one home come back in request order, so this one answers the oldest
        // request still waiting for this channel (pending or cancelled).
        let entry =
            chan.and_then(|chan| self.conns.get(id)?.subs.iter().position(|e| e.chan == chan && !e.is_active()));
        // A refusal registered nothing at the home: there is no interest to release.
        let registered = !matches!(resume, Resume::Refused(_));
        let (Some(chan), Some(i)) = (chan, entry) else {
            // The connection left meanwhile: release the home's interest.
            if registered {
                self.unsubscribe_at_home(ch.clone(), id);
            }
            return;
        };
        let cancelled = self.conn(id).is_some_and(|c| c.subs[i].pos == CANCELLED);
        if cancelled || matches!(resume, Resume::Ahead | Resume::Unavailable(_) | Resume::Refused(_)) {
            self.local.chans[chan as usize].pending -= 1;
            if let Some(c) = self.conn(id) {
                c.subs.remove(i);
            }
            self.local.forget_join_leave(chan, id);
            if registered {
                self.unsubscribe_at_home(ch.clone(), id);
            }
            self.tidy(chan);
            if !cancelled {
                let e = match resume {
                    Resume::Unavailable(e) | Resume::Refused(e) => protocol::with_channel(e.to_json(), ch),
                    _ => protocol::with_channel(
                        protocol::error_json(
                            codes::BAD_REQUEST,
                            &format!("from is beyond the head of {ch} ({head})"),
                            None,
                        ),
                        ch,
                    ),
                };
                self.reply(id, codec::text_frame(&e));
            }
            return;
        }
        let lc = &mut self.local.chans[chan as usize];
        lc.pending -= 1;
        if lc.epoch.as_deref() != Some(epoch) {
            lc.epoch = Some(epoch.into());
        }
        let pos = self.local.add(chan, id);
        let first = match &resume {
            Resume::Live => protocol::subscribed_json(ch, head, epoch, None),
            Resume::Recovered { .. } => protocol::subscribed_json(ch, head, epoch, Some(true)),
            Resume::Reset { reason, oldest } => protocol::reset_json(ch, head, epoch, *reason, *oldest),
            Resume::Ahead | Resume::Unavailable(_) | Resume::Refused(_) => unreachable!("handled above"),
        };
        if let Some(c) = self.conn(id) {
            c.subs[i].pos = pos;
        }
        let fetch = self.with_session(id, |s, ctx| {
            s.enqueue(ctx, codec::text_frame(&first), NO_CHAN, None);
            match resume {
                Resume::Recovered { from, frames, until } => {
                    s.start_replay(ctx, chan, ch.clone(), epoch.into(), from, frames, until)
                }
                _ => None,
            }
        });
        if let Some(Some(f)) = fetch {
            self.fetch(id, f);
        }
        self.flush(id);
    }

    /// The broker restarted the numbering of `ch` (or lost part of it): each local subscriber
    /// gets a `reset` (docs/protocol.md) and continues with the seqs after `head`, the ones up
    /// to `until` replayed from history at the pace of its queue (as a resume is). A resume
    /// replay in progress is abandoned: its history belongs to the old numbering.
    pub(crate) fn reset_subscribers(
        &mut self,
        ch: &Arc<str>,
        head: u64,
        epoch: &str,
        reason: ResetReason,
        oldest: u64,
        until: u64,
    ) {
        let Some(chan) = self.local.find(ch) else { return };
        let frame = codec::text_frame(&protocol::reset_json(ch, head, epoch, reason, oldest));
        let ids: Vec<ConnId> =
            self.local.chans[chan as usize].subs.iter().copied().filter(|id| *id != ConnId::DEAD).collect();
        let epoch: Arc<str> = epoch.into();
        self.local.chans[chan as usize].epoch = Some(epoch.clone());
        for id in ids {
            let fetch = self.with_session(id, |s, ctx| {
                s.cancel_replay(chan);
                s.enqueue(ctx, frame.clone(), NO_CHAN, None);
                if until > head {
                    s.start_replay(ctx, chan, ch.clone(), epoch.clone(), head, Vec::new(), until)
                } else {
                    None
                }
            });
            if let Some(Some(f)) = fetch {
                self.fetch(id, f);
            }
            self.flush(id);
        }
    }
}
