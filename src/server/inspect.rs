//! `GET /connections?top=N`: the connections with the largest outbound queues, gathered from
//! every core over the bus.

use super::bus::{ConnRef, ConnRow, CoreMsg};
use super::core::{CoreState, Gathering};
use super::session::{ConnId, Flags};
use super::timer::TICK_MS;

impl CoreState {
    /// This core's `top` upgraded connections by queued bytes.
    pub fn inspect(&self, top: usize) -> Vec<ConnRow> {
        let now = self.clock.now();
        let mut all: Vec<(usize, usize)> = self
            .conns
            .slab
            .iter()
            .filter(|(_, s)| s.flags.has(Flags::UPGRADED))
            .map(|(k, s)| (s.queue.bytes(), k))
            .collect();
        if all.len() > top && top > 0 {
            all.select_nth_unstable_by(top - 1, |a, b| b.0.cmp(&a.0));
        }
        all.truncate(top);
        all.iter()
            .map(|&(_, k)| {
                let s = &self.conns.slab[k];
                let since_drain = if s.queue.is_empty() {
                    0.0
                } else {
                    now.wrapping_sub(s.last_drained) as f64 * TICK_MS as f64 / 1000.0
                };
                ConnRow {
                    id: format!("{}:{}:{}", self.me, k, s.gen),
                    peer: s.peer().map_or_else(|| "?".into(), |p| p.to_string()),
                    queued_bytes: s.queue.bytes(),
                    queued_messages: s.queue.len(),
                    secs_since_drain: since_drain,
                    subscriptions: s
                        .subs
                        .iter()
                        .filter(|e| e.is_active())
                        .filter_map(|e| self.local.chans.get(e.chan as usize).map(|l| l.name.to_string()))
                        .collect(),
                }
            })
            .collect()
    }

    /// Asks every core (this one included) for its `top` connections; the answer completes
    /// the HTTP request of `id`.
    pub fn start_inspect(&mut self, id: ConnId, top: usize) {
        let cores = self.shared.cores;
        self.inspects.push(Gathering { conn: id, missing: cores, top, rows: Vec::new() });
        for core in 0..cores {
            self.router.to_core(core, CoreMsg::Inspect { reply: ConnRef { core: self.me as u16, id }, top });
        }
    }

    /// One core's rows for the `GET /connections` of `id`; the last one completes it.
    pub fn inspected(&mut self, id: ConnId, rows: Vec<ConnRow>) {
        let Some(i) = self.inspects.iter().position(|g| g.conn == id) else { return };
        let g = &mut self.inspects[i];
        g.rows.extend(rows);
        g.missing -= 1;
        if g.missing > 0 {
            return;
        }
        let mut g = self.inspects.swap_remove(i);
        g.rows.sort_by_key(|r| std::cmp::Reverse(r.queued_bytes));
        g.rows.truncate(g.top);
        self.answer_inspect(id, g.rows);
    }
}
