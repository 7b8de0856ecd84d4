//! Several server URLs and the order they are tried in.
//!
//! Several tether nodes sharing one broker serve the same channels, and a resume with
//! `from`/`epoch` works on any of them; so a client given several URLs turns a node's death
//! into a resume on another node. [`Rotation`] decides which URL the next connection goes to
//! and how long to wait first:
//!
//! - The first connection goes to the first URL. Every connection, or connection attempt,
//!   that ends with a reconnectable close code or an I/O error moves to the next URL,
//!   round-robin. (A stop code stops the client wherever it comes from, as with one URL.)
//! - Failures are counted in a row; a connection that stayed up `stable_after` (10 s by
//!   default) ends the row, as it resets the backoff's attempt count.
//! - While the row is shorter than the list, the next URL is tried promptly: after
//!   [`Backoff::switch_delay`], uniform in `[0, base]` (500 ms by default), which spreads the
//!   clients of a dead node instead of moving them all in the same instant.
//! - Each time the whole list has failed in a row (failures n, 2n, 3n … for n URLs), the wait
//!   is the full-jitter [`Backoff::next_delay`] and the attempt count grows: it grows once per
//!   round, so each node sees about one attempt per backoff window from each client, as the
//!   single node of a one-URL client does.
//! - A server hint (`retry_after_ms` in a close reason, `Retry-After` on a refused upgrade) is
//!   the floor of either wait.
//!
//! With one URL every failure completes a round, so the waits are exactly those of
//! [`Backoff::next_delay`].

use std::time::Duration;

use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::backoff::Backoff;
use super::ClientError;

/// Splits a comma-separated URL list (`ws://a/ws,ws://b/ws`), trimming the spaces around
/// each entry. Empty entries are kept so that [`check_urls`] can name them.
pub(crate) fn split_urls(list: &str) -> Vec<String> {
    list.split(',').map(|u| u.trim().to_string()).collect()
}

/// Checks a URL list: at least one entry, each `ws://HOST[:PORT]/PATH`. `arg` names where the
/// list came from (`URL` for the command line, `ClientConfig::urls` for the library) so the
/// error says what to fix.
///
/// # Errors
/// [`ClientError::InvalidUrl`] naming `arg`, and the entry when there are several.
pub(crate) fn check_urls(urls: &[String], arg: &str) -> Result<(), ClientError> {
    let n = urls.len();
    if n == 0 {
        return Err(ClientError::InvalidUrl(format!(
            "{arg} is empty: expected ws://HOST:PORT/ws, or several separated by commas"
        )));
    }
    for (i, url) in urls.iter().enumerate() {
        let checked = if url.is_empty() {
            Err(format!("{arg} has an empty entry: expected ws://HOST:PORT/ws, or several separated by commas"))
        } else {
            check_url(url)
        };
        if let Err(e) = checked {
            let e = if n > 1 { format!("{arg} entry {} of {n}: {e}", i + 1) } else { e };
            return Err(ClientError::InvalidUrl(e));
        }
    }
    Ok(())
}

fn check_url(url: &str) -> Result<(), String> {
    let req = url.into_client_request().map_err(|e| format!("{url}: {e}"))?;
    match req.uri().scheme_str() {
        Some("ws") => Ok(()),
        Some("wss") => Err(format!("{url}: wss:// needs TLS, which this build does not include")),
        _ => Err(format!("{url}: expected ws://HOST:PORT/ws")),
    }
}

/// The URL ring and the wait before each reconnection (the rule is in the module doc).
/// Sans-IO: the caller reports how each connection ended and sleeps for the returned delay.
#[derive(Debug)]
pub(crate) struct Rotation {
    urls: Vec<String>,
    current: usize,
    /// Connections and attempts that ended since the last stable connection.
    failed_in_row: usize,
    backoff: Backoff,
}

impl Rotation {
    /// A ring over `urls`, which [`check_urls`] has accepted (not empty).
    pub(crate) fn new(urls: Vec<String>, backoff: Backoff) -> Self {
        debug_assert!(!urls.is_empty(), "check_urls refuses an empty list");
        Self { urls, current: 0, failed_in_row: 0, backoff }
    }

    /// The URL the next connection goes to.
    pub(crate) fn url(&self) -> &str {
        &self.urls[self.current]
    }

    /// The connection (or attempt) on [`url`](Self::url) ended and will be retried. `up` is how
    /// long it was open (`None`: the attempt never opened); `floor` is the server's hint.
    /// Moves to the next URL and returns how long to wait before connecting to it.
    pub(crate) fn ended(&mut self, up: Option<Duration>, floor: Option<Duration>) -> Duration {
        if up.is_some_and(|up| self.backoff.connected_for(up)) {
            self.failed_in_row = 0;
        }
        self.failed_in_row += 1;
        self.current = (self.current + 1) % self.urls.len();
        if self.failed_in_row.is_multiple_of(self.urls.len()) {
            self.backoff.next_delay(floor)
        } else {
            self.backoff.switch_delay(floor)
        }
    }

    /// The backoff's failed-round count (see [`Backoff::attempt`]).
    #[cfg(test)]
    fn attempt(&self) -> u32 {
        self.backoff.attempt()
    }
}

#[cfg(test)]
mod tests {
    use super::super::BackoffConfig;
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn ring(urls: &[&str], seed: u64) -> Rotation {
        Rotation::new(urls.iter().map(|u| u.to_string()).collect(), Backoff::with_seed(BackoffConfig::default(), seed))
    }

    #[test]
    fn split_trims_and_keeps_empty_entries() {
        assert_eq!(split_urls("ws://a/ws"), ["ws://a/ws"]);
        assert_eq!(split_urls("ws://a/ws, ws://b/ws"), ["ws://a/ws", "ws://b/ws"]);
        assert_eq!(split_urls("ws://a/ws,,ws://b/ws"), ["ws://a/ws", "", "ws://b/ws"]);
        assert_eq!(split_urls(""), [""]);
    }

    #[test]
    fn check_names_the_argument_and_the_entry() {
        let err = |urls: &[&str]| {
            let urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
            match check_urls(&urls, "URL") {
                Err(ClientError::InvalidUrl(e)) => e,
                other => panic!("{urls:?}: {other:?}"),
            }
        };
        assert!(check_urls(&["ws://127.0.0.1:1/ws".to_string()], "URL").is_ok());
        assert!(check_urls(&split_urls("ws://a:1/ws,ws://b:2/ws"), "URL").is_ok());
        assert!(err(&[]).starts_with("URL is empty"), "{}", err(&[]));
        assert!(err(&[""]).starts_with("URL has an empty entry"), "{}", err(&[""]));
        let e = err(&["ws://a/ws", "http://b/ws"]);
        assert_eq!(e, "URL entry 2 of 2: http://b/ws: expected ws://HOST:PORT/ws");
        let e = err(&["ws://a/ws", ""]);
        assert!(e.starts_with("URL entry 2 of 2: URL has an empty entry"), "{e}");
        assert!(err(&["wss://a/ws"]).contains("needs TLS"), "one URL keeps today's message");
        assert!(err(&["not a url"]).starts_with("not a url: "));
    }

    #[test]
    fn one_url_waits_exactly_as_the_backoff() {
        let mut r = ring(&["ws://a/ws"], 4);
        let mut b = Backoff::with_seed(BackoffConfig::default(), 4);
        for _ in 0..20 {
            assert_eq!(r.ended(None, None), b.next_delay(None));
            assert_eq!(r.url(), "ws://a/ws");
        }
        assert_eq!(r.attempt(), 20);
    }

    #[test]
    fn next_url_promptly_full_jitter_once_per_round() {
        let urls = ["ws://a/ws", "ws://b/ws", "ws://c/ws"];
        let mut r = ring(&urls, 9);
        assert_eq!(r.url(), urls[0]);
        for round in 0..8u32 {
            for i in 1..=3 {
                let ceiling = r.backoff.ceiling();
                let d = r.ended(None, None);
                assert_eq!(r.url(), urls[i % 3], "round-robin");
                if i < 3 {
                    assert!(d <= 500 * MS, "round {round}: a switch waits at most base, not {d:?}");
                    assert_eq!(r.attempt(), round, "a switch does not grow the attempt count");
                } else {
                    assert!(d <= ceiling, "round {round}: {d:?} > {ceiling:?}");
                    assert_eq!(r.attempt(), round + 1, "a failed round grows it");
                }
            }
        }
        assert_eq!(r.backoff.ceiling(), Duration::from_secs(30));
    }

    #[test]
    fn full_round_waits_the_grown_window() {
        // Across seeds, the wait after a whole failed round reaches far beyond `base` once the
        // attempt count has grown, while every switch stays within it.
        let mut longest_round_wait = Duration::ZERO;
        for seed in 0..50 {
            let mut r = ring(&["ws://a/ws", "ws://b/ws"], seed);
            for _ in 0..6 {
                assert!(r.ended(None, None) <= 500 * MS);
                longest_round_wait = longest_round_wait.max(r.ended(None, None));
            }
        }
        assert!(longest_round_wait > 5 * 500 * MS, "{longest_round_wait:?}");
    }

    #[test]
    fn a_stable_connection_starts_a_new_row() {
        let mut r = ring(&["ws://a/ws", "ws://b/ws"], 5);
        for _ in 0..6 {
            r.ended(None, None);
        }
        assert_eq!((r.url(), r.attempt()), ("ws://a/ws", 3));
        // Up on a for a minute, then it dies: b at once, not after a grown window.
        assert!(r.ended(Some(Duration::from_secs(60)), None) <= 500 * MS);
        assert_eq!((r.url(), r.attempt()), ("ws://b/ws", 0));
        // b refuses too: the whole list failed in a row, full jitter from attempt 0.
        assert!(r.ended(None, None) <= 500 * MS);
        assert_eq!((r.url(), r.attempt()), ("ws://a/ws", 1));
        // A short-lived connection is a failure like any other.
        r.ended(Some(Duration::from_secs(1)), None);
        assert_eq!((r.url(), r.attempt()), ("ws://b/ws", 1));
        r.ended(None, None);
        assert_eq!((r.url(), r.attempt()), ("ws://a/ws", 2));
    }

    #[test]
    fn the_hint_is_the_floor_of_a_switch_too() {
        let mut r = ring(&["ws://a/ws", "ws://b/ws"], 6);
        assert!(r.ended(Some(Duration::from_secs(60)), Some(2500 * MS)) >= 2500 * MS);
        assert!(r.ended(None, Some(45_000 * MS)) >= 45_000 * MS, "above the cap too");
    }
}
