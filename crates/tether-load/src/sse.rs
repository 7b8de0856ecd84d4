//! Server-Sent Events subscribers for `tether load fanout --sse` (docs/protocol.md,
//! "Server-Sent Events"): `GET /sse?ch=CH` on a raw socket, then every `data:` line handed to
//! the caller as the JSON object it carries (the same `msg`, `subscribed`, `error` objects a
//! WebSocket subscriber gets), so the fan-out measures both transports with one code path.

use std::net::IpAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::args::WsUrl;
use crate::wire::{read_response_head, tcp_connect_with, ConnError, Received, SynOpts, WsConn};

/// Largest event line kept while incomplete, in bytes (a `data:` line is one message).
const MAX_LINE: usize = 16 << 20;

/// One open event stream.
pub struct SseConn {
    stream: TcpStream,
    /// An incomplete line; empty (no heap) between lines.
    pending: Vec<u8>,
    /// Bytes read from the stream after the response head (events, comments, heartbeats).
    pub wire_bytes: u64,
    /// Bytes of the `data:` JSON handed to the callback.
    pub message_bytes: u64,
}

impl SseConn {
    /// Connects to `url`'s server and asks for `GET /sse?ch=CH`; anything but `200` is an
    /// error. Bytes after the head are kept as events.
    pub async fn connect(
        url: &WsUrl,
        source: Option<IpAddr>,
        ch: &str,
        deadline: Duration,
    ) -> Result<SseConn, ConnError> {
        let open = async {
            let mut stream = tcp_connect_with(url.addr, source, SynOpts::default()).await?;
            let request =
                format!("GET /sse?ch={ch} HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n", url.host);
            stream.write_all(request.as_bytes()).await?;
            let (mut head, end) = read_response_head(&mut stream).await?;
            let code = head
                .split(|&b| b == b' ')
                .nth(1)
                .and_then(|c| std::str::from_utf8(c).ok()?.parse().ok())
                .ok_or(ConnError::Protocol("unparsable SSE response"))?;
            if code != 200 {
                return Err(ConnError::Status(code));
            }
            let pending = head.split_off(end);
            Ok(SseConn { wire_bytes: pending.len() as u64, stream, pending, message_bytes: 0 })
        };
        tokio::time::timeout(deadline, open).await.unwrap_or(Err(ConnError::Timeout))
    }

    /// Waits until the socket is readable, reads what is there, and calls `on_message` with
    /// the JSON of every complete `data:` line, in order (comments and other fields skipped).
    /// `Err(Closed(None))` at the end of the stream.
    pub async fn recv(&mut self, mut on_message: impl FnMut(&[u8])) -> Result<Received, ConnError> {
        let mut received = Received::default();
        if !self.pending.is_empty() {
            received.messages += self.lines(&mut on_message);
            if received.messages > 0 {
                return Ok(received);
            }
        }
        loop {
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(ConnError::Closed(None));
            }
            self.pending.extend_from_slice(&chunk[..n]);
            self.wire_bytes += n as u64;
            received.messages += self.lines(&mut on_message);
            if self.pending.len() > MAX_LINE {
                return Err(ConnError::Protocol("SSE line too long"));
            }
            if received.messages > 0 {
                return Ok(received);
            }
        }
    }

    /// Hands over the complete `data:` lines held; returns how many.
    fn lines(&mut self, on_message: &mut impl FnMut(&[u8])) -> usize {
        let mut count = 0;
        let mut start = 0;
        while let Some(nl) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let line = &self.pending[start..start + nl];
            if let Some(json) = line.strip_prefix(b"data: ") {
                self.message_bytes += json.len() as u64;
                on_message(json);
                count += 1;
            }
            start += nl + 1;
        }
        self.pending.drain(..start);
        if self.pending.is_empty() {
            self.pending = Vec::new();
        }
        count
    }
}

/// A subscriber's connection: a WebSocket or an event stream.
pub enum SubConn {
    /// RFC 6455.
    Ws(WsConn),
    /// Server-Sent Events.
    Sse(SseConn),
}

impl SubConn {
    /// [`WsConn::recv`] or [`SseConn::recv`].
    pub async fn recv(&mut self, on_message: impl FnMut(&[u8])) -> Result<Received, ConnError> {
        match self {
            SubConn::Ws(c) => c.recv(on_message).await,
            SubConn::Sse(c) => c.recv(on_message).await,
        }
    }

    /// (bytes received on the wire, message bytes handed over) so far: WebSocket frames of
    /// data messages (inflated for the second figure), or the event stream's bytes and its
    /// `data:` JSON.
    pub fn counters(&self) -> (u64, u64) {
        match self {
            SubConn::Ws(c) => (c.wire_bytes, c.message_bytes),
            SubConn::Sse(c) => (c.wire_bytes, c.message_bytes),
        }
    }
}
