//! JWT connection auth (DESIGN §9, docs/security.md): verifying a token and reading its
//! claims, the per-core table of interned grants, and minting tokens for `tether token`.
//!
//! A token (RFC 7519, signed per RFC 7515) carries `sub` (the user), `exp` (and optionally
//! `nbf`, `iss`, `aud`) and `channels: {"sub": [globs], "pub": [globs]}`. [`Verifier`] checks
//! it with the `jsonwebtoken` crate against the one algorithm the configured key allows
//! (HS256 for `auth.jwt_hs256_secret`; RS256, ES256 or EdDSA for `auth.jwt_public_key_file`),
//! so `alg: none` and HS/RS confusion (an HS256 token "signed" with the public key's PEM
//! bytes) are refused before any signature is computed. What a connection keeps of a verified
//! token is a [`Grant`] (user and globs), interned per core by [`grants::Grants`], and the
//! expiry instant, folded into the session's one deadline.
//!
//! # Layout
//! - this file: [`Verifier`], [`Grant`], [`AuthError`];
//! - [`grants`]: the per-core, reference-counted table of grants (one copy per distinct
//!   grant, not per connection);
//! - [`mint`]: `tether token`: signing keys and token minting;
//! - [`revoke`]: revocations of tokens by `jti` or by user (`POST /api/revoke`), the set each
//!   core checks at the upgrade and at `refresh`.

pub mod grants;
pub mod mint;
pub mod revoke;

use std::fmt;
use std::path::Path;

use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Deserializer};

use crate::config::{glob_match, Auth, ConfigError};

/// Most globs in one of `channels.sub` / `channels.pub`; a token with more is refused
/// ("bad claims"). Each glob is matched on every `sub`/`pub`, so the list is bounded.
pub const MAX_GLOBS: usize = 256;
/// Longest glob in bytes (a channel name is at most 128 bytes, plus wildcards).
pub const MAX_GLOB_BYTES: usize = 256;
/// Longest `sub` claim in bytes.
pub const MAX_SUB_BYTES: usize = 256;
/// Largest `info` claim by default (`presence.info_max_bytes`), in bytes of compact JSON.
pub const DEFAULT_INFO_MAX_BYTES: usize = 1024;

/// Why a token was refused. Each is answered with HTTP 401 at the upgrade (the body is
/// [`AuthError::reason`]) or, for a `refresh`, with close 4003.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No token: no `?token=` on the upgrade URL and no `Authorization: Bearer`.
    Missing,
    /// Not three base64url parts with a JSON header (RFC 7515 §7.1).
    Malformed,
    /// The header's `alg` is not the one the configured key allows (`none`, or HS256 where an
    /// RS256 key is configured, …).
    Algorithm,
    /// The signature does not verify with the configured key.
    Signature,
    /// `exp` is in the past (beyond `auth.jwt_leeway_ms`).
    Expired,
    /// `nbf` is in the future (beyond `auth.jwt_leeway_ms`).
    NotYetValid,
    /// `iss` is missing or differs from `auth.jwt_issuer`.
    Issuer,
    /// `aud` is missing or does not contain `auth.jwt_audience`.
    Audience,
    /// A claim is missing or has the wrong shape: `sub` (a non-empty string of at most
    /// [`MAX_SUB_BYTES`]), `exp`/`nbf` (NumericDate, RFC 7519 §2), `channels`, or `info` larger
    /// than `presence.info_max_bytes`.
    Claims,
    /// The upgrade carries more than one token: `token` repeated in the query, or a token in
    /// both the query and `Authorization` (answered 400, not 401).
    Ambiguous,
    /// The token verifies but was revoked (`POST /api/revoke`, by its `jti` or its user).
    Revoked,
}

impl AuthError {
    /// A short, stable reason: the body of the 401 answer and the log line. Never contains
    /// the token.
    pub fn reason(self) -> &'static str {
        match self {
            AuthError::Missing => "missing token",
            AuthError::Malformed => "malformed token",
            AuthError::Algorithm => "algorithm not accepted",
            AuthError::Signature => "bad signature",
            AuthError::Expired => "token expired",
            AuthError::NotYetValid => "token not yet valid",
            AuthError::Issuer => "wrong issuer",
            AuthError::Audience => "wrong audience",
            AuthError::Claims => "bad claims",
            AuthError::Ambiguous => "more than one token: send one, in ?token= or in Authorization",
            AuthError::Revoked => "token revoked",
        }
    }
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for AuthError {}

/// What a verified token allows: the user and the channel globs (matched with
/// [`glob_match`]). Globs are sorted and deduplicated, so two tokens that allow the same
/// things compare equal and share one interned entry ([`grants::Grants`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Grant {
    /// The `sub` claim: the user id.
    pub user: Box<str>,
    /// `channels.sub`: channels the connection may subscribe to.
    pub subscribe: Box<[Box<str>]>,
    /// `channels.pub`: channels the connection may publish to.
    pub publish: Box<[Box<str>]>,
    /// The `info` claim, compact JSON (at most `presence.info_max_bytes`): what the other
    /// members of a presence channel see of this connection besides its user.
    pub info: Option<Box<str>>,
}

impl Grant {
    /// Whether `ch` matches one of the `channels.sub` globs.
    pub fn may_subscribe(&self, ch: &str) -> bool {
        self.subscribe.iter().any(|g| glob_match(g, ch))
    }

    /// Whether `ch` matches one of the `channels.pub` globs.
    pub fn may_publish(&self, ch: &str) -> bool {
        self.publish.iter().any(|g| glob_match(g, ch))
    }
}

/// A verified token: what it allows, when it expires, and what a revocation matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// User and channel globs.
    pub grant: Grant,
    /// `exp` as milliseconds since the Unix epoch (RFC 7519 §4.1.4), leeway not included.
    pub exp_ms: u64,
    /// The `jti` claim (RFC 7519 §4.1.7), 1–[`revoke::MAX_JTI_BYTES`] bytes, when present.
    /// Kept outside the grant, so tokens that differ only by id still share one interned
    /// grant.
    pub jti: Option<Box<str>>,
    /// The `iat` claim in seconds since the Unix epoch (RFC 7519 §4.1.6), when present.
    pub iat_s: Option<u64>,
}

impl Verified {
    /// The claims a revocation matches ([`revoke::Revocations::refuses`]).
    pub fn token_id(&self) -> revoke::TokenId<'_> {
        revoke::TokenId { user: &self.grant.user, jti: self.jti.as_deref(), iat_s: self.iat_s }
    }
}

/// The claims tether reads; others are ignored. `iss` and `aud` are checked
/// by `jsonwebtoken` when configured.
#[derive(Deserialize)]
struct Claims {
    sub: String,
    #[serde(deserialize_with = "numeric_date_ms")]
    exp: u64,
    #[serde(default, deserialize_with = "some_numeric_date_ms")]
    nbf: Option<u64>,
    /// Read for revocations by user: a token issued after one passes.
    #[serde(default, deserialize_with = "some_numeric_date_ms")]
    iat: Option<u64>,
    /// Read for revocations by token id; a string of 1–`MAX_JTI_BYTES` bytes.
    #[serde(default)]
    jti: Option<String>,
    #[serde(default)]
    channels: ChannelClaims,
    /// Checked by `jsonwebtoken` against `jwt_issuer`, which also accepts an array holding
    /// it; tether wants one string (RFC 7519 §4.1.1 makes `iss` a StringOrURI).
    #[serde(default)]
    iss: Option<serde_json::Value>,
    /// Shown to the other members of presence channels (docs/protocol.md, "Presence").
    #[serde(default)]
    info: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Deserialize, Default)]
struct ChannelClaims {
    #[serde(default)]
    sub: Vec<String>,
    #[serde(default, rename = "pub")]
    publish: Vec<String>,
}

/// A NumericDate (RFC 7519 §2: seconds since the epoch, fractions allowed) in milliseconds.
/// Anything but a non-negative finite number is an error, so a string `exp` or `nbf` can never
/// pass as "absent" (the type confusion of CVE-2026-25537).
fn numeric_date_ms<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    match (n.as_u64(), n.as_f64()) {
        (Some(s), _) => Ok(s.saturating_mul(1000)),
        (None, Some(f)) if f.is_finite() && f >= 0.0 => Ok((f * 1000.0) as u64),
        _ => Err(serde::de::Error::custom("NumericDate must be a non-negative number")),
    }
}

fn some_numeric_date_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    numeric_date_ms(d).map(Some)
}

/// The header field tether reads before verifying, to refuse a foreign `alg` by name.
#[derive(Deserialize)]
struct Header {
    alg: String,
}

/// Verifies tokens for one configured key. Built once at start ([`Verifier::from_config`]),
/// shared read-only by every core.
#[derive(Clone)]
pub struct Verifier {
    alg: Algorithm,
    key: DecodingKey,
    validation: Validation,
    leeway_ms: u64,
    /// Largest `info` claim accepted, in bytes of compact JSON (`presence.info_max_bytes`).
    info_max_bytes: usize,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key stays out of logs and panics.
        f.debug_struct("Verifier").field("alg", &self.alg).field("leeway_ms", &self.leeway_ms).finish_non_exhaustive()
    }
}

impl Verifier {
    /// The verifier `[auth]` asks for, or `None` when JWT auth is off (no section, or neither
    /// `jwt_hs256_secret` nor `jwt_public_key_file`). Reads `jwt_public_key_file` (once: call
    /// this at start).
    ///
    /// # Errors
    /// A [`ConfigError`] naming `auth.jwt_public_key_file` when the file cannot be read or is
    /// not a PEM public key (`-----BEGIN PUBLIC KEY-----`, or `RSA PUBLIC KEY`) of RSA, EC
    /// P-256 or Ed25519.
    pub fn from_config(auth: Option<&Auth>) -> Result<Option<Verifier>, ConfigError> {
        let Some(auth) = auth.filter(|a| a.jwt_enabled()) else { return Ok(None) };
        let (alg, key) = if !auth.jwt_hs256_secret.is_empty() {
            let key = DecodingKey::from_secret(auth.jwt_hs256_secret.as_bytes())
                .map_err(|e| ConfigError::new("auth.jwt_hs256_secret", "\"…\"", format!("unusable secret: {e}")))?;
            (Algorithm::HS256, key)
        } else {
            load_public_key(&auth.jwt_public_key_file)?
        };
        Ok(Some(Verifier::new(alg, key, auth)))
    }

    /// A verifier for `key`, accepting only `alg`, with the claim checks of `auth`
    /// (`jwt_issuer`, `jwt_audience`, `jwt_leeway_ms`).
    pub fn new(alg: Algorithm, key: DecodingKey, auth: &Auth) -> Verifier {
        let mut validation = Validation::new(alg);
        // exp and nbf are checked here, in milliseconds with `jwt_leeway_ms` and a clock the
        // caller passes in; jsonwebtoken only checks that they are present and numbers.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.leeway = 0;
        let mut required = vec!["exp", "sub"];
        if auth.jwt_issuer.is_empty() {
            validation.iss = None;
        } else {
            validation.set_issuer(&[auth.jwt_issuer.as_str()]);
            required.push("iss");
        }
        if auth.jwt_audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&[auth.jwt_audience.as_str()]);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        Verifier { alg, key, validation, leeway_ms: auth.jwt_leeway_ms, info_max_bytes: DEFAULT_INFO_MAX_BYTES }
    }

    /// This verifier, refusing tokens whose `info` claim is larger than `bytes` of compact
    /// JSON (`presence.info_max_bytes`; [`DEFAULT_INFO_MAX_BYTES`] otherwise).
    pub fn with_info_limit(mut self, bytes: usize) -> Verifier {
        self.info_max_bytes = bytes;
        self
    }

    /// The one algorithm accepted.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// `auth.jwt_leeway_ms`: clock skew tolerated on `exp` and `nbf`.
    pub fn leeway_ms(&self) -> u64 {
        self.leeway_ms
    }

    /// Verifies `token` (the compact serialization, RFC 7515 §7.1) at `now_ms` (milliseconds
    /// since the Unix epoch): header `alg`, signature, `iss`/`aud` when configured, `exp` and
    /// `nbf` with the leeway, and the claims' shapes.
    ///
    /// # Errors
    /// The first check that fails, as an [`AuthError`] ([`AuthError::Missing`] for an empty
    /// token).
    pub fn verify(&self, token: &str, now_ms: u64) -> Result<Verified, AuthError> {
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        let header = token.split('.').next().ok_or(AuthError::Malformed)?;
        let header =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header).map_err(|_| AuthError::Malformed)?;
        let header: Header = serde_json::from_slice(&header).map_err(|_| AuthError::Malformed)?;
        if header.alg.parse::<Algorithm>().ok() != Some(self.alg) {
            return Err(AuthError::Algorithm);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|e| map_error(&e))?;
        let c = data.claims;
        if self.validation.iss.is_some() && !c.iss.as_ref().is_some_and(serde_json::Value::is_string) {
            return Err(AuthError::Issuer);
        }
        if now_ms > c.exp.saturating_add(self.leeway_ms) {
            return Err(AuthError::Expired);
        }
        if c.nbf.is_some_and(|nbf| nbf > now_ms.saturating_add(self.leeway_ms)) {
            return Err(AuthError::NotYetValid);
        }
        // An `iat` far in the future is refused too: a revocation of a user's tokens "issued
        // until now" compares `iat`, which such a token would escape. An issuer's clock a
        // little ahead of this one's is tolerated (IAT_SKEW_MS beyond the leeway).
        if c.iat.is_some_and(|iat| iat > now_ms.saturating_add(self.leeway_ms + IAT_SKEW_MS)) {
            return Err(AuthError::NotYetValid);
        }
        if c.sub.is_empty() || c.sub.len() > MAX_SUB_BYTES {
            return Err(AuthError::Claims);
        }
        let info = match c.info.filter(|i| i.get() != "null") {
            None => None,
            Some(raw) => {
                let compact = crate::protocol::compact_json(raw.get());
                if compact.len() > self.info_max_bytes {
                    return Err(AuthError::Claims);
                }
                Some(compact.into_owned().into_boxed_str())
            }
        };
        if c.jti.as_ref().is_some_and(|j| j.is_empty() || j.len() > revoke::MAX_JTI_BYTES) {
            return Err(AuthError::Claims);
        }
        let grant =
            Grant { user: c.sub.into(), subscribe: globs(c.channels.sub)?, publish: globs(c.channels.publish)?, info };
        let (jti, iat_s) = (c.jti.map(String::into_boxed_str), c.iat.map(|ms| ms / 1000));
        Ok(Verified { grant, exp_ms: c.exp, jti, iat_s })
    }
}

/// How far (milliseconds) beyond `auth.jwt_leeway_ms` a token's `iat` may be ahead of this
/// server's clock: a token issued later than that is refused as not yet valid.
pub const IAT_SKEW_MS: u64 = 60_000;

/// Milliseconds since the Unix epoch by the wall clock (token times are wall-clock times;
/// zero if the clock is before 1970).
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Sorted, deduplicated, bounded globs.
fn globs(mut list: Vec<String>) -> Result<Box<[Box<str>]>, AuthError> {
    if list.len() > MAX_GLOBS || list.iter().any(|g| g.is_empty() || g.len() > MAX_GLOB_BYTES) {
        return Err(AuthError::Claims);
    }
    list.sort_unstable();
    list.dedup();
    Ok(list.into_iter().map(String::into_boxed_str).collect())
}

fn map_error(e: &jsonwebtoken::errors::Error) -> AuthError {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::InvalidToken | K::Base64(_) | K::Utf8(_) => AuthError::Malformed,
        K::InvalidAlgorithm | K::MissingAlgorithm | K::UnsupportedAlgorithm | K::InvalidAlgorithmName => {
            AuthError::Algorithm
        }
        K::InvalidIssuer => AuthError::Issuer,
        K::InvalidAudience => AuthError::Audience,
        K::MissingRequiredClaim(c) if c == "iss" => AuthError::Issuer,
        K::MissingRequiredClaim(c) if c == "aud" => AuthError::Audience,
        K::ExpiredSignature => AuthError::Expired,
        K::ImmatureSignature => AuthError::NotYetValid,
        K::MissingRequiredClaim(_) | K::InvalidClaimFormat(_) | K::InvalidSubject | K::Json(_) => AuthError::Claims,
        // Key errors cannot happen with a key checked at start; refuse as unverifiable.
        _ => AuthError::Signature,
    }
}

/// Reads a PEM public key and picks the one algorithm it verifies: RS256 (RSA), ES256 (EC
/// P-256) or EdDSA (Ed25519).
fn load_public_key(path: &Path) -> Result<(Algorithm, DecodingKey), ConfigError> {
    let field = "auth.jwt_public_key_file";
    let shown = format!("{:?}", path.display().to_string());
    let pem =
        std::fs::read(path).map_err(|e| ConfigError::new(field, &shown, format!("cannot read the key file: {e}")))?;
    let candidates = [
        (Algorithm::RS256, DecodingKey::from_rsa_pem(&pem)),
        (Algorithm::ES256, DecodingKey::from_ec_pem(&pem)),
        (Algorithm::EdDSA, DecodingKey::from_ed_pem(&pem)),
    ];
    let Some((alg, key)) = candidates.into_iter().find_map(|(alg, k)| k.ok().map(|k| (alg, k))) else {
        return Err(ConfigError::new(
            field,
            &shown,
            "not a PEM public key (-----BEGIN PUBLIC KEY-----) of RSA, EC P-256 or Ed25519",
        ));
    };
    // Building a verifier parses the key for `alg` (an EC key of another curve fails here);
    // the dummy signature only has to be well-formed base64url.
    if jsonwebtoken::crypto::verify("AA", b"probe", &key, alg).is_err() {
        return Err(ConfigError::new(
            field,
            &shown,
            format!("not a usable {alg:?} public key (EC keys must be P-256)"),
        ));
    }
    Ok((alg, key))
}

#[cfg(test)]
mod tests;
