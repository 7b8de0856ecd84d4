//! URLs with their secrets taken out, for log lines, `/status` and error messages: a feed URL
//! may carry `user:pass@` or `?token=…`, a Redis URL a password.

/// `url` with its userinfo (RFC 3986 §3.2.1, everything before the last `@` of the
/// authority) replaced by `…` and every query value replaced by `…` (names kept, so a reader
/// still sees which parameters were sent), the fragment dropped:
/// `ws://user:pass@host/x?token=T&from=3#f` → `ws://…@host/x?token=…&from=…`.
/// Text without `scheme://` is treated as a path and only its query is redacted.
pub fn redact_url(url: &str) -> String {
    let url = url.split_once('#').map_or(url, |(u, _)| u);
    let (before_query, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = String::with_capacity(url.len());
    match before_query.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            out.push_str(scheme);
            out.push_str("://");
            match authority.rsplit_once('@') {
                Some((_userinfo, host)) => {
                    out.push_str("…@");
                    out.push_str(host);
                }
                None => out.push_str(authority),
            }
            out.push_str(path);
        }
        None => out.push_str(before_query),
    }
    if let Some(q) = query {
        out.push('?');
        for (i, pair) in q.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((name, _)) => {
                    out.push_str(name);
                    out.push_str("=…");
                }
                None => out.push_str(pair),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn userinfo_and_query_values_are_taken_out() {
        for (url, want) in [
            ("ws://user:pass@host/x?token=T", "ws://…@host/x?token=…"),
            ("wss://h:443/p?a=1&token=s3cr3t&flag#frag", "wss://h:443/p?a=…&token=…&flag"),
            ("redis://:hunter2@cache:6379/0", "redis://…@cache:6379/0"),
            ("rediss://default:p%40ss@cache:6380", "rediss://…@cache:6380"),
            ("redis://a@b@cache:6379", "redis://…@cache:6379"),
            ("ws://host/path@not-userinfo?x=1", "ws://host/path@not-userinfo?x=…"),
            ("ws://host/plain", "ws://host/plain"),
            ("/ws?token=abc", "/ws?token=…"),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn no_secret_survives() {
        for secret in ["pass", "T0KEN", "hunter2"] {
            for url in [
                format!("ws://u:{secret}@h/"),
                format!("ws://h/?token={secret}"),
                format!("ws://h/?a=1&b={secret}&c"),
                format!("ws://{secret}@h:1/?k={secret}#{secret}"),
            ] {
                assert!(!redact_url(&url).contains(secret), "{url} → {}", redact_url(&url));
            }
        }
    }
}
