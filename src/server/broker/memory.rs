//! The embedded broker: each channel lives at a home core of this process (a hash of its
//! name), which assigns its seqs, keeps its history and dedup ids, and fans each frame out to
//! the cores with subscribers. Requests travel to the home over the bus; the per-pair FIFO
//! order of the bus gives the [`Broker`] ordering contract.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::epoch::{Numbering, TOMBSTONES_PER_CORE};
use super::home::{home_of, Dedup, FenceCheck, Homes, MAX_FEEDS_PER_CHANNEL};
use super::{Broker, Outbox, PublishResult, Request, Resume};
use crate::protocol::RequestError;
use crate::server::bus::CoreMsg;
use crate::server::Shared;
use crate::session::Limit;

/// One core's part of the memory broker: the channels homed on this core.
pub struct MemoryBroker {
    homes: Homes,
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
        MemoryBroker { homes: Homes::new(shared.cores, dedup, numbering, shared.channels.clone()), shared }
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
        let metrics = &self.shared.metrics[out.me()];
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
            Request::Subscribe { ch, conn, from, epoch } => {
                let cap = self.shared.config.channel_rule(&ch).history;
                let msg = match self.homes.subscribe(&ch, conn.core as usize, from, epoch.as_deref(), cap) {
                    Some((name, head, epoch, resume)) => {
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
            Request::Unsubscribe { ch, core } => self.homes.unsubscribe(&ch, core as usize),
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
