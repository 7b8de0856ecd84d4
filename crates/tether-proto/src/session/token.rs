//! The session's side of JWT auth (DESIGN §9, docs/security.md): which interned grant the
//! connection holds, and its token's expiry folded into the one deadline.
//!
//! At `exp` (plus `auth.jwt_leeway_ms`) an open connection is sent `error` `token_expired` and
//! the refresh grace starts; a verified `refresh` ([`Session::refresh`]) moves the expiry to
//! the new token's; at the end of the grace the connection is closed with 4001. The core
//! verifies tokens and owns the grant table; the session only keeps a `u32` and a tick.

use super::{reached, Ctx, Flags, ReapReason, Session, State, Tick};
use crate::protocol::close::{CloseReason, TOKEN_EXPIRED};
use crate::protocol::{self, codes};
use crate::tick::TICK_MS;
use crate::ws::codec;

/// `grant` of a connection without a token (a server without JWT auth).
pub const NO_GRANT: u32 = u32::MAX;

/// Furthest a token expiry is scheduled ahead, in ticks (2^30 ticks of 10 ms, about 124
/// days): ticks are compared wrap-aware over half of `u32`, so a later `exp` is treated as
/// expiring this long after it was verified.
pub const MAX_TOKEN_TICKS: Tick = 1 << 30;

/// The tick at which a token with `remaining_ms` milliseconds left (`exp` plus leeway minus the
/// wall clock) expires, seen from `now`; capped at [`MAX_TOKEN_TICKS`] ahead.
pub fn token_due(now: Tick, remaining_ms: u64) -> Tick {
    let ticks = remaining_ms.div_ceil(TICK_MS).min(u64::from(MAX_TOKEN_TICKS)) as Tick;
    now.wrapping_add(ticks)
}

impl Session {
    /// Records the grant of the token the upgrade carried (an index into the core's grant
    /// table) and its expiry tick `due` ([`token_due`]); call right after
    /// [`Session::upgrade`].
    pub fn authenticate(&mut self, grant: u32, due: Tick) {
        self.grant = grant;
        self.token_due = due;
        self.flags.clear(Flags::TOKEN_EXPIRED);
        self.fold_token_deadline();
    }

    /// The grant index of this connection, `None` without a token.
    pub fn grant(&self) -> Option<u32> {
        (self.grant != NO_GRANT).then_some(self.grant)
    }

    /// Whether the token expired and the refresh grace is running.
    pub fn token_expired(&self) -> bool {
        self.flags.has(Flags::TOKEN_EXPIRED)
    }

    /// A `refresh` verified: the connection now holds `grant`, expiring at `due`, and the
    /// grace (if running) is over. Returns the grant it held before, for the core to release.
    pub fn refresh(&mut self, grant: u32, due: Tick) -> Option<u32> {
        let old = self.grant();
        self.authenticate(grant, due);
        old
    }

    /// The token deadline, if it came at `ctx.now`: at the expiry, `error` `token_expired` and
    /// the grace starts; at the end of the grace, close 4001. Returns whether the connection
    /// is closing.
    pub(super) fn token_timeout(&mut self, ctx: &Ctx) -> bool {
        if self.grant == NO_GRANT || !reached(ctx.now, self.token_due) {
            return false;
        }
        if self.flags.has(Flags::TOKEN_EXPIRED) {
            let reason = CloseReason::token_expired().to_json();
            self.close(ctx, TOKEN_EXPIRED, &reason, ReapReason::TokenExpired);
            return true;
        }
        self.flags.set(Flags::TOKEN_EXPIRED);
        self.token_due = ctx.now.wrapping_add(ctx.cfg.token_refresh_grace);
        let grace_ms = u64::from(ctx.cfg.token_refresh_grace) * TICK_MS;
        let reason = format!("token expired: send {{\"op\":\"refresh\",\"token\":…}} within {grace_ms} ms");
        self.reply(ctx, codec::text_frame(&protocol::error_json(codes::TOKEN_EXPIRED, &reason, None)));
        !self.state.can_write()
    }

    /// Makes the one deadline the token's when that comes first (an open connection that is
    /// not being drained: the drain close comes first anyway).
    pub(super) fn fold_token_deadline(&mut self) {
        if self.grant == NO_GRANT || self.state != State::Open || self.flags.has(Flags::DRAIN) {
            return;
        }
        if !reached(self.token_due, self.deadline) {
            self.deadline = self.token_due;
        }
    }
}
