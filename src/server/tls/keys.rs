//! The certificate and key a core hands to new TLS handshakes ([`Keys`]), read from the
//! `[tls]` files at start and again at `SIGHUP` ([`Keys::reload`]): a pair that cannot be read
//! or does not match is refused with the file that failed, and the pair in use stays.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ServerConfig;
use rustls::sign::CertifiedKey;

use crate::config::Tls;

/// ALPN protocol ids offered (RFC 7301): HTTP/1.1 only, the one tether speaks (a WebSocket
/// upgrade, RFC 6455, and every HTTP endpoint ride on it).
pub const ALPN: &[&[u8]] = &[b"http/1.1"];

/// A `[tls]` pair that could not be used: the file that failed and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    /// The file that failed (`tls.cert_file` or `tls.key_file`).
    pub file: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.reason)
    }
}

impl std::error::Error for KeyError {}

/// The crypto provider of every TLS connection: *ring*, the one the Redis and DynamoDB links
/// already build (one provider in the binary; docs/architecture.md, "TLS").
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads the certificate chain at `cert` and the key at `key` and checks that the key is the
/// leaf certificate's (RFC 5280 SubjectPublicKeyInfo compared). Errors name the file that
/// failed: unreadable, no PEM certificate / key in it, a key the provider cannot load, or a
/// key that does not match the certificate (then the key file is named).
pub fn load_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, KeyError> {
    let failed = |file: &Path, reason: String| KeyError { file: file.to_path_buf(), reason };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| failed(cert, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(failed(cert, "no PEM certificate (BEGIN CERTIFICATE) in it".into()));
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            failed(key, "no PEM private key (PKCS#8, PKCS#1 or SEC1) in it".into())
        }
        e => failed(key, e.to_string()),
    })?;
    let signing = provider.key_provider.load_private_key(der).map_err(|e| failed(key, e.to_string()))?;
    let pair = CertifiedKey::new(chain, signing);
    match pair.keys_match() {
        Ok(()) => Ok(Arc::new(pair)),
        // The provider cannot say (no public key for this key type): rustls accepts it too.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(Arc::new(pair)),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(failed(key, format!("the key does not match the certificate in {}", cert.display())))
        }
        Err(e) => Err(failed(cert, e.to_string())),
    }
}

/// The server configuration of new handshakes with `pair`: TLS 1.3 and 1.2 only, ALPN
/// `http/1.1`, no client certificates; the traffic keys can be taken once the handshake is
/// done (tether's record layer protects the records after it, `super::record`).
pub fn server_config(pair: Arc<CertifiedKey>, provider: Arc<CryptoProvider>) -> Arc<ServerConfig> {
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(pair)));
    cfg.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    cfg.enable_secret_extraction = true;
    Arc::new(cfg)
}

/// The pair new handshakes use, shared by every core, swapped whole at reload (a connection
/// keeps the configuration it started its handshake with).
#[derive(Debug)]
pub struct Keys {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<ServerConfig>>,
    /// Reloads that took effect and that were refused: `[ok, failed]` (`tether_tls_reloads_total`).
    pub reloads: [AtomicU64; 2],
}

impl Keys {
    /// Reads the `[tls]` pair. Errors: [`load_pair`]'s, naming the file.
    pub fn load(t: &Tls) -> Result<Keys, KeyError> {
        let provider = provider();
        let pair = load_pair(&t.cert_file, &t.key_file, &provider)?;
        Ok(Keys {
            cert_file: t.cert_file.clone(),
            key_file: t.key_file.clone(),
            current: RwLock::new(server_config(pair, provider.clone())),
            provider,
            reloads: Default::default(),
        })
    }

    /// The configuration a handshake starting now uses.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reads the files again (`SIGHUP`): a usable pair replaces the current one for new
    /// handshakes; otherwise the current pair stays and the error names the file that failed.
    /// Either outcome is logged and counted.
    pub fn reload(&self) -> Result<(), KeyError> {
        match load_pair(&self.cert_file, &self.key_file, &self.provider) {
            Ok(pair) => {
                let cfg = server_config(pair, self.provider.clone());
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = cfg;
                self.reloads[0].fetch_add(1, Relaxed);
                tracing::info!(cert_file = %self.cert_file.display(), key_file = %self.key_file.display(), "TLS certificate reloaded; new handshakes use it");
                Ok(())
            }
            Err(e) => {
                self.reloads[1].fetch_add(1, Relaxed);
                tracing::error!(file = %e.file.display(), error = %e.reason, "TLS reload refused; the certificate in use stays");
                Err(e)
            }
        }
    }
}
