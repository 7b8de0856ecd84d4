//! The embedded broker: each channel lives at a home core of this process (a hash of its
//! name), which assigns its seqs, keeps its history and dedup ids, and fans each frame out to
//! the cores with subscribers. Requests travel to the home over the bus; the per-pair FIFO
//! order of the bus gives the [`Broker`] ordering contract.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::epoch::{Numbering, TOMBSTONES_PER_CORE};
use super::home::{home_of, Dedup, FenceCheck, Homes, MAX_FEEDS_PER_CHANNEL};
use super::presence::{member_key, parse_cursor, Announcement, Joined, Presences};
use super::{Broker, Outbox, PresenceQuery, PublishResult, Request, Resume};
use crate::protocol::presence::{presence_json, presence_stats_json};
use crate::protocol::{self, codes, RequestError};
use crate::server::bus::{ConnRef, CoreMsg};
use crate::server::Shared;
use crate::session::Limit;
use crate::tick::TICK_MS;

/// One core's part of the memory broker: the channels homed on this core, and their presence.
pub struct MemoryBroker {
    homes: Homes,
    presences: Presences,
    shared: Arc<Shared>,
}

impl MemoryBroker {
    /// One core's shard. Each core remembers `dedup.max_entries / cores` publish ids, and
    /// creates channels under the process epoch ([`Shared::epoch`]) until it rotates
    /// ([`super::epoch`]).
    pub fn new(shared: Arc<Shared>) -> MemoryBroker {
        let cfg = &shared.config;
        let dedup = Dedup::new(cfg.dedup.window_ms, (cfg.dedup.max_entries / shared.cores).max(1));
        let numbering = Numbering::new(shared.epoch.clone(), TOMBSTONES_PER_CORE);
        let homes = Homes::new(shared.cores, dedup, numbering, shared.channels.clone());
        MemoryBroker { homes, presences: Presences::default(), shared }
    }

    /// A presence change of `ch` at `now_ms` on core `core` (its home): opens its window when it is the first, and has
    /// the core's clock wake when the window closes.
    fn presence_change<R>(
        &mut self,
        core: usize,
        ch: &Arc<str>,
        now_ms: u64,
        change: impl FnOnce(&mut super::presence::ChannelPresence) -> R,
    ) -> R {
        let window_ms = self.shared.config.presence.window_ms;
        let (r, opened) = self.presences.change(ch, now_ms, window_ms, change);
        self.shared.metrics[core].presence_members.store(self.presences.members() as i64, Relaxed);
        if let Some(due_ms) = opened {
            crate::server::tick::due_at(due_ms.div_ceil(TICK_MS) as crate::tick::Tick);
        }
        r
    }

    /// Answers a presence query of `conn` about `ch`.
    fn presence_answer(&self, ch: &str, conn: ConnRef, query: PresenceQuery) -> CoreMsg {
        let p = self.presences.get(ch);
        let json = match query {
            PresenceQuery::Stats => {
                let (clients, users) = p.map_or((0, 0), |p| p.stats());
                presence_stats_json(ch, clients, users)
            }
            PresenceQuery::Members { cursor } => match cursor.as_deref().map(|c| parse_cursor(c, self.shared.cores)) {
                Some(None) => protocol::with_channel(
                    protocol::error_json(
                        codes::BAD_REQUEST,
                        "cursor: not a cursor this server gives (the next of a page: core-slot-generation)",
                        None,
                    ),
                    ch,
                ),
                after => {
                    let page_size = self.shared.config.presence.page_size;
                    match p {
                        Some(p) => {
                            let (members, next) =
                                p.page(after.flatten(), page_size, self.shared.config.presence_frame_max_bytes());
                            presence_json(ch, members, next.as_deref())
                        }
                        None => presence_json(ch, [], None),
                    }
                }
            },
        };
        CoreMsg::PresenceAnswer { conn: conn.id, ch: ch.into(), json }
    }
}

impl Broker for MemoryBroker {
    fn request(&mut self, out: &mut dyn Outbox, req: Request) {
        match req.channel() {
            Some(ch) => out.to_home(home_of(ch, self.shared.cores), req),
            // One process: there is no other node to tell.
            None => {
                if let Request::Control { reply, .. } = req {
                    out.to_core(reply.core as usize, CoreMsg::ControlSent { reply, result: Ok(0) });
                }
            }
        }
    }

    fn serve(&mut self, out: &mut dyn Outbox, now_ms: u64, req: Request) {
        let shared = self.shared.clone();
        let metrics = &shared.metrics[out.me()];
        match req {
            Request::Publish { ch, id, data, reply, fence } => {
                let cap = self.shared.config.channel_rule(&ch).history;
                let refusal = match fence.as_ref().map(|f| (f, self.homes.fence(&ch, f, cap))) {
                    None | Some((_, Some(FenceCheck::Accepted))) => None,
                    Some((_, None)) => {
                        metrics.session.limit_refused(Limit::MaxChannels);
                        Some(self.shared.channels.refusal())
                    }
                    Some((f, Some(FenceCheck::Fenced { highest }))) => {
                        metrics.feed_fenced.fetch_add(1, Relaxed);
                        Some(RequestError::fenced(&f.feed, f.token, highest))
                    }
                    Some((f, Some(FenceCheck::TooManyFeeds))) => Some(RequestError::limit(
                        format!(
                            "channel {ch} keeps fencing tokens of {MAX_FEEDS_PER_CHANNEL} feeds; not of {}",
                            f.feed
                        ),
                        None,
                    )),
                };
                if let Some(refusal) = refusal {
                    if let Some(r) = reply {
                        let result = PublishResult::Refused(Box::new(refusal));
                        out.to_core(r.core as usize, CoreMsg::Published { reply: r, ch, id, result });
                    }
                    return;
                }
                let Some((p, name)) = self.homes.publish(&ch, id.as_deref(), &data, cap, now_ms) else {
                    metrics.session.limit_refused(Limit::MaxChannels);
                    if let Some(r) = reply {
                        let result = PublishResult::Refused(Box::new(self.shared.channels.refusal()));
                        out.to_core(r.core as usize, CoreMsg::Published { reply: r, ch, id, result });
                    }
                    return;
                };
                match p.frame {
                    Some(frame) => {
                        metrics.published.fetch_add(1, Relaxed);
                        if let Some(c) = self.homes.get(&ch) {
                            for core in c.interested() {
                                out.to_core(
                                    core,
                                    CoreMsg::Deliver { ch: name.clone(), seq: p.seq, frame: frame.clone() },
                                );
                            }
                        }
                    }
                    None => {
                        metrics.publish_duplicates.fetch_add(1, Relaxed);
                    }
                }
                if let Some(r) = reply {
                    let result = PublishResult::Stored { seq: p.seq };
                    out.to_core(r.core as usize, CoreMsg::Published { reply: r, ch: name, id, result });
                }
            }
            Request::Subscribe { ch, conn, from, epoch, member } => {
                let rule = self.shared.config.channel_rule(&ch);
                let (cap, max_members) = (rule.history, rule.max_members());
                let msg = match self.homes.subscribe(&ch, conn.core as usize, from, epoch.as_deref(), cap) {
                    Some((name, head, epoch, resume)) => {
                        if let Some(m) = member {
                            let key = member_key(conn.core, conn.id);
                            if self.presence_change(out.me(), &name, now_ms, |p| p.join(key, *m, max_members))
                                == Joined::Untracked
                            {
                                metrics.presence_untracked.fetch_add(1, Relaxed);
                            }
                        }
                        CoreMsg::Subscribed { ch: name, conn: conn.id, head, epoch, resume }
                    }
                    None => {
                        metrics.session.limit_refused(Limit::MaxChannels);
                        let resume = Resume::Refused(Box::new(self.shared.channels.refusal()));
                        CoreMsg::Subscribed { ch, conn: conn.id, head: 0, epoch: "".into(), resume }
                    }
                };
                out.to_core(conn.core as usize, msg);
            }
            Request::Unsubscribe { ch, core, member } => {
                if let Some(id) = member {
                    self.presence_change(out.me(), &ch, now_ms, |p| p.leave(member_key(core, id)));
                }
                self.homes.unsubscribe(&ch, core as usize);
            }
            Request::Presence { ch, conn, query } => {
                let answer = self.presence_answer(&ch, conn, query);
                out.to_core(conn.core as usize, answer);
            }
            Request::Fetch { ch, conn, after, until } => {
                let (frames, evicted) = match self.homes.replay_batch(&ch, after, until) {
                    Ok(f) => (f, None),
                    Err(oldest) => (Vec::new(), Some(oldest)),
                };
                out.to_core(conn.core as usize, CoreMsg::ReplayBatch { ch, conn: conn.id, frames, evicted });
            }
            Request::History { ch, reply, from, limit } => {
                let page = Ok(self.homes.history(&ch, from, limit));
                out.to_core(reply.core as usize, CoreMsg::History { reply, ch, page });
            }
            Request::Control { reply, .. } => {
                out.to_core(reply.core as usize, CoreMsg::ControlSent { reply, result: Ok(0) });
            }
        }
    }

    fn wants_sweep(&self) -> bool {
        self.homes.has_channels()
    }

    fn next_due_ms(&self) -> Option<u64> {
        self.presences.next_due_ms()
    }

    fn presence_top(&self, n: usize) -> Vec<crate::server::bus::PresenceRow> {
        self.presences.top(n)
    }

    fn on_due(&mut self, out: &mut dyn Outbox, now_ms: u64) {
        let max_diff = self.shared.config.presence.max_diff;
        let (homes, metrics) = (&self.homes, &self.shared.metrics[out.me()]);
        let max_bytes = self.shared.config.presence_frame_max_bytes();
        self.presences.close_due(now_ms, max_diff, max_bytes, |ch, a| {
            metrics.presence_frames[usize::from(matches!(a, Announcement::Reset(_)))].fetch_add(1, Relaxed);
            let Some(c) = homes.get(ch) else { return };
            for core in c.interested() {
                out.to_core(core, CoreMsg::PresenceDiff { ch: ch.clone(), frame: a.frame().clone() });
            }
        });
    }

    fn shrink_if_spare(&mut self) -> bool {
        self.homes.shrink_if_spare()
    }

    fn sweep(&mut self, now_ms: u64) {
        // Channels idle past the dedup window are forgotten: ids remembered for dedup must
        // not outlive their channel's numbering.
        let rotations = self.homes.numbering().rotations();
        self.homes.sweep(now_ms, self.shared.config.dedup.window_ms);
        if self.homes.numbering().rotations() != rotations {
            tracing::info!(
                epoch = %self.homes.numbering().epoch(),
                tombstones = TOMBSTONES_PER_CORE,
                "forgotten channels filled this core's tombstones: channels it creates from now on start over under a new epoch"
            );
        }
    }
}
