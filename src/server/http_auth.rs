//! Bearer credentials on the plain HTTP API (docs/security.md): the publish keys that guard
//! `POST /publish/{channel}` (`auth.publish_keys`) and the admin token that guards
//! `/connections` and, with `admin.protect_metrics`, `/metrics` (`admin.token`).
//!
//! A refusal is HTTP 401 with `WWW-Authenticate: Bearer` (RFC 6750 §3) and a JSON reason; it
//! is counted in `tether_http_auth_failures_total{endpoint}` and logged at debug with the
//! peer's address, never with the credentials sent.

use std::net::IpAddr;

use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::ws::handshake::Request;

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
}

/// The `endpoint` label values, in [`Guarded`] order.
pub const GUARDED_NAMES: [&str; 2] = ["publish", "admin"];

/// Why a guarded request was refused: the body of the 401 and its `WWW-Authenticate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Short reason, e.g. `missing bearer token`.
    pub reason: &'static str,
    /// The `WWW-Authenticate` value (RFC 6750 §3: `error="invalid_token"` when credentials
    /// were sent but are not valid).
    pub challenge: &'static str,
}

const MISSING: Refusal =
    Refusal { reason: "missing bearer token (Authorization: Bearer …)", challenge: "Bearer realm=\"tether\"" };
const WRONG: Refusal =
    Refusal { reason: "invalid bearer token", challenge: "Bearer realm=\"tether\", error=\"invalid_token\"" };
const NOT_LOCAL: Refusal = Refusal {
    reason: "admin endpoint: only local peers may call it without admin.token",
    challenge: "Bearer realm=\"tether\"",
};

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

/// The `admin.token` guard: with a token configured, the request must carry it as
/// `Authorization: Bearer`; without one, only a local peer (`admin.local_peers`, default
/// loopback) is admitted. `peer` is `None` when the kernel no longer knows it (refused).
pub fn check_admin(cfg: &Config, req: &Request, peer: Option<IpAddr>) -> Result<(), Refusal> {
    let token = &cfg.admin.token;
    if token.is_empty() {
        return match peer {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Auth;

    fn req(bearer: Option<&str>) -> Request {
        let head = match bearer {
            Some(b) => format!("POST /publish/a HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer {b}\r\n\r\n"),
            None => "POST /publish/a HTTP/1.1\r\nHost: h\r\n\r\n".to_owned(),
        };
        crate::ws::handshake::parse_request(head.as_bytes(), 8192).unwrap().unwrap()
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

    #[test]
    fn admin_guard_is_token_or_local_peer() {
        let mut cfg = Config::default();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo2: IpAddr = "127.0.0.2".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let far: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(check_admin(&cfg, &req(None), Some(lo)), Ok(()));
        assert_eq!(check_admin(&cfg, &req(None), Some(lo2)), Ok(()));
        assert_eq!(check_admin(&cfg, &req(None), Some(mapped)), Ok(()));
        assert_eq!(check_admin(&cfg, &req(None), Some(far)), Err(NOT_LOCAL));
        assert_eq!(check_admin(&cfg, &req(None), None), Err(NOT_LOCAL));
        cfg.admin.local_peers = vec![lo];
        assert_eq!(check_admin(&cfg, &req(None), Some(lo2)), Err(NOT_LOCAL));
        cfg.admin.token = "admin-0123456789abcdef".into();
        assert_eq!(check_admin(&cfg, &req(None), Some(lo)), Err(MISSING));
        assert_eq!(check_admin(&cfg, &req(Some("nope-0123456789abcdef")), Some(lo)), Err(WRONG));
        assert_eq!(check_admin(&cfg, &req(Some("admin-0123456789abcdef")), Some(far)), Ok(()));
    }
}
