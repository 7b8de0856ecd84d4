//! TLS on tether itself (`[tls]`; docs/architecture.md, "TLS"): between a core's socket calls
//! and the sans-IO session, with rustls' unbuffered API.
//!
//! - [`keys`]: the certificate and key of new handshakes, read at start and at `SIGHUP`.
//! - `handshake`: the handshake, made by rustls, and the hand-over of its traffic keys.
//! - [`record`]: tether's record layer after the handshake (AEAD record protection, alerts,
//!   KeyUpdate, the confidentiality limit).
//! - [`io`]: a TLS connection's read path (records decrypted in the core's read scratch
//!   buffer, the plaintext handed to the session as a plain connection's bytes are) and send
//!   path (what the session queued, sealed into a per-core scratch buffer and written from
//!   there).
//!
//! A TLS connection is a plain [`Conn`](super::conn::Conn) with [`IoFlags::TLS`] set and a
//! [`TlsConn`] in the core's side table [`TlsConns`], keyed by slab key: a plain connection
//! does not grow by a byte. rustls makes the handshake; then tether protects the records itself
//! ([`record`]), so an idle TLS connection holds its raw traffic keys and sequence numbers (and
//! for TLS 1.3 rustls' `KernelConnection`, for KeyUpdate) and no buffer: only ciphertext the
//! socket did not take and a partial incoming record are kept, and released once drained.
//!
//! [`IoFlags::TLS`]: super::conn::IoFlags::TLS

mod handshake;
pub mod io;
pub mod keys;
pub mod record;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use rustls::server::{ServerConfig, UnbufferedServerConnection};

/// Who protects a TLS connection's records.
pub enum Phase {
    /// rustls, through the handshake (unbuffered: it owns no record buffer; boxed, as it is
    /// dropped when the handshake is done).
    Handshake(Box<UnbufferedServerConnection>),
    /// tether ([`record::Layer`]), from the end of the handshake: the raw traffic keys.
    Traffic(record::Layer),
    /// Neither: the hand-over from rustls failed (the connection is being closed).
    Failed,
}

/// One TLS connection's state beside its [`Conn`](super::conn::Conn) (see the module docs).
pub struct TlsConn {
    /// rustls during the handshake, tether's record layer after it.
    pub(super) phase: Phase,
    /// Received bytes that do not make a whole record yet (empty, with no allocation, between
    /// records).
    pub(super) input: Spill,
    /// Encrypted or encoded bytes the socket did not take yet (empty, with no allocation, once
    /// written).
    pub(super) output: Spill,
    /// Conditions of the connection ([`TlsConn::ESTABLISHED`], …).
    pub(super) flags: u8,
}

impl TlsConn {
    /// The handshake completed (counted in `tether_tls_handshakes_total`).
    pub const ESTABLISHED: u8 = 1;
    /// Our close_notify is encrypted (sent, or waiting in `output`).
    pub const CLOSE_NOTIFY: u8 = 2;
    /// TCP is half-closed once `output` is written (the close_notify went before it).
    pub const FIN_OWED: u8 = 4;
    /// The handshake failed and was counted, so the teardown does not count it again.
    pub const FAILED: u8 = 8;
    /// It took an `accept_rate` token when accepted (its handshake counts against the rate),
    /// so its upgrade does not take a second one.
    pub const RATED: u8 = 16;

    /// A connection whose handshake will use `config`. Errors: rustls refused to start one
    /// (only with a configuration it cannot use).
    pub fn new(config: Arc<ServerConfig>) -> Result<TlsConn, rustls::Error> {
        Ok(TlsConn {
            phase: Phase::Handshake(Box::new(UnbufferedServerConnection::new(config)?)),
            input: Spill::default(),
            output: Spill::default(),
            flags: 0,
        })
    }

    /// Whether every bit of `f` is set.
    pub fn has(&self, f: u8) -> bool {
        self.flags & f == f
    }

    /// The negotiated protocol version (`TLSv1_3`, `TLSv1_2`), once the handshake got that far.
    pub fn version(&self) -> Option<rustls::ProtocolVersion> {
        match &self.phase {
            Phase::Handshake(c) => c.protocol_version(),
            Phase::Traffic(l) if l.tls13() => Some(rustls::ProtocolVersion::TLSv1_3),
            Phase::Traffic(_) => Some(rustls::ProtocolVersion::TLSv1_2),
            Phase::Failed => None,
        }
    }
}

/// Bytes a TLS connection keeps between calls: a record still arriving, or ciphertext the
/// socket did not take. One word while empty, as an idle connection's are (a vector is three),
/// the vector boxed out of line while bytes are held.
#[derive(Default)]
// The box is the point: one word in every `TlsConn` instead of a vector's three, and the
// second allocation exists only while bytes are held.
#[allow(clippy::box_collection)]
pub struct Spill(Option<Box<Vec<u8>>>);

impl Spill {
    /// The bytes held (none while empty).
    pub fn bytes(&self) -> &[u8] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }

    /// The bytes held, writable (rustls decrypts a held record in place).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Some(v) => v.as_mut_slice(),
            None => &mut [],
        }
    }

    /// How many bytes are held.
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// Whether no byte is held.
    pub fn is_empty(&self) -> bool {
        self.bytes().is_empty()
    }

    /// The vector to append to (allocated on first use; [`Spill::consume`] and
    /// [`Spill::clear`] free it).
    pub fn vec(&mut self) -> &mut Vec<u8> {
        self.0.get_or_insert_with(Box::default)
    }

    /// Drops the first `n` bytes (written or processed); frees the memory once none is left.
    pub fn consume(&mut self, n: usize) {
        if let Some(v) = &mut self.0 {
            v.drain(..n);
            if v.is_empty() {
                self.0 = None;
            }
        }
    }

    /// Holds exactly `bytes` (nothing, and no allocation, when empty).
    pub fn set(&mut self, bytes: &[u8]) {
        self.0 = (!bytes.is_empty()).then(|| Box::new(bytes.to_vec()));
    }

    /// Frees what is held.
    pub fn clear(&mut self) {
        self.0 = None;
    }
}

/// The TLS connections of one core, by slab key (only TLS connections have an entry).
#[derive(Default)]
pub struct TlsConns {
    map: HashMap<u32, Box<TlsConn>>,
}

impl TlsConns {
    /// The state of the connection at slab key `key`, when it is a TLS connection and not
    /// lent out ([`TlsConns::take`]).
    pub fn get(&mut self, key: u32) -> Option<&mut TlsConn> {
        self.map.get_mut(&key).map(|b| &mut **b)
    }

    /// Takes the state of `key` out while its records are processed (the session is fed
    /// meanwhile, and may be written to: the send path skips a connection whose state is out).
    pub fn take(&mut self, key: u32) -> Option<Box<TlsConn>> {
        self.map.remove(&key)
    }

    /// Puts `t` in for `key` (a new connection, or one taken out).
    pub fn put(&mut self, key: u32, t: Box<TlsConn>) {
        self.map.insert(key, t);
    }

    /// Every TLS connection of the core (the reclaim step shrinks the table when it emptied).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the core has no TLS connection.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Gives back the table's memory once no TLS connection is left.
    pub fn shrink(&mut self) {
        if self.map.is_empty() {
            self.map = HashMap::new();
        }
    }
}

/// Why a TLS handshake failed (`tether_tls_handshake_failures_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The peer spoke plain text (an HTTP request) to the TLS port.
    Plaintext = 0,
    /// Anything else rustls refused: a bad record, an unsupported version or cipher suite, an
    /// alert from the peer.
    Protocol,
    /// The handshake (TLS, then the HTTP request head) did not finish within
    /// `limits.handshake_timeout_ms`.
    Timeout,
    /// The peer closed or reset TCP before the handshake finished.
    Closed,
    /// Closed at accept, before any handshake: `accept_rate` was exceeded.
    Rate,
}

impl Failure {
    /// Every reason, in label order.
    pub const ALL: [Failure; 5] =
        [Failure::Plaintext, Failure::Protocol, Failure::Timeout, Failure::Closed, Failure::Rate];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Plaintext => "plaintext",
            Failure::Protocol => "protocol",
            Failure::Timeout => "timeout",
            Failure::Closed => "closed",
            Failure::Rate => "accept_rate",
        }
    }
}

/// One core's TLS counters (part of its [`CoreMetrics`](super::metrics::CoreMetrics)).
#[derive(Default)]
pub struct TlsMetrics {
    /// TCP connections accepted on a TLS listener and open now, whatever their state (gauge).
    pub connections: AtomicI64,
    /// Handshakes completed, by version: `[TLS 1.3, TLS 1.2]` (counter).
    pub handshakes: [AtomicU64; 2],
    /// Handshakes that failed, by [`Failure`] (counter).
    pub failures: [AtomicU64; Failure::ALL.len()],
}

impl TlsMetrics {
    /// Counts a failed handshake.
    pub fn failed(&self, why: Failure) {
        self.failures[why as usize].fetch_add(1, Relaxed);
    }
}

/// Appends the `tether_tls_*` families for `cores` (and the reload counters of `keys`, when
/// TLS is on) to a Prometheus text exposition.
pub fn render(out: &mut String, cores: &[super::metrics::CoreMetrics], keys: Option<&keys::Keys>) {
    let _ = writeln!(
        out,
        "# HELP tether_tls_connections TCP connections accepted on a TLS listener and open now (handshaking or not).\n# TYPE tether_tls_connections gauge"
    );
    for (i, m) in cores.iter().enumerate() {
        let _ = writeln!(out, "tether_tls_connections{{core=\"{i}\"}} {}", m.tls.connections.load(Relaxed).max(0));
    }
    let _ = writeln!(
        out,
        "# HELP tether_tls_handshakes_total TLS handshakes completed, by protocol version.\n# TYPE tether_tls_handshakes_total counter"
    );
    for (i, m) in cores.iter().enumerate() {
        for (v, name) in ["TLSv1.3", "TLSv1.2"].iter().enumerate() {
            let n = m.tls.handshakes[v].load(Relaxed);
            let _ = writeln!(out, "tether_tls_handshakes_total{{core=\"{i}\",version=\"{name}\"}} {n}");
        }
    }
    let _ = writeln!(
        out,
        "# HELP tether_tls_handshake_failures_total TLS handshakes that failed, by reason (plaintext, protocol, timeout, closed, accept_rate).\n# TYPE tether_tls_handshake_failures_total counter"
    );
    for (i, m) in cores.iter().enumerate() {
        for f in Failure::ALL {
            let n = m.tls.failures[f as usize].load(Relaxed);
            let _ = writeln!(out, "tether_tls_handshake_failures_total{{core=\"{i}\",reason=\"{}\"}} {n}", f.label());
        }
    }
    if let Some(k) = keys {
        let _ = writeln!(
            out,
            "# HELP tether_tls_reloads_total Certificate reloads (SIGHUP) by result: ok, or failed (the pair in use stayed).\n# TYPE tether_tls_reloads_total counter"
        );
        let _ = writeln!(out, "tether_tls_reloads_total{{result=\"ok\"}} {}", k.reloads[0].load(Relaxed));
        let _ = writeln!(out, "tether_tls_reloads_total{{result=\"failed\"}} {}", k.reloads[1].load(Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_connection_is_one_pointer_in_the_side_table_and_no_byte_in_conn() {
        // The TLS state lives out of line: `Conn` keeps its size (conn.rs checks it) and the
        // side table holds a key and a box per TLS connection.
        let inline = std::mem::size_of::<TlsConn>();
        let kernel = std::mem::size_of::<rustls::kernel::KernelConnection<rustls::server::ServerConnectionData>>();
        eprintln!("TlsConn (boxed, per TLS connection): {inline} bytes");
        eprintln!(
            "  of which record::Layer (raw keys, IVs, sequence numbers): {} bytes",
            std::mem::size_of::<record::Layer>()
        );
        eprintln!("KernelConnection (boxed, TLS 1.3 only, plus its key schedule state): {kernel} bytes");
        eprintln!(
            "UnbufferedServerConnection (boxed, during the handshake only): {} bytes",
            std::mem::size_of::<UnbufferedServerConnection>()
        );
        assert_eq!(std::mem::size_of::<Option<Box<TlsConn>>>(), 8);
        // The idle memory of a TLS connection is measured with a live server
        // (tests/tls_idle_memory.rs, tests/tls_idle_live_bytes.rs). tether's own share is the
        // record layer (two raw keys, IVs, sequence numbers, the limit, the kernel box), the two
        // spills (a word each while empty) and the flags.
        assert_eq!(std::mem::size_of::<Spill>(), 8);
        assert!(inline <= 192, "TlsConn is {inline} bytes");
    }
}
