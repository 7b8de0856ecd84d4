//! Bearer credentials on the plain HTTP API (docs/security.md): the publish keys that guard
//! `POST /publish/{channel}` (`auth.publish_keys`), the admin token that guards
//! `/connections` and, with `admin.protect_metrics`, `/metrics` (`admin.token`), and the
//! server API under `/api/` (docs/api.md), behind the publish keys when there are any and the
//! admin rules otherwise.
//!
//! A refusal for credentials is HTTP 401 with `WWW-Authenticate: Bearer` (RFC 6750 §3) and a
//! JSON reason. The admin guard also refuses what a browser can be made to send: a
//! state-changing request from a foreign origin (403), and, when loopback is the only
//! credential, a `Host` that does not name this server by a loopback name or its own address
//! (421, DNS rebinding). Every refusal is counted in `tether_http_auth_failures_total{endpoint}`
//! and logged at debug with the peer's address, never with the credentials sent.

use crate::http::StatusCode;
use std::net::IpAddr;

use subtle::ConstantTimeEq;

use crate::config::{normalize_origin, Config};
use crate::http::{Method, Request};

/// Which guard refused a request: the `endpoint` label of
/// `tether_http_auth_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Guarded {
    /// `POST /publish/{channel}` (`auth.publish_keys`).
    Publish = 0,
    /// `/connections`, `/metrics` with `protect_metrics`, and later admin endpoints
    /// (`admin.token`).
    Admin,
    /// The server API under `/api/` ([`check_api`]).
    Api,
}

/// The `endpoint` label values, in [`Guarded`] order.
pub const GUARDED_NAMES: [&str; 3] = ["publish", "admin", "api"];

/// Why a guarded request was refused: the status (401, 403 or 421), the body and, for a 401,
/// its `WWW-Authenticate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status: 401 (credentials), 403 (a browser's cross-origin request), 421 (a `Host`
    /// this server does not answer to without a token, RFC 9110 §15.5.20).
    pub status: StatusCode,
    /// Short reason, e.g. `missing bearer token`.
    pub reason: &'static str,
    /// The `WWW-Authenticate` value (RFC 6750 §3: `error="invalid_token"` when credentials
    /// were sent but are not valid).
    pub challenge: &'static str,
}

const REALM: &str = "Bearer realm=\"tether\"";
const MISSING: Refusal = Refusal {
    status: StatusCode::UNAUTHORIZED,
    reason: "missing bearer token (Authorization: Bearer …)",
    challenge: REALM,
};
const WRONG: Refusal = Refusal {
    status: StatusCode::UNAUTHORIZED,
    reason: "invalid bearer token",
    challenge: "Bearer realm=\"tether\", error=\"invalid_token\"",
};
const NOT_LOCAL: Refusal = Refusal {
    status: StatusCode::UNAUTHORIZED,
    reason: "admin endpoint: only local peers may call it without admin.token",
    challenge: REALM,
};
const FOREIGN_ORIGIN: Refusal = Refusal {
    status: StatusCode::FORBIDDEN,
    reason: "admin endpoint: a state-changing request from another origin is refused \
             (Origin is neither this server's nor in allowed_origins)",
    challenge: REALM,
};
const CROSS_SITE: Refusal = Refusal {
    status: StatusCode::FORBIDDEN,
    reason: "admin endpoint: a state-changing request from another site is refused (Sec-Fetch-Site)",
    challenge: REALM,
};
const FOREIGN_HOST: Refusal = Refusal {
    status: StatusCode::MISDIRECTED_REQUEST,
    reason: "admin endpoint: without admin.token, Host must be localhost, a loopback address \
             or this server's own address",
    challenge: REALM,
};

/// The two ends of the connection a request came in on, as the kernel reports them: `None`
/// when it no longer knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ends {
    /// The peer's address (`getpeername`).
    pub peer: Option<IpAddr>,
    /// The address the peer connected to (`getsockname`).
    pub local: Option<IpAddr>,
}

/// Whether `given` equals one of `keys`, in time that does not depend on where the bytes
/// differ (`subtle`): every key is compared, with no early exit. Only the length of a key
/// can be learnt from timing, and keys are at least 16 bytes of random text.
pub fn bearer_matches(given: &str, keys: &[String]) -> bool {
    let mut hit = subtle::Choice::from(0);
    for k in keys {
        hit |= k.as_bytes().ct_eq(given.as_bytes());
    }
    hit.into()
}

/// The `auth.publish_keys` guard of `POST /publish/{channel}`: `Ok` when no key is configured
/// or the request's `Authorization: Bearer` names one, else the 401 to send.
pub fn check_publish(cfg: &Config, req: &Request) -> Result<(), Refusal> {
    let Some(keys) = cfg.auth.as_ref().map(|a| &a.publish_keys).filter(|k| !k.is_empty()) else {
        return Ok(());
    };
    match req.bearer.as_deref() {
        None => Err(MISSING),
        Some(b) if bearer_matches(b, keys) => Ok(()),
        Some(_) => Err(WRONG),
    }
}

/// The admin guard, in this order (docs/security.md, "The admin endpoints"):
///
/// 1. A state-changing request (any method but GET and HEAD) that a browser marks as coming
///    from elsewhere is refused with 403, token or not: `Sec-Fetch-Site` other than
///    `same-origin` or `none`, or an `Origin` that is neither this server's own (`http://` or
///    `https://` + `Host`) nor listed in `allowed_origins`. A web page can send a
///    CORS-safelisted POST to `127.0.0.1` without a preflight; this is what stops it.
/// 2. With `admin.token` set, the request must carry it as `Authorization: Bearer` (401).
/// 3. Without one, loopback is the credential, so the request must also name this server:
///    `Host` is `localhost` (or a name under `.localhost`), a loopback address, or the very
///    address the peer connected to (421 otherwise: a DNS-rebound name reaches 127.0.0.1 with
///    the attacker's `Host`); and the peer must be local (`admin.local_peers`, default
///    loopback; 401).
pub fn check_admin(cfg: &Config, req: &Request, ends: Ends) -> Result<(), Refusal> {
    refuse_foreign_browser(cfg, req)?;
    let token = &cfg.admin.token;
    if token.is_empty() {
        if !names_this_server(req.host.as_deref(), ends.local) {
            return Err(FOREIGN_HOST);
        }
        return match ends.peer {
            Some(ip) if cfg.admin.is_local(ip) => Ok(()),
            _ => Err(NOT_LOCAL),
        };
    }
    match req.bearer.as_deref() {
        None => Err(MISSING),
        Some(b) if bearer_matches(b, std::slice::from_ref(token)) => Ok(()),
        Some(_) => Err(WRONG),
    }
}

/// The guard of the server API under `/api/` (docs/api.md): with `auth.publish_keys` set,
/// step 1 of [`check_admin`] (a browser's state-changing request from elsewhere: 403) and
/// then a publish key as `Authorization: Bearer` (401); without publish keys, [`check_admin`]
/// itself (the admin token, or a local peer naming this server).
pub fn check_api(cfg: &Config, req: &Request, ends: Ends) -> Result<(), Refusal> {
    if cfg.auth.as_ref().is_none_or(|a| a.publish_keys.is_empty()) {
        return check_admin(cfg, req, ends);
    }
    refuse_foreign_browser(cfg, req)?;
    check_publish(cfg, req)
}

/// Step 1 of [`check_admin`]: a state-changing request (any method but GET and HEAD) that a
/// browser marks as coming from elsewhere (`Sec-Fetch-Site` other than `same-origin` or
/// `none`, or an `Origin` neither this server's nor in `allowed_origins`) is refused with 403.
fn refuse_foreign_browser(cfg: &Config, req: &Request) -> Result<(), Refusal> {
    if matches!(req.method, Method::Get | Method::Head) {
        return Ok(());
    }
    if req.fetch_site.as_deref().is_some_and(|s| !matches!(s, "same-origin" | "none")) {
        return Err(CROSS_SITE);
    }
    if req.origin.as_deref().is_some_and(|o| !own_or_listed_origin(cfg, req.host.as_deref(), o)) {
        return Err(FOREIGN_ORIGIN);
    }
    Ok(())
}

/// Whether `origin` is this server's own (the scheme `http` or `https` with `host`, RFC 6454
/// serializations compared) or one of `allowed_origins`. `null` and a repeated `Origin`
/// (combined as `a, b`) match neither.
fn own_or_listed_origin(cfg: &Config, host: Option<&str>, origin: &str) -> bool {
    let o = normalize_origin(origin.trim());
    let own = host
        .filter(|h| !h.is_empty())
        .is_some_and(|h| ["http://", "https://"].iter().any(|scheme| normalize_origin(&format!("{scheme}{h}")) == o));
    own || cfg.allowed_origins.iter().any(|a| normalize_origin(a) == o)
}

/// Whether a `Host` value names this server without the help of DNS: `localhost` or a name
/// under `.localhost` (RFC 6761 §6.3; a trailing dot allowed), a loopback address, or
/// `local`, the address the peer connected to; with or without a port. An absent or empty
/// `Host` (HTTP/1.0) names nothing.
fn names_this_server(host: Option<&str>, local: Option<IpAddr>) -> bool {
    let Some(host) = host.filter(|h| !h.is_empty()) else { return false };
    let name = match host.strip_prefix('[') {
        // `[v6]` or `[v6]:port`.
        Some(rest) => match rest.split_once(']') {
            Some((v6, port)) if port.is_empty() || port.starts_with(':') => v6,
            _ => return false,
        },
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    let Ok(ip) = name.parse::<IpAddr>() else { return false };
    let unmapped = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    ip.is_loopback() || local.is_some_and(|l| unmapped(l) == unmapped(ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Auth;

    fn req(bearer: Option<&str>) -> Request {
        let head = match bearer {
            Some(b) => format!("POST /publish/a HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer {b}\r\n\r\n"),
            None => "POST /publish/a HTTP/1.1\r\nHost: h\r\n\r\n".to_owned(),
        };
        crate::http::parse_request(head.as_bytes(), 8192).unwrap().unwrap()
    }

    #[test]
    fn publish_keys_guard_only_when_set() {
        let mut cfg = Config::default();
        assert_eq!(check_publish(&cfg, &req(None)), Ok(()));
        cfg.auth = Some(Auth {
            publish_keys: vec!["k1-0123456789abcdef".into(), "k2-0123456789abcdef".into()],
            ..Auth::default()
        });
        assert_eq!(check_publish(&cfg, &req(None)), Err(MISSING));
        assert_eq!(check_publish(&cfg, &req(Some("k1-0123456789abcdeX"))), Err(WRONG));
        assert_eq!(check_publish(&cfg, &req(Some("k1-0123456789abcde"))), Err(WRONG));
        assert_eq!(check_publish(&cfg, &req(Some("k2-0123456789abcdef"))), Ok(()));
    }

    fn admin_req(method: &str, path: &str, extra: &str) -> Request {
        let head = format!("{method} {path} HTTP/1.1\r\n{extra}\r\n");
        crate::http::parse_request(head.as_bytes(), 8192).unwrap().unwrap()
    }

    fn at(peer: IpAddr) -> Ends {
        Ends { peer: Some(peer), local: Some("127.0.0.1".parse().unwrap()) }
    }

    #[test]
    fn api_guard_is_the_publish_keys_or_else_the_admin_rules() {
        let mut cfg = Config::default();
        let (lo, far): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "192.0.2.7".parse().unwrap());
        let post = |extra: &str| admin_req("POST", "/api/disconnect", &format!("Host: 127.0.0.1:8080\r\n{extra}"));
        assert_eq!(check_api(&cfg, &post(""), at(lo)), Ok(()), "no keys: loopback, as the admin rules");
        assert_eq!(check_api(&cfg, &post(""), at(far)), Err(NOT_LOCAL));
        cfg.auth = Some(Auth { publish_keys: vec!["k1-0123456789abcdef".into()], ..Auth::default() });
        assert_eq!(check_api(&cfg, &post(""), at(lo)), Err(MISSING), "keys: loopback is no credential");
        assert_eq!(check_api(&cfg, &post("Authorization: Bearer nope-0123456789abcdef\r\n"), at(lo)), Err(WRONG));
        assert_eq!(check_api(&cfg, &post("Authorization: Bearer k1-0123456789abcdef\r\n"), at(far)), Ok(()));
        let browser = post("Authorization: Bearer k1-0123456789abcdef\r\nSec-Fetch-Site: cross-site\r\n");
        assert_eq!(check_api(&cfg, &browser, at(lo)), Err(CROSS_SITE), "a browser elsewhere: 403, key or not");
    }

    #[test]
    fn admin_guard_is_token_or_local_peer() {
        let mut cfg = Config::default();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo2: IpAddr = "127.0.0.2".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let far: IpAddr = "192.0.2.7".parse().unwrap();
        let get = admin_req("GET", "/connections", "Host: 127.0.0.1:8080\r\n");
        assert_eq!(check_admin(&cfg, &get, at(lo)), Ok(()));
        assert_eq!(check_admin(&cfg, &get, at(lo2)), Ok(()));
        assert_eq!(check_admin(&cfg, &get, at(mapped)), Ok(()));
        assert_eq!(check_admin(&cfg, &get, at(far)), Err(NOT_LOCAL));
        assert_eq!(check_admin(&cfg, &get, Ends::default()), Err(NOT_LOCAL));
        cfg.admin.local_peers = vec![lo];
        assert_eq!(check_admin(&cfg, &get, at(lo2)), Err(NOT_LOCAL));
        cfg.admin.token = "admin-0123456789abcdef".into();
        assert_eq!(check_admin(&cfg, &req(None), at(lo)), Err(MISSING));
        assert_eq!(check_admin(&cfg, &req(Some("nope-0123456789abcdef")), at(lo)), Err(WRONG));
        assert_eq!(check_admin(&cfg, &req(Some("admin-0123456789abcdef")), at(far)), Ok(()));
    }

    #[test]
    fn without_a_token_the_host_must_name_this_server() {
        let cfg = Config::default();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let own = Ends { peer: Some(lo), local: Some("10.1.2.3".parse().unwrap()) };
        for host in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.9.9.9:1",
            "[::1]",
            "[::1]:8080",
            "localhost",
            "LOCALHOST:8080",
            "localhost.:8080",
            "tether.localhost:8080",
            "10.1.2.3:8080",
        ] {
            let r = admin_req("GET", "/connections", &format!("Host: {host}\r\n"));
            assert_eq!(check_admin(&cfg, &r, own), Ok(()), "{host}");
        }
        for host in [
            "rebind.attacker.example",
            "rebind.attacker.example:8080",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "10.1.2.4:8080",
            "0x7f000001",
        ] {
            let r = admin_req("GET", "/connections", &format!("Host: {host}\r\n"));
            assert_eq!(check_admin(&cfg, &r, own), Err(FOREIGN_HOST), "{host}");
        }
        let http10 = crate::http::parse_request(b"GET /connections HTTP/1.0\r\n\r\n", 8192);
        assert_eq!(check_admin(&cfg, &http10.unwrap().unwrap(), own), Err(FOREIGN_HOST));
    }

    #[test]
    fn a_browser_cannot_change_state_from_elsewhere_token_or_not() {
        let mut cfg = Config { allowed_origins: vec!["https://ops.example".into()], ..Config::default() };
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let host = "Host: 127.0.0.1:8080\r\n";
        for token in ["", "admin-0123456789abcdef"] {
            cfg.admin.token = token.into();
            let auth = if token.is_empty() { String::new() } else { format!("Authorization: Bearer {token}\r\n") };
            for (method, path) in [("POST", "/feeds/btc/stop"), ("PUT", "/feeds/btc"), ("DELETE", "/feeds/btc")] {
                for bad in [
                    "Origin: https://evil.example\r\n",
                    "Origin: null\r\n",
                    "Origin: http://127.0.0.1:8081\r\n",
                    "Origin: http://127.0.0.1:8080\r\nOrigin: https://evil.example\r\n",
                    "Sec-Fetch-Site: cross-site\r\n",
                    "Sec-Fetch-Site: same-site\r\n",
                    "Origin: http://127.0.0.1:8080\r\nSec-Fetch-Site: cross-site\r\n",
                ] {
                    let r = admin_req(method, path, &format!("{host}{auth}{bad}"));
                    assert_eq!(
                        check_admin(&cfg, &r, at(lo)).map_err(|e| e.status),
                        Err(StatusCode::FORBIDDEN),
                        "{method} {bad}"
                    );
                }
                for good in [
                    "",
                    "Origin: http://127.0.0.1:8080\r\n",
                    "Origin: HTTP://127.0.0.1:8080\r\nSec-Fetch-Site: same-origin\r\n",
                    "Origin: https://ops.example:443\r\n",
                    "Sec-Fetch-Site: none\r\n",
                ] {
                    let r = admin_req(method, path, &format!("{host}{auth}{good}"));
                    assert_eq!(check_admin(&cfg, &r, at(lo)), Ok(()), "{method} {good}");
                }
            }
            // Reading is not a state change: the browser's CORS keeps the answer from the page.
            let r = admin_req("GET", "/feeds", &format!("{host}{auth}Origin: https://evil.example\r\n"));
            assert_eq!(check_admin(&cfg, &r, at(lo)), Ok(()));
        }
    }
}
