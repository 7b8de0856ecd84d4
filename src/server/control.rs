//! The server API at one core (docs/api.md): what a node-wide action does to this core's
//! connections, the revocations the core checks, the `jti` of the connections whose token
//! carries one, and the API requests this core is gathering answers for.
//!
//! A user is found through the core's interned grants ([`Grants::of_user`]): a walk of the
//! grants (one per distinct token claims), and of the connections only when the user holds
//! one here. A token id is kept only for connections whose token has a `jti`, in a map beside
//! the connection table, so the per-connection record does not grow (docs/api.md, "Memory").
//!
//! [`Grants::of_user`]: crate::auth::grants::Grants::of_user

use std::collections::HashMap;
use std::sync::Arc;

use super::broker::Control;
use super::bus::CoreMsg;
use super::conn::ConnId;
use super::core::CoreState;
use super::http::api::gather::{Batch, Gathering};
use crate::auth::revoke::{Revocation, Revocations};
use crate::auth::{unix_now_ms, Verified};
use crate::protocol;
use crate::protocol::close::{CloseCode, CloseReason, FORBIDDEN};
use crate::session::ReapReason;
use crate::ws::codec;

/// One core's share of the server API.
#[derive(Default)]
pub struct ApiState {
    /// The revocations in force (the same set on every core of the node).
    pub revocations: Revocations,
    /// The `jti` of each connection of this core whose token has one.
    jtis: HashMap<ConnId, Box<str>>,
    /// API requests of this core's connections waiting for other cores (or the broker).
    pub gatherings: Vec<Gathering>,
    /// Batch publishes of this core's connections waiting for their channels' answers.
    pub batches: HashMap<ConnId, Batch>,
}

impl ApiState {
    /// Connection `id` now holds a token with this `jti` (or none).
    pub fn note_jti(&mut self, id: ConnId, jti: Option<Box<str>>) {
        match jti {
            Some(j) => {
                self.jtis.insert(id, j);
            }
            None => {
                self.jtis.remove(&id);
            }
        }
    }

    /// Connection `id` left.
    pub fn forget(&mut self, id: ConnId) {
        if !self.jtis.is_empty() {
            self.jtis.remove(&id);
        }
        if !self.batches.is_empty() {
            self.batches.remove(&id);
        }
    }
}

/// `{"op":"unsubscribed","ch":CH,"reason":"server"}`: a subscription ended by the server API
/// (docs/protocol.md), not by the client's `unsub`.
fn unsubscribed_by_server(ch: &str) -> Vec<u8> {
    let mut json = protocol::unsubscribed_json(ch);
    json.pop();
    json.extend_from_slice(b",\"reason\":\"server\"}");
    json
}

impl CoreState {
    /// Whether a verified token is revoked here (checked at the upgrade and at `refresh`).
    pub fn token_revoked(&self, v: &Verified) -> bool {
        self.api.revocations.refuses(v.token_id(), unix_now_ms())
    }

    /// The messages of the server API for this core (the ones [`CoreState::handle`] passes
    /// on).
    pub fn handle_api(&mut self, msg: CoreMsg) {
        match msg {
            CoreMsg::Control { msg, reply } => {
                let affected = self.apply_control(&msg);
                if let Some(reply) = reply {
                    self.router.to_core(reply.core as usize, CoreMsg::ControlDone { reply, affected });
                }
            }
            CoreMsg::ControlDone { reply, affected } => self.control_done(reply.id, affected),
            CoreMsg::ControlSent { reply, result } => self.control_sent(reply.id, result),
            CoreMsg::Revocations(list) => {
                let now = unix_now_ms();
                for r in list.iter() {
                    self.api.revocations.add(r, now);
                }
            }
            CoreMsg::ListChannels { reply, prefix, limit } => {
                let (rows, truncated) = self.local_channels(&prefix, limit);
                self.router.to_core(reply.core as usize, CoreMsg::ChannelRows { reply, rows, truncated });
            }
            CoreMsg::ChannelRows { reply, rows, truncated } => self.channel_rows(reply.id, rows, truncated),
            CoreMsg::History { reply, ch, page } => self.answer_history(reply.id, &ch, page),
            other => tracing::debug!(?other, "not a message of the server API"),
        }
    }

    /// Applies a node-wide action to this core's connections; returns how many it affected
    /// (connections closed, or subscriptions ended).
    pub fn apply_control(&mut self, msg: &Control) -> u64 {
        match msg {
            Control::Disconnect { user, code, reason } => {
                let ids = self.conns_of_user(user);
                self.close_all_of(&ids, CloseCode::from(*code), reason, ReapReason::Disconnected)
            }
            Control::Unsubscribe { user, ch } => {
                let mut n = 0;
                for id in self.conns_of_user(user) {
                    if self.end_subscription(id, ch) {
                        self.reply(id, codec::text_frame(&unsubscribed_by_server(ch)));
                        n += 1;
                    }
                }
                n
            }
            Control::Revoke { revocation } => {
                self.api.revocations.add(revocation, unix_now_ms());
                let ids = match revocation {
                    Revocation::Jti { jti, .. } => {
                        self.api.jtis.iter().filter(|(_, j)| j.as_ref() == jti.as_ref()).map(|(id, _)| *id).collect()
                    }
                    // Every live connection's token was issued before the revocation was made.
                    Revocation::User { user, .. } => self.conns_of_user(user),
                };
                let reason = CloseReason::forbidden("token revoked").to_json();
                self.close_all_of(&ids, FORBIDDEN, &reason, ReapReason::Forbidden)
            }
        }
    }

    /// Closes each of `ids` that is open with `code` and `reason`; returns how many.
    fn close_all_of(&mut self, ids: &[ConnId], code: CloseCode, reason: &str, why: ReapReason) -> u64 {
        let mut n = 0;
        for &id in ids {
            let closed = self.with_session(id, |s, ctx| {
                let open = s.state().can_write();
                s.close(ctx, code, reason, why);
                open
            });
            n += u64::from(closed == Some(true));
            self.flush(id);
        }
        n
    }

    /// The upgraded connections of this core whose token's `sub` is `user`.
    fn conns_of_user(&self, user: &str) -> Vec<ConnId> {
        let grants = self.grants.of_user(user);
        if grants.is_empty() {
            return Vec::new();
        }
        self.conns
            .slab
            .iter()
            .filter(|(_, c)| c.session.grant().is_some_and(|g| grants.contains(&g)))
            .map(|(k, c)| ConnId { key: k as u32, gen: c.gen })
            .collect()
    }

    /// This core's channels whose name starts with `prefix`, with their confirmed local
    /// subscribers: the first `limit` names in byte order, and whether there were more.
    fn local_channels(&self, prefix: &str, limit: usize) -> (Vec<(Arc<str>, u64)>, bool) {
        let mut rows: Vec<(Arc<str>, u64)> = self
            .local
            .chans
            .iter()
            .filter(|(_, c)| c.live() > 0 && c.name.starts_with(prefix))
            .map(|(_, c)| (c.name.clone(), c.live() as u64))
            .collect();
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let more = rows.len() > limit;
        rows.truncate(limit);
        (rows, more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_unsubscribe_says_so() {
        let v: serde_json::Value = serde_json::from_slice(&unsubscribed_by_server("news")).unwrap();
        assert_eq!(v, serde_json::json!({"op":"unsubscribed","ch":"news","reason":"server"}));
    }
}
