//! Helpers for tests that speak through tokio-tungstenite, the independent client: connect,
//! send a JSON op, read the next reply or close, assert quiet. Every one is bounded in time.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::STEP;

/// A tokio-tungstenite client connection.
pub type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a connection to `url` (`ws://127.0.0.1:PORT/ws…`) within [`STEP`]. Panics when the
/// handshake fails or times out.
pub async fn connect(url: &str) -> Ws {
    let (ws, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
        .await
        .unwrap_or_else(|_| panic!("connect to {url} timed out"))
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    ws
}

/// Sends `v` as one text frame, within [`STEP`].
pub async fn send(ws: &mut Ws, v: Value) {
    tokio::time::timeout(STEP, ws.send(Message::text(v.to_string()))).await.expect("send timed out").expect("send");
}

/// What the server sent next, pings and pongs aside (tungstenite answers pings itself).
#[derive(Debug)]
pub enum Read {
    /// A text frame, parsed as JSON.
    Json(Value),
    /// A close frame: its code (1005 when it carried none) and reason.
    Close(u16, String),
}

/// The next text or close frame within `limit`. Panics on a binary frame, an error, the end
/// of the stream without a close frame, or nothing within `limit`.
pub async fn read_within(ws: &mut Ws, limit: Duration) -> Read {
    let end = tokio::time::Instant::now() + limit;
    loop {
        let m = tokio::time::timeout_at(end, ws.next())
            .await
            .unwrap_or_else(|_| panic!("nothing from the server within {limit:?}"))
            .expect("stream ended without a close frame")
            .expect("websocket error");
        match m {
            Message::Text(t) => return Read::Json(serde_json::from_str(&t).unwrap_or_else(|e| panic!("{t}: {e}"))),
            Message::Close(Some(f)) => return Read::Close(u16::from(f.code), f.reason.to_string()),
            Message::Close(None) => return Read::Close(1005, String::new()),
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// [`read_within`] one [`STEP`].
pub async fn read(ws: &mut Ws) -> Read {
    read_within(ws, STEP).await
}

/// The next text frame as JSON, within [`STEP`]. Panics on a close frame (naming its code),
/// a binary frame, an error or the end of the stream.
pub async fn next_json(ws: &mut Ws) -> Value {
    match read(ws).await {
        Read::Json(v) => v,
        Read::Close(code, reason) => panic!("closed with {code} ({reason}) while a reply was expected"),
    }
}

/// Asserts that no text frame arrives within `d`.
pub async fn quiet(ws: &mut Ws, d: Duration) {
    if let Ok(Some(Ok(Message::Text(t)))) = tokio::time::timeout(d, ws.next()).await {
        panic!("unexpected frame {t}");
    }
}
