//! Helpers for tests that speak through tokio-tungstenite, the independent client.

use futures::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::STEP;

/// A tokio-tungstenite client connection.
pub type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// The next text frame as JSON, within [`STEP`] (pings are answered by tungstenite itself).
/// Panics on a binary or close frame, an error or the end of the stream.
pub async fn next_json(ws: &mut Ws) -> Value {
    loop {
        let m = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("no frame within the step")
            .expect("stream ended")
            .expect("ws error");
        match m {
            Message::Text(t) => return serde_json::from_str(&t).unwrap_or_else(|e| panic!("{t}: {e}")),
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}
