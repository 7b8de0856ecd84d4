//! `GET /connections?top=N` and the per-core part of `GET /status.json`: the connections with
//! the largest outbound queues, each core's summed queues and its largest presence channels,
//! gathered from every core over the bus.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::http;
use crate::http::Request;
use crate::server::bus::{ConnRef, ConnRow, CoreLoad, CoreMsg, PresenceRow};
use crate::server::conn::ConnId;
use crate::server::core::CoreState;
use crate::tick::TICK_MS;

/// Which endpoint a gathering answers once every core has sent its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather {
    /// `GET /connections`: the rows only.
    Connections,
    /// `GET /status.json` (docs/http.md): the rows, the cores' loads and the counters.
    Status,
}

/// One `GET /connections` or `GET /status.json` request gathering rows from every core.
pub struct Gathering {
    /// The HTTP connection that asked.
    pub conn: ConnId,
    /// Which endpoint answers once every core has.
    pub what: Gather,
    /// Cores that have yet to answer.
    pub missing: usize,
    /// Rows wanted.
    pub top: usize,
    /// Rows gathered so far.
    pub rows: Vec<ConnRow>,
    /// Each answered core's summed queues.
    pub loads: Vec<CoreLoad>,
    /// Each answered core's largest presence channels.
    pub presence: Vec<PresenceRow>,
}

/// Presence channels `GET /status.json` lists: the ones with the most members. Each core
/// sends at most this many (a bounded heap over its homes' presence channels), so a refresh
/// costs one pass over the presence channels and nothing per connection or member.
pub const PRESENCE_TOP: usize = 10;

/// The `top` query parameter of `/connections` and `/status.json`: rows wanted, default 10,
/// at most 10,000 (a value that is not a number counts as absent).
pub fn top_of(req: &Request) -> usize {
    let top = req.query.as_deref().and_then(|q| http::query_param(q, "top")).and_then(|t| t.parse().ok());
    top.unwrap_or(10usize).min(10_000)
}

impl CoreState {
    /// This core's `top` upgraded connections by queued bytes, and its queues summed. One
    /// pass over the slab; the running top is a min-heap of at most `top` entries, so a
    /// refresh of the status page every second allocates nothing per connection.
    pub fn inspect(&self, top: usize) -> (Vec<ConnRow>, CoreLoad) {
        let now = self.clock.now();
        let mut load = CoreLoad { core: self.me, ..CoreLoad::default() };
        let mut heap: BinaryHeap<Reverse<(usize, usize)>> = BinaryHeap::with_capacity(top.min(1024) + 1);
        for (k, c) in self.conns.slab.iter().filter(|(_, c)| c.session.is_upgraded()) {
            let bytes = c.session.queued_bytes();
            load.queued_bytes += bytes;
            load.queued_messages += c.session.queued_frames();
            load.backlogged += usize::from(c.session.has_output());
            if top == 0 {
                continue;
            }
            if heap.len() < top {
                heap.push(Reverse((bytes, k)));
            } else if heap.peek().is_some_and(|Reverse((least, _))| bytes > *least) {
                heap.pop();
                heap.push(Reverse((bytes, k)));
            }
        }
        let rows = heap
            .into_sorted_vec()
            .into_iter()
            .map(|Reverse((_, k))| {
                let c = &self.conns.slab[k];
                let s = &c.session;
                let since_drain = if !s.has_output() {
                    0.0
                } else {
                    now.wrapping_sub(s.last_drained()) as f64 * TICK_MS as f64 / 1000.0
                };
                ConnRow {
                    id: format!("{}:{}:{}", self.me, k, c.gen),
                    peer: c.peer().map_or_else(|| "?".into(), |p| p.to_string()),
                    queued_bytes: s.queued_bytes(),
                    queued_messages: s.queued_frames(),
                    secs_since_drain: since_drain,
                    subscriptions: c
                        .subs
                        .iter()
                        .filter(|e| e.is_active())
                        .filter_map(|e| self.local.chans.get(e.chan as usize).map(|l| l.name.to_string()))
                        .collect(),
                }
            })
            .collect();
        (rows, load)
    }

    /// Asks every core (this one included) for its `top` connections and its load; the
    /// answer completes the HTTP request of `id` as `what`.
    pub fn start_inspect(&mut self, id: ConnId, top: usize, what: Gather) {
        let cores = self.shared.cores;
        self.inspects.push(Gathering {
            conn: id,
            what,
            missing: cores,
            top,
            rows: Vec::new(),
            loads: Vec::with_capacity(cores),
            presence: Vec::new(),
        });
        for core in 0..cores {
            self.router.to_core(core, CoreMsg::Inspect { reply: ConnRef { core: self.me as u16, id }, top });
        }
    }

    /// One core's rows for the gathering of `id`; the last one completes it.
    pub fn inspected(&mut self, id: ConnId, rows: Vec<ConnRow>, load: CoreLoad, presence: Vec<PresenceRow>) {
        let Some(i) = self.inspects.iter().position(|g| g.conn == id) else { return };
        let g = &mut self.inspects[i];
        g.rows.extend(rows);
        g.loads.push(load);
        g.presence.extend(presence);
        g.missing -= 1;
        if g.missing > 0 {
            return;
        }
        let mut g = self.inspects.swap_remove(i);
        g.rows.sort_by_key(|r| Reverse(r.queued_bytes));
        g.rows.truncate(g.top);
        match g.what {
            Gather::Connections => self.answer_inspect(id, g.rows),
            Gather::Status => {
                g.loads.sort_by_key(|l| l.core);
                g.presence.sort_by(|a, b| b.members.cmp(&a.members).then_with(|| a.ch.cmp(&b.ch)));
                g.presence.truncate(PRESENCE_TOP);
                self.answer_status(id, g.rows, g.loads, g.presence);
            }
        }
    }
}
