//! What a TLS 1.3 cipher suite costs tether per connection and per delivery (docs/architecture.md,
//! "TLS"), measured on rustls' own record protection (the `MessageEncrypter` its unbuffered
//! connection seals every record with, on the *ring* provider tether builds):
//!
//! - **Memory**: the heap one direction's record protection holds (the boxed encrypter, i.e.
//!   the expanded AEAD key and the IV), counted by an allocator around its construction; an
//!   established connection holds two (one per direction).
//! - **CPU**: thread CPU time (`CLOCK_THREAD_CPUTIME_ID`) per sealed record for the payload
//!   sizes of a fan-out (a 120 B trade, a 1 KiB order book, a full 16 KiB record), as the
//!   median of `TLS_RECORD_ROUNDS` rounds, each sealing `TLS_RECORD_BYTES` of plaintext per
//!   size and suite (suites alternate within a round), and as a ratio to AES-128-GCM.
//!
//! - **Key setup**: CPU per expansion of a raw traffic key into *ring*'s sealing key (the AES
//!   key schedule and GHASH table, or the ChaCha20 key), what tether's record layer
//!   (src/server/tls/record.rs), which keeps keys unexpanded while idle, pays per read or write
//!   burst; and the inline sizes of what it keeps from rustls ([`KernelConnection`],
//!   [`ExtractedSecrets`]).
//!
//! `cargo bench --bench tls_record`. Env: TLS_RECORD_ROUNDS (5), TLS_RECORD_BYTES (64 MiB).

#[path = "../tests/counting_alloc/mod.rs"]
mod counting_alloc;

use std::sync::atomic::Ordering::Relaxed;

use counting_alloc::{Counting, LIVE};
use rustls::crypto::cipher::{MessageEncrypter, OutboundChunks, OutboundPlainMessage};
use rustls::crypto::ring::cipher_suite as suites;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{ContentType, ExtractedSecrets, ProtocolVersion, SupportedCipherSuite};

#[global_allocator]
static ALLOC: Counting = Counting;

/// Plaintext sizes sealed: a trade, an order book, a full record (RFC 8446 §5.1).
const SIZES: [usize; 3] = [120, 1024, 16384];

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}: a count")))
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A record encrypter for `suite` with traffic keys derived from a fixed secret, as rustls
/// derives them at the end of a handshake (RFC 8446 §7.3), and the heap bytes it holds.
fn encrypter(suite: SupportedCipherSuite) -> (Box<dyn MessageEncrypter>, usize) {
    let s = suite.tls13().expect("a TLS 1.3 suite");
    let expander = s.hkdf_provider.extract_from_secret(None, &[7u8; 48]);
    let key = rustls::internal::derive_traffic_key(expander.as_ref(), s.aead_alg);
    let iv = rustls::internal::derive_traffic_iv(expander.as_ref());
    let before = LIVE.load(Relaxed);
    let enc = s.aead_alg.encrypter(key, iv);
    (enc, LIVE.load(Relaxed) - before)
}

/// CPU nanoseconds per sealed record of `size` plaintext bytes, over `total` bytes.
fn seal_ns(enc: &mut dyn MessageEncrypter, size: usize, total: usize) -> f64 {
    let plain = vec![0x5au8; size];
    let records = (total / size).max(1);
    let t0 = thread_cpu_ns();
    for seq in 0..records as u64 {
        let msg = OutboundPlainMessage {
            typ: ContentType::ApplicationData,
            version: ProtocolVersion::TLSv1_2,
            payload: OutboundChunks::Single(&plain),
        };
        std::hint::black_box(enc.encrypt(msg, seq).expect("seal"));
    }
    (thread_cpu_ns() - t0) as f64 / records as f64
}

/// CPU nanoseconds per expansion of a raw `key` into *ring*'s sealing key for `alg`.
fn setup_ns(alg: &'static ring::aead::Algorithm, key: &[u8], n: usize) -> f64 {
    let t0 = thread_cpu_ns();
    for _ in 0..n {
        let unbound = ring::aead::UnboundKey::new(alg, std::hint::black_box(key)).expect("key length");
        std::hint::black_box(ring::aead::LessSafeKey::new(unbound));
    }
    (thread_cpu_ns() - t0) as f64 / n as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds = env("TLS_RECORD_ROUNDS", 5);
    let total = env("TLS_RECORD_BYTES", 64 << 20);
    let all = [
        ("TLS13_AES_128_GCM_SHA256", suites::TLS13_AES_128_GCM_SHA256),
        ("TLS13_AES_256_GCM_SHA384", suites::TLS13_AES_256_GCM_SHA384),
        ("TLS13_CHACHA20_POLY1305_SHA256", suites::TLS13_CHACHA20_POLY1305_SHA256),
    ];
    let rings = [&ring::aead::AES_128_GCM, &ring::aead::AES_256_GCM, &ring::aead::CHACHA20_POLY1305];
    let mut encs: Vec<_> = all.iter().map(|(_, s)| encrypter(*s)).collect();
    let mut ns = vec![vec![Vec::new(); SIZES.len()]; all.len()];
    let mut setup = vec![Vec::new(); all.len()];
    for _ in 0..rounds {
        for (s, alg) in rings.iter().enumerate() {
            setup[s].push(setup_ns(alg, &[9u8; 32][..alg.key_len()], 200_000));
        }
        for (i, size) in SIZES.iter().enumerate() {
            for (s, (enc, _)) in encs.iter_mut().enumerate() {
                ns[s][i].push(seal_ns(enc.as_mut(), *size, total));
            }
        }
    }
    let base: Vec<f64> = (0..SIZES.len()).map(|i| median(ns[0][i].clone())).collect();
    println!("suite                            heap/direction  key setup  ns per sealed record (× AES-128-GCM), median of {rounds}");
    print!("{:33}{:>14}{:>11}", "", "", "");
    for size in SIZES {
        print!("{:>20}", format!("{size} B"));
    }
    println!();
    for (s, (name, _)) in all.iter().enumerate() {
        print!("{name:33}{:>12} B{:>8.0} ns", encs[s].1, median(setup[s].clone()));
        for i in 0..SIZES.len() {
            let m = median(ns[s][i].clone());
            print!("{:>20}", format!("{m:.0} ({:.2}×)", m / base[i]));
        }
        println!();
    }
    println!(
        "inline: KernelConnection<ServerConnectionData> {} B, ExtractedSecrets {} B, UnbufferedServerConnection {} B",
        std::mem::size_of::<KernelConnection<ServerConnectionData>>(),
        std::mem::size_of::<ExtractedSecrets>(),
        std::mem::size_of::<rustls::server::UnbufferedServerConnection>()
    );
}
