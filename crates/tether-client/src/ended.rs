//! How a connection or a connection attempt ended, and what the client does next: reconnect
//! (with a floor for the wait) or stop with a [`ClientError`].

use std::time::Duration;

use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::http::Response;
use tokio_tungstenite::tungstenite::Error as WsError;

use super::ClientError;

/// Most bytes of a refusal's body quoted in an error (tether's are one short line).
const MAX_REASON_BYTES: usize = 200;

/// How a connection (or a connection attempt) ended.
pub(super) enum Ended {
    Reconnect {
        code: Option<u16>,
        reason: String,
        floor: Option<Duration>,
    },
    Stop(ClientError),
    /// The application closed the client (`Some`) or dropped every handle (`None`).
    Shutdown(Option<oneshot::Sender<()>>),
}

/// A reconnect after a connection that ended without a close code (1006).
pub(super) fn abnormal(reason: impl Into<String>) -> Ended {
    Ended::Reconnect { code: None, reason: reason.into(), floor: None }
}

/// Maps a read error: transport failures reconnect (1006), protocol violations stop.
pub(super) fn read_error(e: WsError) -> Ended {
    match e {
        WsError::ConnectionClosed | WsError::AlreadyClosed | WsError::Io(_) => abnormal(e.to_string()),
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => abnormal(e.to_string()),
        WsError::Protocol(_) | WsError::Utf8(_) | WsError::Capacity(_) | WsError::AttackAttempt => {
            Ended::Stop(ClientError::Protocol(e.to_string()))
        }
        other => abnormal(other.to_string()),
    }
}

/// The server's reason for refusing an upgrade: the first line of the response body (tether
/// writes one, e.g. `bad signature`), else the status's canonical reason phrase.
pub(super) fn refusal_reason(resp: &Response<Option<Vec<u8>>>) -> String {
    let body = resp.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default();
    let line = body.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let line = match line.char_indices().nth(MAX_REASON_BYTES) {
        Some((i, _)) => &line[..i],
        None => line,
    };
    if line.is_empty() {
        resp.status().canonical_reason().unwrap_or("").to_string()
    } else {
        line.to_string()
    }
}

/// Maps a failed connection attempt: overload statuses and transport failures retry (with
/// `Retry-After` as the floor), a wrong URL or endpoint, or a refused token (401), stops.
/// Both name the server's reason: `upgrade refused: HTTP 401: bad signature`.
pub(super) fn handshake_ended(e: WsError) -> Ended {
    match e {
        WsError::Http(resp) => {
            let status = resp.status().as_u16();
            let why = refusal_reason(&resp);
            if matches!(status, 429 | 500 | 502 | 503 | 504) {
                let floor = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let reason = format!("upgrade refused: HTTP {status}: {why}");
                Ended::Reconnect { code: None, reason, floor }
            } else {
                Ended::Stop(ClientError::Handshake { status, reason: why })
            }
        }
        WsError::Url(u) => Ended::Stop(ClientError::InvalidUrl(u.to_string())),
        WsError::Protocol(ProtocolError::HandshakeIncomplete) | WsError::Io(_) => abnormal(e.to_string()),
        WsError::Protocol(p) => Ended::Stop(ClientError::Protocol(p.to_string())),
        other => abnormal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(status: u16, body: Option<&str>) -> Response<Option<Vec<u8>>> {
        let mut r = Response::new(body.map(|b| b.as_bytes().to_vec()));
        *r.status_mut() = tokio_tungstenite::tungstenite::http::StatusCode::from_u16(status).expect("status");
        r
    }

    #[test]
    fn refusal_reason_is_the_body_line_or_the_status_text() {
        assert_eq!(refusal_reason(&resp(401, Some("bad signature\n"))), "bad signature");
        assert_eq!(refusal_reason(&resp(401, Some("\n  \n"))), "Unauthorized");
        assert_eq!(refusal_reason(&resp(404, None)), "Not Found");
        assert_eq!(refusal_reason(&resp(400, Some(&"é".repeat(500)))).chars().count(), MAX_REASON_BYTES);
        match handshake_ended(WsError::Http(Box::new(resp(401, Some("token expired\n"))))) {
            Ended::Stop(e) => assert_eq!(e.to_string(), "WebSocket upgrade refused: HTTP 401: token expired"),
            _ => panic!("401 stops"),
        }
        match handshake_ended(WsError::Http(Box::new(resp(503, Some("server is draining\n"))))) {
            Ended::Reconnect { reason, .. } => assert_eq!(reason, "upgrade refused: HTTP 503: server is draining"),
            _ => panic!("503 reconnects"),
        }
    }
}
