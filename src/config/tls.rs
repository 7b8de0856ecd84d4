//! TLS on tether itself (`[tls]`, docs/configuration.md "TLS"): the certificate chain, its key
//! and where TLS listens. The files are read at start (`tether serve` exits 2 when they are
//! unusable) and again on `SIGHUP` (src/server/tls/keys.rs).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::{Config, ConfigError};

/// `[tls]`: present = TLS is on (docs/configuration.md, "TLS").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// PEM file with the server's certificate chain, leaf first (then intermediates; the root
    /// is not needed). Required. Read at start and at every `SIGHUP`; a reload that fails keeps
    /// the pair in use and logs the file that failed.
    pub cert_file: PathBuf,
    /// PEM file with the private key of the leaf certificate: PKCS#8 (`BEGIN PRIVATE KEY`),
    /// PKCS#1 (`BEGIN RSA PRIVATE KEY`) or SEC1 (`BEGIN EC PRIVATE KEY`). Required. The key
    /// must match the certificate (checked at start and at reload).
    pub key_file: PathBuf,
    /// Address of a separate TLS listener. Absent (the default): `listen` itself speaks TLS
    /// and nothing listens in plain text. Set: TLS is served here and plain text stays on
    /// `listen` (for a proxy or a health check on a private address). Must differ from
    /// `listen`.
    pub listen_tls: Option<SocketAddr>,
    /// Records tether seals under one traffic key at most, before it moves to the next key
    /// (TLS 1.3: a KeyUpdate, RFC 8446 §4.6.3) or closes the connection with close_notify
    /// (TLS 1.2, which has no KeyUpdate). Absent (the default): the cipher suite's
    /// confidentiality limit (AES-128-GCM 2^24 records, AES-256-GCM 2^23 in TLS 1.3 and 2^24 in
    /// TLS 1.2; ChaCha20-Poly1305 none), which this can only lower. Lower: keys change more
    /// often (a 27-byte record and two key derivations each time) and TLS 1.2 connections are
    /// closed sooner. At least 2.
    pub records_per_key: Option<u64>,
}

/// Checks `[tls]`: both files named, `listen_tls` different from `listen`. Whether the files
/// hold a usable pair is checked when they are read (`tether serve` start, `SIGHUP`).
pub(super) fn validate(c: &Config) -> Result<(), ConfigError> {
    let Some(t) = &c.tls else { return Ok(()) };
    for (key, path) in [("tls.cert_file", &t.cert_file), ("tls.key_file", &t.key_file)] {
        if path.as_os_str().is_empty() {
            return Err(ConfigError::new(key, "\"\"", "must name a PEM file"));
        }
    }
    if let Some(n) = t.records_per_key {
        if n < 2 {
            return Err(ConfigError::new("tls.records_per_key", n, "must be at least 2 (a record and the KeyUpdate)"));
        }
    }
    if let Some(addr) = t.listen_tls {
        if addr == c.listen && addr.port() != 0 {
            return Err(ConfigError::new(
                "tls.listen_tls",
                addr,
                "must differ from `listen` (omit it to make `listen` itself speak TLS)",
            ));
        }
    }
    Ok(())
}
