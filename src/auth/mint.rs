//! `tether token`: mints a JWT that a tether server with `[auth]` accepts, for operators and
//! tests (docs/security.md). HS256 from a secret (`--secret`, or `--config F` reading
//! `auth.jwt_hs256_secret`), or RS256 / ES256 / EdDSA from a PEM private key, the algorithm
//! chosen by the key's type.

use std::path::{Path, PathBuf};
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use crate::config::parse_duration;
use crate::config::Config;

/// Command-line arguments of `tether token`.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// HS256 secret (the server's `auth.jwt_hs256_secret`, at least 32 bytes).
    #[arg(long, conflicts_with_all = ["config", "private_key_file"])]
    pub secret: Option<String>,
    /// Server config file: sign with its `auth.jwt_hs256_secret`; its `auth.jwt_issuer` and
    /// `auth.jwt_audience` become the defaults of --iss and --aud.
    #[arg(long, conflicts_with = "private_key_file")]
    pub config: Option<PathBuf>,
    /// PEM private key (PKCS#8 `PRIVATE KEY`, or `RSA PRIVATE KEY`): RS256 for RSA, ES256 for
    /// EC P-256, EdDSA for Ed25519.
    #[arg(long)]
    pub private_key_file: Option<PathBuf>,
    /// The user id (`sub` claim).
    #[arg(long)]
    pub sub: String,
    /// Lifetime: `exp` = now + this (e.g. 3600s, 15m, 24h).
    #[arg(long, default_value = "3600s", value_parser = parse_duration)]
    pub exp_in: Duration,
    /// A channel glob the token may subscribe to (`channels.sub`); repeatable.
    #[arg(long = "sub-channel")]
    pub sub_channels: Vec<String>,
    /// A channel glob the token may publish to (`channels.pub`); repeatable.
    #[arg(long = "pub-channel")]
    pub pub_channels: Vec<String>,
    /// `iss` claim (must equal the server's `auth.jwt_issuer` when that is set).
    #[arg(long)]
    pub iss: Option<String>,
    /// `aud` claim (must be the server's `auth.jwt_audience` when that is set).
    #[arg(long)]
    pub aud: Option<String>,
    /// `info` claim: JSON shown to the other members of presence channels (e.g.
    /// `'{"name":"Ada"}'`; at most the server's `presence.info_max_bytes`).
    #[arg(long)]
    pub info: Option<String>,
    /// The token id (`jti`, 1–256 bytes), for revoking this one token (`POST /api/revoke`).
    #[arg(long)]
    pub jti: Option<String>,
}

/// The claims `tether token` writes (docs/security.md, token shape).
#[derive(Debug, Clone, Serialize)]
pub struct TokenClaims {
    /// The user id.
    pub sub: String,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// Issued at, seconds since the Unix epoch.
    pub iat: u64,
    /// Not before, seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    /// Issuer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    /// Audience.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aud: Option<String>,
    /// Token id (`POST /api/revoke` by `jti`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    /// Channel globs.
    pub channels: ChannelGlobs,
    /// What the other members of presence channels see besides `sub`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<serde_json::Value>,
}

/// `channels: {"sub": [globs], "pub": [globs]}`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChannelGlobs {
    /// Globs the token may subscribe to.
    pub sub: Vec<String>,
    /// Globs the token may publish to.
    #[serde(rename = "pub")]
    pub publish: Vec<String>,
}

impl TokenClaims {
    /// Claims for `sub` expiring at `exp` (seconds since the epoch), issued now, no channels.
    pub fn new(sub: impl Into<String>, exp: u64) -> TokenClaims {
        TokenClaims {
            sub: sub.into(),
            exp,
            iat: super::unix_now_ms() / 1000,
            nbf: None,
            iss: None,
            aud: None,
            jti: None,
            channels: ChannelGlobs::default(),
            info: None,
        }
    }
}

/// A signing key and the algorithm it signs with.
pub struct Signer {
    alg: Algorithm,
    key: EncodingKey,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("alg", &self.alg).finish_non_exhaustive()
    }
}

impl Signer {
    /// HS256 with `secret` (its UTF-8 bytes as written, as the server reads
    /// `auth.jwt_hs256_secret`).
    ///
    /// # Errors
    /// An empty secret.
    pub fn hs256(secret: &str) -> Result<Signer, String> {
        let key = EncodingKey::from_secret(secret.as_bytes()).map_err(|e| format!("unusable secret: {e}"))?;
        Ok(Signer { alg: Algorithm::HS256, key })
    }

    /// The key in the PEM file at `path`: RS256 for RSA, ES256 for EC P-256, EdDSA for
    /// Ed25519.
    ///
    /// # Errors
    /// The file cannot be read, or is not a PEM private key of those types (the message names
    /// the file).
    pub fn from_pem_file(path: &Path) -> Result<Signer, String> {
        let pem = std::fs::read(path).map_err(|e| format!("--private-key-file {}: {e}", path.display()))?;
        Signer::from_pem(&pem).map_err(|e| format!("--private-key-file {}: {e}", path.display()))
    }

    /// [`Signer::from_pem_file`] on PEM text.
    ///
    /// # Errors
    /// Not a PEM private key of RSA, EC P-256 or Ed25519.
    pub fn from_pem(pem: &[u8]) -> Result<Signer, String> {
        let candidates = [
            (Algorithm::RS256, EncodingKey::from_rsa_pem(pem)),
            (Algorithm::ES256, EncodingKey::from_ec_pem(pem)),
            (Algorithm::EdDSA, EncodingKey::from_ed_pem(pem)),
        ];
        let (alg, key) = candidates
            .into_iter()
            .find_map(|(alg, k)| k.ok().map(|k| (alg, k)))
            .ok_or("not a PEM private key (PKCS#8 `PRIVATE KEY` or `RSA PRIVATE KEY`) of RSA, EC P-256 or Ed25519")?;
        // Signing once parses the key for `alg` (an EC key of another curve fails here).
        jsonwebtoken::crypto::sign(b"probe", &key, alg)
            .map_err(|e| format!("not a usable {alg:?} private key (EC keys must be P-256): {e}"))?;
        Ok(Signer { alg, key })
    }

    /// The algorithm this key signs with.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// The signed token (compact serialization, RFC 7515 §7.1) for `claims`.
    ///
    /// # Errors
    /// Signing failed (a key that passed [`Signer::from_pem`] does not fail).
    pub fn sign(&self, claims: &TokenClaims) -> Result<String, String> {
        jsonwebtoken::encode(&Header::new(self.alg), claims, &self.key).map_err(|e| format!("cannot sign: {e}"))
    }
}

impl TokenArgs {
    /// The token these arguments describe.
    ///
    /// # Errors
    /// No key given, an unreadable key or config file, a config without
    /// `auth.jwt_hs256_secret`; the message names the argument.
    pub fn mint(&self) -> Result<String, String> {
        let mut iss = self.iss.clone();
        let mut aud = self.aud.clone();
        let signer = match (&self.secret, &self.config, &self.private_key_file) {
            (Some(secret), _, _) => Signer::hs256(secret)?,
            (None, Some(path), _) => {
                let cfg = Config::load(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
                let auth = cfg.auth.unwrap_or_default();
                if auth.jwt_hs256_secret.is_empty() {
                    return Err(format!(
                        "--config {}: no auth.jwt_hs256_secret (for a public key, sign with --private-key-file)",
                        path.display()
                    ));
                }
                iss = iss.or((!auth.jwt_issuer.is_empty()).then_some(auth.jwt_issuer));
                aud = aud.or((!auth.jwt_audience.is_empty()).then_some(auth.jwt_audience));
                Signer::hs256(&auth.jwt_hs256_secret)?
            }
            (None, None, Some(path)) => Signer::from_pem_file(path)?,
            (None, None, None) => return Err("give a key: --secret, --config or --private-key-file".into()),
        };
        if self.sub.is_empty() {
            return Err("--sub must not be empty".into());
        }
        let exp = (Duration::from_millis(super::unix_now_ms()) + self.exp_in).as_secs();
        let mut claims = TokenClaims::new(&self.sub, exp);
        claims.iss = iss;
        claims.aud = aud;
        claims.jti = self.jti.clone();
        claims.channels = ChannelGlobs { sub: self.sub_channels.clone(), publish: self.pub_channels.clone() };
        claims.info = match &self.info {
            None => None,
            Some(text) => Some(serde_json::from_str(text).map_err(|e| format!("--info is not JSON: {e}"))?),
        };
        signer.sign(&claims)
    }

    /// Prints the token on stdout; returns the exit code (0, or 2 with the error on stderr).
    pub fn run(&self) -> i32 {
        match self.mint() {
            Ok(token) => {
                println!("{token}");
                0
            }
            Err(e) => {
                eprintln!("tether token: {e}");
                2
            }
        }
    }
}
