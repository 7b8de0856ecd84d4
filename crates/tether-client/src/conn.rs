//! One open connection as the task sees it: the writer half (a task of its own, batching
//! frames into one flush), what was sent on it per channel, and which requests about each
//! channel it has not answered yet.

use std::collections::HashMap;

use futures::stream::SplitSink;
use futures::SinkExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::presence::{Asked, Unanswered};
use super::shared::{lock, Shared};
use super::wire::sub_frame;

pub(crate) type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The frames queued for a connection's writer.
pub(crate) type Writes = mpsc::UnboundedSender<Message>;

/// Per-connection channel state.
#[derive(Default)]
pub(crate) struct ChanConn {
    /// `from` sent in this connection's `sub`.
    pub from: Option<u64>,
    /// Highest seq delivered on this connection (or the resume baseline).
    pub last: Option<u64>,
}

pub(crate) struct Conn {
    pub writes: Writes,
    pub chans: HashMap<String, ChanConn>,
    /// Requests about each channel sent on this connection and not yet answered, oldest first:
    /// an answer naming a channel belongs to the oldest (docs/protocol.md, "Answers").
    pub asked: Unanswered,
}

impl Conn {
    pub(crate) fn send(&self, text: String) {
        send_on(&self.writes, text);
    }
}

pub(crate) fn send_on(writes: &Writes, text: String) {
    // A closed writer means the connection is ending; the reader reports why.
    let _ = writes.send(Message::text(text));
}

/// Sends `sub` for `ch` on `conn` from its resume point, noting it as unanswered.
pub(crate) fn send_sub(shared: &Shared, conn: &mut Conn, ch: &str, join_leave: bool) {
    let pos = lock(&shared.book).positions.get(ch).cloned();
    let from = pos.as_ref().map(|p| p.seq);
    let epoch = pos.as_ref().and_then(|p| p.epoch.as_deref());
    conn.send(sub_frame(ch, from, epoch, join_leave));
    conn.chans.insert(ch.to_string(), ChanConn { from, last: None });
    conn.asked.push(ch, Asked::Sub);
}

pub(crate) async fn write_loop(mut sink: SplitSink<Ws, Message>, mut queued: mpsc::UnboundedReceiver<Message>) {
    while let Some(m) = queued.recv().await {
        if sink.feed(m).await.is_err() {
            return;
        }
        // Batch whatever else is queued into the same flush.
        while let Ok(m) = queued.try_recv() {
            if sink.feed(m).await.is_err() {
                return;
            }
        }
        if sink.flush().await.is_err() {
            return;
        }
    }
    let _ = sink.flush().await;
}
