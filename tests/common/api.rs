//! Helpers for the server API tests (docs/api.md): one call over a fresh HTTP/1.1
//! connection, its JSON answer, and a WebSocket client holding a JWT (tokio-tungstenite).

use std::net::SocketAddr;

use serde_json::Value;

use super::auth::{claims, hs256, now_s};
use super::tung::{self, Ws};

/// One answer of the API: status, head and body (JSON, or `Null` when empty or not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: Value,
}

impl Answer {
    /// The `field` of a refusal.
    pub fn field(&self) -> &str {
        self.body["field"].as_str().unwrap_or_else(|| panic!("no field in {}", self.body))
    }
}

/// `method path` with `body` and `headers` over a fresh connection (`Host` = the server's
/// address, so the admin rules admit it from loopback).
pub async fn call(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let (status, head, bytes) = super::http_request(addr, method, path, headers, body.as_bytes()).await;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer { status, head, body }
}

/// `POST path` with a JSON body, asserting 200; the answer's JSON.
pub async fn post_ok(addr: SocketAddr, path: &str, body: Value) -> Value {
    let a = call(addr, "POST", path, &[], &body.to_string()).await;
    assert_eq!(a.status, 200, "POST {path} {body}: {a:?}");
    a.body
}

/// `GET path`, asserting 200; the answer's JSON.
pub async fn get_ok(addr: SocketAddr, path: &str) -> Value {
    let a = call(addr, "GET", path, &[], "").await;
    assert_eq!(a.status, 200, "GET {path}: {a:?}");
    a.body
}

/// An HS256 token for `user` (every channel), valid an hour, with `jti` when given and
/// issued at `iat` (seconds) when given, else now.
pub fn token(user: &str, jti: Option<&str>, iat: Option<u64>) -> String {
    let mut c = claims(user, now_s() + 3600, &["*"], &["*"]);
    c.jti = jti.map(str::to_owned);
    if let Some(iat) = iat {
        c.iat = iat;
    }
    hs256(&c)
}

/// A tokio-tungstenite connection with `token`, subscribed to `ch` (live).
pub async fn subscriber(addr: SocketAddr, token: &str, ch: &str) -> Ws {
    let mut ws = tung::connect(&super::auth::ws_url_with(addr, token)).await;
    tung::send(&mut ws, serde_json::json!({"op": "sub", "ch": ch})).await;
    let v = tung::next_json(&mut ws).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str()), (Some("subscribed"), Some(ch)), "{v}");
    ws
}

/// The close code and reason that end `ws` next (other frames skipped), within one step.
pub async fn closed(ws: &mut Ws) -> (u16, String) {
    loop {
        if let tung::Read::Close(code, reason) = tung::read(ws).await {
            return (code, reason);
        }
    }
}

/// The status of an upgrade with `token` (101 when accepted).
pub async fn upgrade_status(addr: SocketAddr, token: &str) -> u16 {
    super::auth::upgrade_keep(addr, &format!("/ws?token={token}"), &[]).await.0
}
