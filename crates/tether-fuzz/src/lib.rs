//! tether-fuzz — fuzz targets for the parsers that read client bytes and for the session that
//! drives them (docs/security.md, "Fuzzing"), on the sans-IO crate (`tether-proto`) alone.
//!
//! One place for the targets, shared by everything that drives them:
//! - `cargo test`: `tests/fuzz_corpus.rs` replays every file of `corpus/` through every
//!   target and runs the mutation [`engine`] for a bounded time per target
//!   (`TETHER_FUZZ_SECONDS`); `tests/fuzz_properties.rs` checks the same invariants with
//!   `proptest` on generated requests, frame streams, JSON and chunked bodies;
//! - `cargo run --release -p tether-fuzz -- [TARGET…] --seconds N` (`src/main.rs`): the same
//!   engine, as long as wanted, on stable Rust.
//!
//! The targets are plain `fn(&[u8])`, so a libFuzzer or AFL harness needs one line per target.
//!
//! Each target takes raw bytes and panics only when an invariant breaks:
//! - [`handshake`]: the bytes are a client's side of a connection, fed to a real session
//!   ([`Session`](tether_proto::session::Session)) the way a core feeds it: requests parsed
//!   from growing buffers (`parse_request`), bodies (`Content-Length`, chunked), pipelining,
//!   the upgrade checks (`check_upgrade`) and, after a `101`, the frames behind the head.
//!   Invariant: the same requests, refusals, upgrade, output and end state whatever the split
//!   of the input into reads.
//! - [`frames`]: the bytes are a client's frame stream after the upgrade, fed to the codec's
//!   [`Decoder`](tether_proto::ws::codec::Decoder) as the session feeds it and to an upgraded session.
//!   Invariants: the same messages and the same violation whatever the split; the same as
//!   tungstenite's own reader (the oracle, see `oracle.rs` for the documented differences);
//!   the session answers exactly what the decoded messages call for.
//! - [`protocol`]: the bytes are one text message (`parse_client_op`) and one HTTP publish
//!   body (`parse_publish_body`). Invariants: accepted fields are valid (channel names, id
//!   length), `data` comes back compact and means the same JSON, every refusal becomes valid
//!   JSON with its code.
//! - [`http_body`]: the bytes are a chunked request body (`decode_chunked`), a request target
//!   (`percent_decode`) and a query (`query_param`). Invariants: a body is decoded only when
//!   complete and the same for every prefix that holds it, within the size limit.
//!
//! Limits are small ([`MAX_MESSAGE_BYTES`], [`MAX_HEAD_BYTES`], [`MAX_BODY_BYTES`]) so the
//! mutations reach the "too large" paths. Each target returns a [`Signature`]: a hash of the
//! shape of the outcome (which messages, which refusal), not of the payloads; the engine keeps
//! inputs whose signature is new as the coverage-blind stand-in for coverage feedback.
//!
//! # Layout
//! - this file: the targets' table ([`TARGETS`]), split schedules, signatures, limits;
//! - [`engine`]: the mutation engine (seed corpus, mutations, time budget, crash artifacts);
//! - `handshake.rs`, `frames.rs`, `protocol.rs`, `http_body.rs`: one target each;
//! - `oracle.rs`: tungstenite's reader as the frames oracle;
//! - `sim.rs`: a session driven without sockets, as a core drives it.

pub mod engine;
mod frames;
mod handshake;
mod http_body;
mod mutate;
mod oracle;
mod protocol;
mod sim;

use std::hash::{DefaultHasher, Hash, Hasher};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub use frames::{frames, frames_split};
pub use handshake::{handshake, handshake_split};
pub use http_body::{http_body, http_body_split};
pub use protocol::protocol;

/// `limits.max_message_bytes` of the fuzzed decoder and session, in bytes: small, so that
/// 1009 is within reach of a mutation.
pub const MAX_MESSAGE_BYTES: usize = 4096;
/// `limits.max_header_bytes` of the fuzzed session, in bytes (431 beyond).
pub const MAX_HEAD_BYTES: usize = 2048;
/// `limits.max_publish_bytes` of the fuzzed session and chunked decoder, in bytes (413 beyond).
pub const MAX_BODY_BYTES: usize = 4096;
/// Inputs up to this length are also fed one byte at a time (every split point at once).
const BYTEWISE_MAX: usize = 512;

/// A hash of the shape of a target's outcome; equal shapes hash equal within one build.
pub type Signature = u64;

/// One fuzz target: its name (also the corpus folder `corpus/<name>/`), its function and
/// the tokens its mutations may insert.
pub struct Target {
    /// Name, as given on the command line and used for corpus and artifact folders.
    pub name: &'static str,
    /// Runs one input; panics when an invariant breaks.
    pub run: fn(&[u8]) -> Signature,
    /// Byte strings the mutation engine inserts or overwrites with (HTTP tokens, JSON
    /// fragments, frame header bytes).
    pub dictionary: &'static [&'static [u8]],
    /// Whether the engine also mutates whole WebSocket frames (re-framing the stream so that
    /// lengths stay consistent).
    pub reframe: bool,
}

/// Every target, in the order the runners use.
pub const TARGETS: [Target; 4] = [
    Target { name: "handshake", run: handshake, dictionary: mutate::HTTP_TOKENS, reframe: false },
    Target { name: "frames", run: frames, dictionary: mutate::FRAME_TOKENS, reframe: true },
    Target { name: "protocol", run: protocol, dictionary: mutate::JSON_TOKENS, reframe: false },
    Target { name: "http_body", run: http_body, dictionary: mutate::CHUNK_TOKENS, reframe: false },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The most bytes one input of `len` bytes may have allocated at once while a target ran it,
/// on top of what was allocated before: checked by `tests/fuzz_corpus.rs` with a counting
/// allocator ("no unbounded allocation"). Linear in the input (the targets keep a few
/// transcripts of it, one per split schedule, and JSON parsing allocates a few times the text)
/// plus the configured limits (a message being assembled, tungstenite's buffers): a parser
/// that trusts a declared length (`Content-Length`, a frame's payload length, a chunk size)
/// breaks it.
pub fn allocation_bound(len: usize) -> usize {
    64 * len + 8 * MAX_MESSAGE_BYTES + 256 * 1024
}

/// Cut points at which `data` is fed in pieces, besides whole: one schedule with 1–3 cuts, one
/// of pieces of 1–16 bytes, and every point when the input is short. Seeded by the input, so a
/// failure reproduces from the input alone.
pub(crate) fn split_schedules(data: &[u8]) -> Vec<Vec<usize>> {
    let len = data.len();
    let mut rng = SmallRng::seed_from_u64(hash_of(data));
    let mut few: Vec<usize> = (0..rng.random_range(1..=3)).map(|_| rng.random_range(0..=len)).collect();
    few.sort_unstable();
    let mut small = Vec::new();
    let mut at = 0;
    loop {
        at += rng.random_range(1..=16);
        if at >= len {
            break;
        }
        small.push(at);
    }
    let mut all = vec![few, small];
    if len <= BYTEWISE_MAX {
        all.push((1..len).collect());
    }
    all
}

/// `data` cut at `cuts` (positions; out-of-range and unsorted ones are tolerated, so proptest
/// may pass anything): the reads a socket would have delivered.
pub(crate) fn pieces<'a>(data: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(data.len())).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut from = 0;
    for cut in cuts {
        out.push(&data[from..cut]);
        from = cut;
    }
    out.push(&data[from..]);
    out
}

/// Panics unless `split` (the outcome of `data` fed at `cuts`) equals `whole` (fed at once):
/// the split invariant of the `what` target.
pub(crate) fn assert_same_split<T: PartialEq + std::fmt::Debug>(
    what: &str,
    data: &[u8],
    cuts: &[usize],
    whole: &T,
    split: &T,
) {
    if split != whole {
        panic!(
            "{what}: the outcome depends on the split at {cuts:?}\nwhole: {whole:#?}\nsplit: {split:#?}\ninput: {}",
            hex_prefix(data, 512)
        );
    }
}

/// A deterministic hash (within one build) of anything hashable.
pub(crate) fn hash_of(value: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// `len` rounded down to a power of two (0 stays 0): lengths in a signature, so that every
/// payload length does not count as a new shape.
pub(crate) fn bucket(len: usize) -> u32 {
    usize::BITS - len.leading_zeros()
}

/// At most `max` bytes of `data` in hex, for panic messages.
pub(crate) fn hex_prefix(data: &[u8], max: usize) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(2 * max.min(data.len()) + 16);
    for b in data.iter().take(max) {
        let _ = write!(s, "{b:02x}");
    }
    if data.len() > max {
        let _ = write!(s, "… ({} bytes)", data.len());
    }
    s
}
