//! `GET /connections?top=N`: the connections with the largest outbound queues, gathered from
//! every core over the bus.

use super::bus::{ConnRef, ConnRow, CoreMsg, HttpWait};
use super::conn_state::*;
use super::core::CoreState;
use super::timer::TICK_MS;

impl CoreState {
    /// This core's `top` upgraded connections by queued bytes.
    pub fn inspect(&self, top: usize) -> Vec<ConnRow> {
        let now = self.now_tick();
        let mut all: Vec<(usize, usize)> =
            self.conns.iter().filter(|(_, c)| c.flags & UPGRADED != 0).map(|(k, c)| (c.out_bytes, k)).collect();
        if all.len() > top && top > 0 {
            all.select_nth_unstable_by(top - 1, |a, b| b.0.cmp(&a.0));
        }
        all.truncate(top);
        all.iter()
            .map(|&(_, k)| {
                let c = &self.conns[k];
                ConnRow {
                    id: format!("{}:{}:{}", self.me, k, c.gen),
                    peer: c.peer().map_or_else(|| "?".into(), |p| p.to_string()),
                    queued_bytes: c.out_bytes,
                    queued_messages: c.out.len(),
                    secs_since_drain: if c.out.is_empty() { 0.0 } else { now.wrapping_sub(c.last_drained) as f64 * TICK_MS as f64 / 1000.0 },
                    subscriptions: c
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
        let Some(c) = self.conn(id) else { return };
        c.reply = Some(Box::new(HttpWait::Inspect { missing: cores, top, rows: Vec::new() }));
        c.flags |= AWAITING;
        for core in 0..cores {
            self.route(core, CoreMsg::Inspect { reply: ConnRef { core: self.me as u16, id }, top });
        }
    }
}
