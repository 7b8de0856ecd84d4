//! The WebSocket opening handshake, server side, sans-IO (RFC 6455 §4.2).
//!
//! The request head is parsed by [`crate::http::parse_request`]; [`check_upgrade`] applies the
//! checks of RFC 6455 §4.2.1 to it and yields the `Sec-WebSocket-Accept` value;
//! [`switching_protocols`] writes the `101` answer (§4.2.2). Rejections are
//! [`HttpError`]s that `crate::http::handshake_rejection` turns into bytes.

use crate::http::StatusCode;
use base64::Engine as _;

use crate::http::{HttpError, Method, Request};

/// Checks a parsed request against RFC 6455 §4.2.1 and returns the `Sec-WebSocket-Accept`
/// value (§4.2.2 item 5.4) for its key.
///
/// Checks run in this order; the first failure is returned:
/// 1. method `GET` (400 `"method must be GET"`);
/// 2. HTTP/1.1 or later (400 `"HTTP/1.1 required"`);
/// 3. `Host` present (400 `"missing Host header"`);
/// 4. `Upgrade` lists `websocket` (400 `"missing Upgrade: websocket"`);
/// 5. `Connection` lists `upgrade` (400 `"missing Connection: upgrade"`);
/// 6. `Sec-WebSocket-Key` is base64 of exactly 16 bytes (400 `"missing Sec-WebSocket-Key"` or
///    `"bad Sec-WebSocket-Key"`);
/// 7. `Sec-WebSocket-Version` is `13`, missing included (426 `"unsupported
///    Sec-WebSocket-Version"`; the response must carry `Sec-WebSocket-Version: 13`, §4.4).
///
/// Path, `Origin` and admission are the caller's business.
pub fn check_upgrade(req: &Request) -> Result<String, HttpError> {
    if req.method != Method::Get {
        return Err(HttpError::bad("method must be GET"));
    }
    if req.minor_version < 1 {
        return Err(HttpError::bad("HTTP/1.1 required"));
    }
    if req.host.is_none() {
        return Err(HttpError::bad("missing Host header"));
    }
    if !req.upgrade_websocket {
        return Err(HttpError::bad("missing Upgrade: websocket"));
    }
    if !req.connection_upgrade {
        return Err(HttpError::bad("missing Connection: upgrade"));
    }
    let key = req.ws_key.as_deref().ok_or(HttpError::bad("missing Sec-WebSocket-Key"))?;
    let nonce_ok = base64::engine::general_purpose::STANDARD.decode(key).is_ok_and(|nonce| nonce.len() == 16);
    if !nonce_ok {
        return Err(HttpError::bad("bad Sec-WebSocket-Key"));
    }
    if req.ws_version.as_deref() != Some("13") {
        return Err(HttpError::new(StatusCode::UPGRADE_REQUIRED, "unsupported Sec-WebSocket-Version"));
    }
    Ok(tungstenite::handshake::derive_accept_key(key.as_bytes()))
}

/// The full `101 Switching Protocols` response head (RFC 6455 §4.2.2), ending in CRLFCRLF,
/// with `Sec-WebSocket-Extensions: <extensions>` when an extension was negotiated (§9.1; the
/// value from `ws::deflate::negotiate`). No subprotocol is negotiated.
pub fn switching_protocols(accept: &str, extensions: Option<&str>) -> Vec<u8> {
    const HEAD: &str = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n";
    let ext_len = extensions.map_or(0, |e| 28 + e.len());
    let mut out = Vec::with_capacity(HEAD.len() + 22 + accept.len() + 4 + ext_len);
    out.extend_from_slice(HEAD.as_bytes());
    out.extend_from_slice(b"Sec-WebSocket-Accept: ");
    out.extend_from_slice(accept.as_bytes());
    if let Some(e) = extensions {
        out.extend_from_slice(b"\r\nSec-WebSocket-Extensions: ");
        out.extend_from_slice(e.as_bytes());
    }
    out.extend_from_slice(b"\r\n\r\n");
    out
}

#[cfg(test)]
mod tests;
