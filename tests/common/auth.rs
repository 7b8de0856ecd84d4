//! JWT helpers for the auth tests: the committed test keys (tests/keys/), server configs and
//! tokens minted with `tether::auth::mint`.

use std::path::PathBuf;

use tether::auth::mint::{ChannelGlobs, Signer, TokenClaims};

/// The HS256 secret of [`hs256_config`].
pub const SECRET: &str = "test-secret-0123456789abcdef-0123";

/// A file under tests/keys/.
pub fn key(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/keys").join(name)
}

/// `[auth]` with the HS256 [`SECRET`] and a refresh grace of `grace_ms`.
pub fn hs256_config(grace_ms: u64) -> String {
    format!("[auth]\njwt_hs256_secret = \"{SECRET}\"\ntoken_refresh_grace_ms = {grace_ms}\n")
}

/// `[auth]` verifying with the public key file `pub_pem` (a name under tests/keys/).
pub fn pem_config(pub_pem: &str) -> String {
    format!("[auth]\njwt_public_key_file = {:?}\n", key(pub_pem).display().to_string())
}

/// Seconds since the Unix epoch.
pub fn now_s() -> u64 {
    tether::auth::unix_now_ms() / 1000
}

/// Claims for `sub` expiring at `exp` (seconds since the epoch) with these channel globs.
pub fn claims(sub: &str, exp: u64, subs: &[&str], pubs: &[&str]) -> TokenClaims {
    let mut c = TokenClaims::new(sub, exp);
    c.channels = ChannelGlobs {
        sub: subs.iter().map(|s| s.to_string()).collect(),
        publish: pubs.iter().map(|s| s.to_string()).collect(),
    };
    c
}

/// An HS256 token with the [`SECRET`].
pub fn hs256(claims: &TokenClaims) -> String {
    Signer::hs256(SECRET).expect("signer").sign(claims).expect("sign")
}

/// A token signed with the private key file `key_pem` (a name under tests/keys/).
pub fn pem_token(key_pem: &str, claims: &TokenClaims) -> String {
    Signer::from_pem_file(&key(key_pem)).expect("private key").sign(claims).expect("sign")
}

/// `ws://ADDR/ws?token=TOKEN`.
pub fn ws_url_with(addr: std::net::SocketAddr, token: &str) -> String {
    format!("ws://{addr}/ws?token={token}")
}

/// Sends an upgrade for `path` with `extra` header lines; returns the status, the head, the
/// body (read to the close unless 101) and the connection (open after a 101).
pub async fn upgrade_keep(
    addr: std::net::SocketAddr,
    path: &str,
    extra: &[(&str, &str)],
) -> (u16, String, String, tokio::net::TcpStream) {
    let mut s = super::connect(addr).await;
    let mut req = super::upgrade_request(addr, path, super::SAMPLE_KEY);
    req.truncate(req.len() - 2);
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes()).await.expect("send upgrade");
    let (status, head, rest) = super::read_head(&mut s).await;
    if status == 101 {
        return (status, head, String::new(), s);
    }
    let mut body = rest;
    let _ = tokio::time::timeout(super::STEP, tokio::io::AsyncReadExt::read_to_end(&mut s, &mut body)).await;
    (status, head, String::from_utf8_lossy(&body).trim().to_string(), s)
}
