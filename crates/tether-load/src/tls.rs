//! TLS for the load generator: `wss://` and `https://` (RFC 8446 / RFC 5246 through rustls on
//! the ring provider), under the same lean client as plain TCP ([`Transport`]).
//!
//! The client speaks TLS with rustls' buffered `ClientConnection` driven by hand over a tokio
//! `TcpStream` (`readable` + `try_read`, as the plain path), so an open connection costs its
//! socket plus one boxed `ClientConnection`: keys, sequence numbers and rustls' receive buffer
//! (4 KiB; one record, about 17 KiB, while a large one arrives, shrunk at the next read). Plaintext is read into the
//! caller's per-thread scratch buffer; nothing is buffered per connection between reads.
//!
//! Only the CAs of `--ca FILE` (PEM) are trusted, or the system bundle when no file is given;
//! no built-in web roots. Session resumption is off, so every `connect` is a full handshake
//! (what `tether load connect` measures); ALPN offers `http/1.1` (RFC 7301), TLS 1.2 and 1.3.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The CA bundle trusted when `--ca` is not given (Debian's `ca-certificates`).
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Where and how to speak TLS to one server: the client configuration (roots, ALPN, no
/// resumption) and the name its certificate must carry (the URL's host, a DNS name or an IP).
#[derive(Debug, Clone)]
pub struct TlsTarget {
    /// rustls client configuration, shared by every connection to this URL.
    pub config: Arc<ClientConfig>,
    /// The name checked against the certificate (RFC 6125) and sent as SNI when a DNS name.
    pub name: ServerName<'static>,
}

impl PartialEq for TlsTarget {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config) && self.name == other.name
    }
}

impl Eq for TlsTarget {}

impl TlsTarget {
    /// The target for `host` (no port, no brackets) trusting the PEM certificates of `ca`, or
    /// of [`SYSTEM_BUNDLE`] when `None`. Errors: the file unreadable or without a certificate,
    /// a certificate rustls refuses as a root, or a host that is not a DNS name or IP address.
    pub fn new(host: &str, ca: Option<&Path>) -> Result<TlsTarget, String> {
        let path = ca.unwrap_or(Path::new(SYSTEM_BUNDLE));
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(path).map_err(|e| format!("--ca {}: {e}", path.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("--ca {}: {e}", path.display()))?;
            roots.add(cert).map_err(|e| format!("--ca {}: {e}", path.display()))?;
        }
        if roots.is_empty() {
            return Err(format!("--ca {}: no certificate in the file", path.display()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS client: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.resumption = Resumption::disabled();
        let name =
            ServerName::try_from(host.to_string()).map_err(|e| format!("{host:?}: not a TLS server name: {e}"))?;
        Ok(TlsTarget { config: Arc::new(config), name })
    }
}

/// A client's byte stream: plain TCP, or TLS over it.
#[derive(Debug)]
pub enum Transport {
    /// `ws://`, `http://`.
    Plain(TcpStream),
    /// `wss://`, `https://`: the socket and the rustls state (boxed, so a plain connection
    /// does not carry its size).
    Tls(TcpStream, Box<ClientConnection>),
}

/// `io::Read` over a non-blocking tokio socket (`try_read`), for `ClientConnection::read_tls`.
struct TryRead<'a>(&'a TcpStream);

impl Read for TryRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl Transport {
    /// Runs the TLS handshake over `stream` when `tls` is given (plain otherwise). Errors: I/O,
    /// the peer's EOF mid-handshake, or a TLS failure (`InvalidData`: bad certificate, alert).
    pub async fn start(stream: TcpStream, tls: Option<&TlsTarget>) -> io::Result<Transport> {
        let Some(tls) = tls else { return Ok(Transport::Plain(stream)) };
        let mut stream = stream;
        let mut conn = Box::new(ClientConnection::new(tls.config.clone(), tls.name.clone()).map_err(tls_error)?);
        while conn.is_handshaking() {
            flush_tls(&mut stream, &mut conn).await?;
            if !conn.is_handshaking() {
                break;
            }
            stream.readable().await?;
            match conn.read_tls(&mut TryRead(&stream)) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => {
                    conn.process_new_packets().map_err(tls_error)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        // The client's Finished (TLS 1.3) may still be queued.
        flush_tls(&mut stream, &mut conn).await?;
        Ok(Transport::Tls(stream, conn))
    }

    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) | Transport::Tls(s, _) => s,
        }
    }

    /// Writes all of `bytes` (encrypted first over TLS), then whatever TLS records are queued
    /// (an empty `bytes` just flushes those).
    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Transport::Plain(s) => {
                if !bytes.is_empty() {
                    s.write_all(bytes).await?;
                }
                Ok(())
            }
            Transport::Tls(s, conn) => {
                if !bytes.is_empty() {
                    conn.writer().write_all(bytes)?;
                }
                flush_tls(s, conn).await
            }
        }
    }

    /// Plaintext is already decrypted and waiting (TLS only): read it before waiting for the
    /// socket.
    pub fn buffered(&mut self) -> bool {
        match self {
            Transport::Plain(_) => false,
            Transport::Tls(_, conn) => conn.process_new_packets().is_ok_and(|s| s.plaintext_bytes_to_read() > 0),
        }
    }

    /// Reads what is there without waiting: `Ok(0)` at the end of the stream (TCP EOF, or a
    /// TLS `close_notify`), `WouldBlock` when nothing is, `InvalidData` on a TLS error, and
    /// `UnexpectedEof` when a TLS peer closed TCP without `close_notify`.
    pub fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.try_read(dst),
            Transport::Tls(s, conn) => loop {
                match conn.reader().read(dst) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                // No plaintext yet: feed the records that arrived (a partial record stays in
                // rustls until the rest comes).
                conn.read_tls(&mut TryRead(s))?;
                conn.process_new_packets().map_err(tls_error)?;
            },
        }
    }

    /// Waits until something can be read (decrypted plaintext already held counts) and reads
    /// it into `dst`; `Ok(0)` at the end of the stream.
    pub async fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        loop {
            if !self.buffered() {
                self.tcp().readable().await?;
            }
            match self.try_read(dst) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

/// Sends every TLS record rustls has queued.
async fn flush_tls(stream: &mut TcpStream, conn: &mut ClientConnection) -> io::Result<()> {
    while conn.wants_write() {
        let mut records = Vec::new();
        conn.write_tls(&mut records)?;
        stream.write_all(&records).await?;
    }
    Ok(())
}
