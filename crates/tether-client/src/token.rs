//! Where the client gets its JWT (docs/security.md), and how it travels: as `?token=` on the
//! upgrade URL, percent-encoded, the way a browser has to send it.
//!
//! The source is asked at every connection attempt and when the server says
//! `token_expired`; a source that returns the token the connection already holds (a fixed
//! token) sends no `refresh`, and the connection is closed with 4001 at the end of the grace,
//! after which the reconnect asks the source again.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Characters left as they are in a query value: RFC 3986 §2.3 unreserved. A JWT (base64url
/// and dots) passes unchanged.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// A function that returns a fresh token, or why it cannot.
type TokenFn = dyn Fn() -> Result<String, String> + Send + Sync;

/// Where a [`Client`](super::Client) gets the token it connects with
/// ([`ClientConfig::token`](super::ClientConfig::token)).
#[derive(Clone)]
pub struct TokenSource(Arc<TokenFn>);

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token itself.
        f.write_str("TokenSource(..)")
    }
}

impl TokenSource {
    /// Always `token` (e.g. `tether sub --token`): the connection lives until the token
    /// expires plus the server's grace, and reconnects are refused once it has expired.
    pub fn fixed(token: impl Into<String>) -> TokenSource {
        let token = token.into();
        TokenSource(Arc::new(move || Ok(token.clone())))
    }

    /// A callback returning a fresh token, called (on the client's task, so it should not
    /// block for long) before each connection attempt and on `token_expired`. An `Err` is
    /// reported as a failed connection attempt (retried with backoff), or, on
    /// `token_expired`, leaves the connection to its 4001 close and reconnect.
    pub fn from_fn(f: impl Fn() -> Result<String, String> + Send + Sync + 'static) -> TokenSource {
        TokenSource(Arc::new(f))
    }

    /// The content of the file at `path`, read again each time (trimmed), so a process that
    /// rotates the file keeps the client's token fresh (`tether sub --token-file`).
    pub fn file(path: impl Into<PathBuf>) -> TokenSource {
        let path = path.into();
        TokenSource(Arc::new(move || {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("token file {}: {e}", path.display()))?;
            Ok(text.trim().to_string())
        }))
    }

    /// A token now: the source's answer, or why there is none (an empty token is an error).
    pub fn fetch(&self) -> Result<String, String> {
        (self.0)()
            .and_then(|t| if t.is_empty() { Err("the token source returned an empty token".into()) } else { Ok(t) })
    }
}

/// `url` with `token=<token, percent-encoded>` as its only `token` query parameter (any
/// `token` already in the URL is dropped: the server refuses a repeated one with 400), added
/// before any `#fragment`.
pub(super) fn url_with_token(url: &str, token: &str) -> String {
    let (base, fragment) = url.split_once('#').map_or((url, None), |(b, f)| (b, Some(f)));
    let (path, query) = base.split_once('?').map_or((base, ""), |(p, q)| (p, q));
    let mut out = path.to_owned();
    let mut sep = '?';
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let key = pair.split_once('=').map_or(pair, |(k, _)| k);
        if tether_proto::http::percent_decode(&key.replace('+', " ")).as_deref() == Some("token") {
            continue;
        }
        out.push(sep);
        out.push_str(pair);
        sep = '&';
    }
    out.push(sep);
    out.push_str(&format!("token={}", utf8_percent_encode(token, QUERY_VALUE)));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_goes_into_the_query_percent_encoded() {
        assert_eq!(url_with_token("ws://h:1/ws", "a.b-c_d"), "ws://h:1/ws?token=a.b-c_d");
        assert_eq!(url_with_token("ws://h:1/ws?x=1", "t"), "ws://h:1/ws?x=1&token=t");
        assert_eq!(url_with_token("ws://h:1/ws?token=old&x=1&tok%65n=o2", "t"), "ws://h:1/ws?x=1&token=t");
        assert_eq!(url_with_token("ws://h:1/ws#f", "a b&c=d+/"), "ws://h:1/ws?token=a%20b%26c%3Dd%2B%2F#f");
        // What the server decodes is what was sent.
        let q = url_with_token("ws://h/ws", "x&y=z é+").split_once('?').map(|(_, q)| q.to_string()).expect("query");
        assert_eq!(tether_proto::http::query_param(&q, "token").as_deref(), Some("x&y=z é+"));
    }

    #[test]
    fn sources() {
        assert_eq!(TokenSource::fixed("t1").fetch(), Ok("t1".into()));
        assert!(TokenSource::fixed("").fetch().is_err());
        let n = std::sync::atomic::AtomicU32::new(0);
        let counting =
            TokenSource::from_fn(move || Ok(format!("t{}", n.fetch_add(1, std::sync::atomic::Ordering::Relaxed))));
        assert_eq!((counting.fetch(), counting.fetch()), (Ok("t0".into()), Ok("t1".into())));
        let path = std::env::temp_dir().join(format!("tether-token-{}-{}", std::process::id(), rand::random::<u32>()));
        let file = TokenSource::file(&path);
        assert!(file.fetch().is_err_and(|e| e.contains("token file")));
        std::fs::write(&path, "abc\n").expect("write");
        assert_eq!(file.fetch(), Ok("abc".into()));
        std::fs::write(&path, "def").expect("write");
        assert_eq!(file.fetch(), Ok("def".into()), "read again each time");
        let _ = std::fs::remove_file(&path);
        assert_eq!(format!("{:?}", TokenSource::fixed("secret")), "TokenSource(..)");
    }
}
