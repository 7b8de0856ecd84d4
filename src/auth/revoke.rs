//! Token revocations (`POST /api/revoke`, docs/api.md): a token refused before its `exp`,
//! by its id (`jti`) or by its user (`sub`). Sans-IO: each core keeps a copy of the set
//! ([`Revocations`]), fed by the server API and, with the Redis broker, by the other nodes;
//! the upgrade and `refresh` ask it whether a verified token is refused.
//!
//! A revocation by user refuses the user's tokens **issued up to the second it was made**
//! (`iat` at most `revoked_at_ms / 1000`, or no `iat`: such a token cannot show it is newer):
//! a backend logs a user out everywhere and goes on issuing fresh tokens, which pass. A
//! revocation by `jti` refuses exactly that token. Either lasts until its `until_ms`, after
//! which it is forgotten (the token's own `exp` has passed by then, when `until_ms` covers its
//! lifetime).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Longest `jti` claim a token may carry, in bytes; a token with a longer one is refused at
/// verification ("bad claims"): each connection whose token has a `jti` keeps it for
/// revocation (docs/api.md, "Memory").
pub const MAX_JTI_BYTES: usize = 256;

/// Revocations a process keeps at most (each core holds a copy); one more is refused with
/// 503 until some expire. About 100 bytes each per core, so 10 MB per core when full.
pub const MAX_REVOCATIONS: usize = 100_000;

/// How long a revocation lasts when `until_ms` is not given: 24 hours, in milliseconds. tether
/// does not bound the lifetime of the tokens it accepts, so this is the common upper bound of
/// an access token's lifetime; give `until_ms` past the `exp` of the longest-lived token the
/// issuer mints.
pub const DEFAULT_REVOKE_MS: u64 = 24 * 3_600_000;

/// The furthest `until_ms` may lie ahead of now: 366 days, in milliseconds.
pub const MAX_REVOKE_MS: u64 = 366 * 24 * 3_600_000;

/// One revocation, as the API takes it and as it travels between nodes (JSON, tagged by
/// `by`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "lowercase")]
pub enum Revocation {
    /// The token whose `jti` claim is `jti` (1–[`MAX_JTI_BYTES`] bytes).
    Jti {
        /// The token id.
        jti: Box<str>,
        /// Kept until this time, milliseconds since the Unix epoch.
        until_ms: u64,
    },
    /// The tokens of `user` (the `sub` claim) issued up to `revoked_at_ms` (second
    /// granularity: `iat` is in seconds), and those without `iat`.
    User {
        /// The user id.
        user: Box<str>,
        /// When the revocation was made, milliseconds since the Unix epoch.
        revoked_at_ms: u64,
        /// Kept until this time, milliseconds since the Unix epoch.
        until_ms: u64,
    },
}

impl Revocation {
    /// When it ends, milliseconds since the Unix epoch.
    pub fn until_ms(&self) -> u64 {
        match self {
            Revocation::Jti { until_ms, .. } | Revocation::User { until_ms, .. } => *until_ms,
        }
    }
}

/// The claims of a token that a revocation can match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenId<'a> {
    /// `sub`.
    pub user: &'a str,
    /// `jti`, when the token has one.
    pub jti: Option<&'a str>,
    /// `iat` in seconds since the Unix epoch, when the token has one.
    pub iat_s: Option<u64>,
}

/// The revocations in force, as one core holds them. Two maps, so a check is two lookups
/// whatever the number of revocations; an empty set costs nothing.
#[derive(Debug, Default)]
pub struct Revocations {
    /// `jti` → until (ms).
    jtis: HashMap<Box<str>, u64>,
    /// user → (revoked at, until), in ms. Two revocations of one user merge into the later of
    /// each, which refuses at least what each of them refuses.
    users: HashMap<Box<str>, (u64, u64)>,
}

impl Revocations {
    /// Adds `r` at `now_ms` (forgetting the ones that ended); a revocation already held is
    /// kept until the later of the two ends.
    pub fn add(&mut self, r: &Revocation, now_ms: u64) {
        self.expire(now_ms);
        if r.until_ms() <= now_ms {
            return;
        }
        match r {
            Revocation::Jti { jti, until_ms } => {
                let e = self.jtis.entry(jti.clone()).or_insert(0);
                *e = (*e).max(*until_ms);
            }
            Revocation::User { user, revoked_at_ms, until_ms } => {
                let e = self.users.entry(user.clone()).or_insert((0, 0));
                *e = (e.0.max(*revoked_at_ms), e.1.max(*until_ms));
            }
        }
    }

    /// Whether a token with these claims is refused at `now_ms`.
    pub fn refuses(&self, t: TokenId<'_>, now_ms: u64) -> bool {
        if self.is_empty() {
            return false;
        }
        let by_jti = t.jti.and_then(|j| self.jtis.get(j)).is_some_and(|until| *until > now_ms);
        let by_user = self
            .users
            .get(t.user)
            .is_some_and(|(at_ms, until)| *until > now_ms && t.iat_s.is_none_or(|iat| iat <= at_ms / 1000));
        by_jti || by_user
    }

    /// Forgets the revocations that ended by `now_ms`.
    pub fn expire(&mut self, now_ms: u64) {
        self.jtis.retain(|_, until| *until > now_ms);
        self.users.retain(|_, (_, until)| *until > now_ms);
    }

    /// Revocations held (ended ones included until the next [`Revocations::add`] or
    /// [`Revocations::expire`]).
    pub fn len(&self) -> usize {
        self.jtis.len() + self.users.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.jtis.is_empty() && self.users.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok<'a>(user: &'a str, jti: Option<&'a str>, iat_s: Option<u64>) -> TokenId<'a> {
        TokenId { user, jti, iat_s }
    }

    #[test]
    fn by_jti_refuses_that_token_until_it_ends() {
        let mut r = Revocations::default();
        assert!(!r.refuses(tok("alice", Some("t1"), Some(1)), 0));
        r.add(&Revocation::Jti { jti: "t1".into(), until_ms: 10_000 }, 1_000);
        assert!(r.refuses(tok("alice", Some("t1"), Some(1)), 9_999));
        assert!(r.refuses(tok("bob", Some("t1"), None), 9_999), "the id alone decides");
        assert!(!r.refuses(tok("alice", Some("t2"), Some(1)), 9_999));
        assert!(!r.refuses(tok("alice", None, Some(1)), 9_999));
        assert!(!r.refuses(tok("alice", Some("t1"), Some(1)), 10_000), "ended");
        // A shorter second revocation does not shorten the first.
        r.add(&Revocation::Jti { jti: "t1".into(), until_ms: 5_000 }, 2_000);
        assert!(r.refuses(tok("alice", Some("t1"), None), 9_000));
        r.expire(10_000);
        assert!(r.is_empty());
    }

    #[test]
    fn by_user_refuses_tokens_issued_up_to_its_second() {
        let mut r = Revocations::default();
        r.add(&Revocation::User { user: "alice".into(), revoked_at_ms: 100_500, until_ms: 200_000 }, 100_500);
        assert!(r.refuses(tok("alice", None, Some(99)), 150_000));
        assert!(r.refuses(tok("alice", Some("x"), Some(100)), 150_000), "the same second is refused");
        assert!(r.refuses(tok("alice", None, None), 150_000), "no iat: cannot show it is newer");
        assert!(!r.refuses(tok("alice", None, Some(101)), 150_000), "issued after: passes");
        assert!(!r.refuses(tok("bob", None, Some(1)), 150_000));
        assert!(!r.refuses(tok("alice", None, Some(1)), 200_000));
        // A later revocation of the same user moves the line.
        r.add(&Revocation::User { user: "alice".into(), revoked_at_ms: 120_000, until_ms: 130_000 }, 120_000);
        assert!(r.refuses(tok("alice", None, Some(110)), 125_000));
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn ended_revocations_are_not_added_and_are_forgotten() {
        let mut r = Revocations::default();
        r.add(&Revocation::Jti { jti: "old".into(), until_ms: 5 }, 10);
        assert!(r.is_empty());
        r.add(&Revocation::Jti { jti: "a".into(), until_ms: 20 }, 10);
        r.add(&Revocation::User { user: "u".into(), revoked_at_ms: 10, until_ms: 30 }, 25);
        assert_eq!(r.len(), 1, "the jti one ended at 20 and went with the next add");
    }

    #[test]
    fn revocations_travel_as_tagged_json() {
        let r = Revocation::User { user: "alice".into(), revoked_at_ms: 7, until_ms: 9 };
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(j, r#"{"by":"user","user":"alice","revoked_at_ms":7,"until_ms":9}"#);
        assert_eq!(serde_json::from_str::<Revocation>(&j).unwrap(), r);
    }
}
