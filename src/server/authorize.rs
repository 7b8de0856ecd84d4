//! JWT auth at the core (DESIGN §9, docs/security.md): the token of an upgrade, channel
//! rights on `sub` and `pub`, and `refresh`. Verification is [`crate::auth::Verifier`]'s; the
//! grants connections hold are interned in the core's [`Grants`](crate::auth::grants::Grants)
//! table, and each session keeps only the index and its token's expiry tick.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::conn::{ConnId, CANCELLED};
use super::core::CoreState;
use crate::auth::{unix_now_ms, AuthError, Verified};
use crate::http::Request;
use crate::protocol::close::{CloseReason, FORBIDDEN};
use crate::protocol::{self, codes};
use crate::session::{token_due, ReapReason};
use crate::ws::codec;

/// A right a token's `channels` claim grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    /// `channels.sub`: `sub` on the channel.
    Subscribe,
    /// `channels.pub`: `pub` on the channel.
    Publish,
}

/// `WWW-Authenticate` of a 401 (RFC 6750 §3): `invalid_token` unless no token was sent.
pub fn www_authenticate(e: AuthError) -> &'static str {
    match e {
        AuthError::Missing => "Bearer realm=\"tether\"",
        _ => "Bearer realm=\"tether\", error=\"invalid_token\"",
    }
}

impl CoreState {
    /// The token of an upgrade request, verified: `Ok(None)` without JWT auth. The token is
    /// `?token=` on the request target (percent-decoded; browsers cannot set headers on a
    /// WebSocket) or `Authorization: Bearer`, exactly one of them: `token` appears at most
    /// once in the query, and a lone empty `?token=` counts as absent.
    ///
    /// # Errors
    /// The [`AuthError`] to answer with 401 ([`AuthError::Revoked`] for a token a revocation
    /// in force matches, docs/api.md), or [`AuthError::Ambiguous`] (answered 400) when
    /// `token` is repeated in the query or sent both in the query and in `Authorization`:
    /// which one would count is ambiguous, and a proxy in front may have checked the other.
    pub fn verify_upgrade(&self, req: &Request) -> Result<Option<Verified>, AuthError> {
        let shared = self.shared.clone();
        let Some(verifier) = &shared.auth else { return Ok(None) };
        let mut in_query = req.query.as_deref().map(|q| crate::http::query_values(q, "token")).unwrap_or_default();
        if in_query.len() > 1 {
            return Err(AuthError::Ambiguous);
        }
        in_query.retain(|v| v.as_deref() != Some(""));
        let token = match (in_query.len(), &req.bearer) {
            (0, bearer) => bearer.clone().unwrap_or_default(),
            (1, None) => in_query.pop().flatten().ok_or(AuthError::Malformed)?,
            _ => return Err(AuthError::Ambiguous),
        };
        let v = verifier.verify(&token, unix_now_ms())?;
        if self.token_revoked(&v) {
            return Err(AuthError::Revoked);
        }
        Ok(Some(v))
    }

    /// Gives the just-upgraded connection `id` the grant of its verified token, and schedules
    /// the token's expiry in its one deadline.
    pub fn grant_upgraded(&mut self, id: ConnId, v: Verified) {
        let remaining = self.remaining_ms(v.exp_ms);
        let g = self.acquire_grant(v.grant);
        if self.with_session(id, |s, ctx| s.authenticate(g, token_due(ctx.now, remaining))).is_none() {
            self.release_grant(g);
        } else if v.jti.is_some() {
            self.api.note_jti(id, v.jti);
        }
    }

    /// One more reference to `grant` in the core's table (`tether_auth_grants` follows).
    fn acquire_grant(&mut self, grant: crate::auth::Grant) -> u32 {
        let g = self.grants.acquire(grant);
        self.metrics().auth_grants.store(self.grants.len() as i64, Relaxed);
        g
    }

    /// Drops a connection's reference to grant `g` (at teardown, or replaced by a refresh).
    pub fn release_grant(&mut self, g: u32) {
        self.grants.release(g);
        self.metrics().auth_grants.store(self.grants.len() as i64, Relaxed);
    }

    /// Milliseconds until a token with `exp_ms` expires, leeway included (0 if it has).
    fn remaining_ms(&self, exp_ms: u64) -> u64 {
        let leeway = self.shared.auth.as_ref().map_or(0, |v| v.leeway_ms());
        exp_ms.saturating_add(leeway).saturating_sub(unix_now_ms())
    }

    /// Whether connection `id` may `right` on `ch`; when not, answers `error` `forbidden`
    /// naming the channel (and the publish `id`), and the connection stays. A connection
    /// without a grant (no JWT auth) may do anything.
    pub fn authorize(&mut self, id: ConnId, right: Right, ch: &str, pub_id: Option<&str>) -> bool {
        let Some(g) = self.session(id).and_then(|s| s.grant()) else { return true };
        let allowed = self.grants.get(g).is_some_and(|grant| match right {
            Right::Subscribe => grant.may_subscribe(ch),
            Right::Publish => grant.may_publish(ch),
        });
        if !allowed {
            let what = if right == Right::Subscribe { "subscribe to" } else { "publish to" };
            let reason = format!("the token does not allow to {what} {ch}");
            let e = protocol::with_channel(protocol::error_json(codes::FORBIDDEN, &reason, pub_id), ch);
            self.reply(id, codec::text_frame(&e));
        }
        allowed
    }

    /// A client `refresh`: verifies `token` (a revoked one is refused like an invalid one);
    /// when it is valid and names the same user, the
    /// connection takes its grant and expiry, subscriptions the new grant does not allow are
    /// ended (an `error` `forbidden` per channel), and `refreshed` answers. An invalid token
    /// or another user closes with 4003; a server without JWT auth answers `error` `bad_op`.
    pub fn client_refresh(&mut self, id: ConnId, token: &str) {
        let shared = self.shared.clone();
        let Some(verifier) = &shared.auth else {
            let e =
                protocol::error_json(codes::BAD_OP, "refresh: this server does not use tokens ([auth] is off)", None);
            return self.reply(id, codec::text_frame(&e));
        };
        let Some(old) = self.session(id).and_then(|s| s.grant()) else { return };
        let v = match verifier.verify(token, unix_now_ms()) {
            Ok(v) if self.token_revoked(&v) => return self.refuse_refresh(id, AuthError::Revoked.reason()),
            Ok(v) => v,
            Err(e) => return self.refuse_refresh(id, e.reason()),
        };
        if self.grants.get(old).is_none_or(|g| g.user != v.grant.user) {
            return self.refuse_refresh(id, "different sub");
        }
        let (exp_ms, remaining, jti) = (v.exp_ms, self.remaining_ms(v.exp_ms), v.jti);
        let g = self.acquire_grant(v.grant);
        for ch in self.no_longer_allowed(id, g) {
            self.end_subscription(id, &ch);
            let reason = format!("the refreshed token does not allow to subscribe to {ch}: unsubscribed");
            let e = protocol::with_channel(protocol::error_json(codes::FORBIDDEN, &reason, None), &ch);
            self.reply(id, codec::text_frame(&e));
        }
        match self.with_session(id, |s, ctx| s.refresh(g, token_due(ctx.now, remaining))) {
            Some(old) => {
                if let Some(old) = old {
                    self.release_grant(old);
                }
                self.api.note_jti(id, jti);
                self.reply(id, codec::text_frame(&protocol::refreshed_json(exp_ms / 1000)));
            }
            None => self.release_grant(g),
        }
    }

    /// The channels `id` is subscribed to (or subscribing) that grant `g` does not allow.
    fn no_longer_allowed(&mut self, id: ConnId, g: u32) -> Vec<Arc<str>> {
        let (Some(grant), Some(s)) = (self.grants.get(g), self.conns.get(id)) else { return Vec::new() };
        let local = &self.local;
        s.subs
            .iter()
            .filter(|e| e.pos != CANCELLED)
            .filter_map(|e| local.chans.get(e.chan as usize).map(|lc| lc.name.clone()))
            .filter(|ch| !grant.may_subscribe(ch))
            .collect()
    }

    /// Closes `id` with 4003 for a refused refresh; `detail` says why.
    fn refuse_refresh(&mut self, id: ConnId, detail: &'static str) {
        let reason = CloseReason::forbidden(detail).to_json();
        self.with_session(id, |s, ctx| s.close(ctx, FORBIDDEN, &reason, ReapReason::Forbidden));
        self.flush(id);
    }
}
