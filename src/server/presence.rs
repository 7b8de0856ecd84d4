//! Presence at a subscriber's core (docs/protocol.md, "Presence"): the member a connection
//! becomes on presence channels, the client's `presence` and `presence_stats` requests, and
//! the delivery of each window's `presence_diff` / `presence_reset` frame to the local
//! subscribers that asked for joins and leaves. The members themselves live at the channel's
//! home (`broker::presence`).

use super::broker::{PresenceQuery, Request};
use super::bus::ConnRef;
use super::conn::ConnId;
use super::core::CoreState;
use crate::protocol::presence::Member;
use crate::protocol::{self, codes};
use crate::ws::codec;
use bytes::Bytes;

/// The client id of connection `conn` on core `core` of node `node`:
/// `<node id>-<core>-<slot>-<generation>`, unique across nodes and over the node's life.
pub fn client_id(node: &str, core: u16, conn: ConnId) -> String {
    format!("{node}-{core}-{}-{}", conn.key, conn.gen)
}

impl CoreState {
    /// The member connection `id` of this core is on presence channels: its client id
    /// ([`client_id`]), and its token's `sub` and `info` (none without `[auth]`).
    pub(crate) fn member_of(&mut self, id: ConnId) -> Member {
        let client = client_id(&self.shared.node_id, self.me as u16, id).into();
        let grant = self.session(id).and_then(|s| s.grant()).and_then(|g| self.grants.get(g));
        Member {
            client,
            user: grant.map(|g| g.user.as_ref().into()),
            info: grant.and_then(|g| g.info.as_deref().map(Into::into)),
        }
    }

    /// A client `presence` or `presence_stats` about `ch` (its `sub` right already checked):
    /// asked of the channel's home, answered when it answers; `error` `presence_off` when the
    /// channel's rule has no `presence = true`.
    pub(crate) fn client_presence(&mut self, id: ConnId, ch: &str, query: PresenceQuery) {
        if !self.shared.config.channel_rule(ch).presence {
            let reason = format!("presence is off for {ch} (its [[channels]] rule has no presence = true)");
            let e = protocol::with_channel(protocol::error_json(codes::PRESENCE_OFF, &reason, None), ch);
            return self.reply(id, codec::text_frame(&e));
        }
        let conn = ConnRef { core: self.me as u16, id };
        self.waiting.presence_asked(id, ch);
        self.broker.request(&mut self.router, Request::Presence { ch: ch.into(), conn, query });
    }

    /// The home answered a presence query of `id` about `ch`: a WebSocket client gets the JSON
    /// as a text frame, then its requests about `ch` held behind the query are served; an HTTP
    /// client awaiting it (`GET /api/presence…`) gets it as the API's answer.
    pub(crate) fn answer_presence(&mut self, id: ConnId, ch: &str, json: Vec<u8>) {
        match self.session(id).and_then(|s| s.awaiting()) {
            Some(keep_alive) => self.answer_api_presence(id, &json, keep_alive),
            None => {
                let asked = self.waiting.presence_answered(id, ch);
                self.reply(id, codec::text_frame(&json));
                if asked {
                    self.serve_held(id, Some(ch));
                }
            }
        }
    }

    /// A window of `ch` closed at its home: its frame goes to every local subscriber that asked
    /// for joins and leaves and whose subscription is active (queued like an answer: it is no
    /// message of the channel, so no overflow policy of the channel drops or conflates it).
    pub(crate) fn presence_diff(&mut self, ch: &str, frame: Bytes) {
        let Some(chan) = self.local.find(ch) else { return };
        let Some(ids) =
            self.local.chans[chan as usize].join_leave.as_ref().map(|s| s.iter().copied().collect::<Vec<_>>())
        else {
            return;
        };
        let now = self.clock.now();
        for id in ids {
            let active = self.conn(id).is_some_and(|c| c.subs.iter().any(|e| e.chan == chan && e.is_active()));
            if active {
                self.with_session_at(id, now, |s, ctx| s.reply(ctx, frame.clone()));
            }
        }
    }
}
