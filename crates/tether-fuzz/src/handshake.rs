//! The `handshake` target: a client's bytes fed to a session speaking HTTP, whole and split.

use super::sim::{Sim, Transcript};
use super::{assert_same_split, hash_of, pieces, split_schedules, Signature};

/// Feeds `data` to a fresh HTTP session as one read and as several split schedules, and
/// panics unless every run saw the same requests (heads, bodies, what the routes derive from
/// them), the same refusal, the same upgrade, wrote the same bytes and ended the same way.
/// Every accepted request also keeps to the limits (head ≤ `MAX_HEAD_BYTES`, body ≤
/// `MAX_BODY_BYTES`, a body as long as its `Content-Length`).
///
/// Returns the signature of the outcome: request and refusal kinds, not their contents.
pub fn handshake(data: &[u8]) -> Signature {
    let whole = run(&[data]);
    for cuts in split_schedules(data) {
        compare(data, &cuts, &whole);
    }
    signature(&whole)
}

/// [`handshake`] with the given cut points only (positions in `data`; proptest chooses them).
pub fn handshake_split(data: &[u8], cuts: &[usize]) -> Signature {
    let whole = run(&[data]);
    compare(data, cuts, &whole);
    signature(&whole)
}

fn run(pieces: &[&[u8]]) -> Transcript {
    let mut sim = Sim::new();
    let mut s = sim.http_session();
    sim.run(&mut s, pieces)
}

fn compare(data: &[u8], cuts: &[usize], whole: &Transcript) {
    assert_same_split("handshake", data, cuts, whole, &run(&pieces(data, cuts)));
}

/// The kinds of events (the first word of each, and the status of a refusal), the end state.
fn signature(t: &Transcript) -> Signature {
    let kinds: Vec<&str> = t
        .events
        .iter()
        .map(|e| if e.starts_with("refused") { e.as_str() } else { e.split(' ').next().unwrap_or("") })
        .collect();
    hash_of((kinds, &t.end, super::bucket(t.output.len())))
}
