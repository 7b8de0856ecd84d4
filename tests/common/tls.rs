//! A test PKI made with the `openssl` CLI at test time (a CA and leaf certificates for
//! 127.0.0.1), and a rustls client trusting only that CA: TLS connections, wss:// through
//! tokio-tungstenite, raw https:// requests. scripts/setup installs openssl.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::WebSocketStream;

/// A WebSocket over the test client's TLS.
pub type Wss = WebSocketStream<TlsStream<TcpStream>>;

/// A directory of test certificates signed by one CA of its own, removed on drop.
pub struct Pki {
    /// The directory.
    pub dir: PathBuf,
    /// The CA certificate (PEM), the only root the clients trust.
    pub ca: PathBuf,
}

/// A leaf certificate and its key.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Leaf {
    /// The leaf certificate's DER (what a client sees first in the server's chain).
    pub fn der(&self) -> Vec<u8> {
        CertificateDer::from_pem_file(&self.cert).expect("leaf PEM").to_vec()
    }
}

fn openssl(args: &[&str], dir: &Path) {
    let out =
        Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl (scripts/setup installs it)");
    assert!(out.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// `openssl req`: a new P-256 key in `key` (PKCS#8) and, for `subj`, a request in `out` (or a
/// self-signed certificate with `-x509` among `extra`).
fn new_key(dir: &Path, key: &str, out: &str, subj: &str, extra: &[&str]) {
    let mut args = vec!["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    args.extend(["-keyout", key, "-out", out, "-subj", subj]);
    args.extend(extra);
    openssl(&args, dir);
}

impl Pki {
    /// A new CA (P-256) in a fresh temporary directory named after `tag`.
    pub fn new(tag: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("tether-pki-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("pki dir");
        let ca_ext = [
            "-x509",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-days",
            "2",
        ];
        new_key(&dir, "ca.key", "ca.pem", "/CN=tether test CA", &ca_ext);
        let ca = dir.join("ca.pem");
        Pki { dir, ca }
    }

    /// A leaf for 127.0.0.1 and localhost named `name` (its files `name.pem`, `name.key`,
    /// the key PKCS#8), signed by the CA.
    pub fn leaf(&self, name: &str) -> Leaf {
        let ext = self.dir.join(format!("{name}.ext"));
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("ext file");
        let (key, csr, pem) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"));
        let subj = format!("/CN={name}");
        new_key(&self.dir, &key, &csr, &subj, &[]);
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                ext.to_str().unwrap(),
            ],
            &self.dir,
        );
        Leaf { cert: self.dir.join(pem), key: self.dir.join(key) }
    }

    /// A rustls client configuration trusting only this CA, offering ALPN `http/1.1`.
    pub fn client(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(&self.ca).expect("CA PEM")).expect("CA cert");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(cfg)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `[tls]` section serving `leaf` (listen speaks TLS).
pub fn section(leaf: &Leaf) -> String {
    format!("[tls]\ncert_file = {:?}\nkey_file = {:?}\n", leaf.cert, leaf.key)
}

/// A TLS connection to `addr` (verified as 127.0.0.1), handshake done within 10 s.
pub async fn connect(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::IpAddress(addr.ip().into());
    tokio::time::timeout(Duration::from_secs(10), TlsConnector::from(cfg.clone()).connect(name, tcp))
        .await
        .expect("TLS handshake within 10 s")
        .expect("TLS handshake")
}

/// The DER of the leaf certificate the server presented on `s`.
pub fn peer_leaf(s: &TlsStream<TcpStream>) -> Vec<u8> {
    s.get_ref().1.peer_certificates().and_then(|c| c.first()).expect("a server certificate").to_vec()
}

/// wss://ADDR/ws with the test client, upgraded within 10 s.
pub async fn wss(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> Wss {
    let tls = connect(addr, cfg).await;
    let url = format!("wss://{addr}/ws");
    let (ws, _) = tokio::time::timeout(Duration::from_secs(10), tokio_tungstenite::client_async(url, tls))
        .await
        .expect("upgrade within 10 s")
        .expect("upgrade");
    ws
}

/// One HTTP/1.1 request over TLS (`Connection: close`); the whole answer as text, within 10 s.
pub async fn https(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>, method: &str, path: &str, body: &str) -> String {
    let mut s = connect(addr, cfg).await;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("send the request");
    let mut out = Vec::new();
    // A close_notify ends the answer; an EOF without one is an error rustls reports.
    let r = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await.expect("answer within 10 s");
    r.unwrap_or_else(|e| panic!("reading the answer: {e} (got {:?})", String::from_utf8_lossy(&out)));
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET /metrics` over TLS, parsed.
pub async fn metrics(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> super::Metrics {
    let answer = https(addr, cfg, "GET", "/metrics", "").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "GET /metrics over TLS: {}", &answer[..answer.len().min(200)]);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    super::Metrics(body.to_owned())
}
