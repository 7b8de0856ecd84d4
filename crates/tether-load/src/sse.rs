//! Server-Sent Events subscribers for `tether load fanout --sse` (docs/protocol.md,
//! "Server-Sent Events"): `GET /sse?ch=CH` on a raw socket, then every `data:` line handed to
//! the caller as the JSON object it carries (the same `msg`, `subscribed`, `error` objects a
//! WebSocket subscriber gets), so the fan-out measures both transports with one code path.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use crate::args::WsUrl;
use crate::tls::Transport;
use crate::wire::{open, read_response_head, ConnError, Received, SynOpts, WsConn, SCRATCH};

/// Largest event line kept while incomplete, in bytes (a `data:` line is one message).
const MAX_LINE: usize = 16 << 20;

/// One open event stream.
pub struct SseConn {
    stream: Transport,
    /// An incomplete line; empty (no heap) between lines.
    pending: Vec<u8>,
    /// Bytes read from the stream after the response head (events, comments, heartbeats).
    pub wire_bytes: u64,
    /// Bytes of the `data:` JSON handed to the callback.
    pub message_bytes: u64,
}

impl SseConn {
    /// Connects to `url`'s server (over TLS for `https://` / `wss://`) and asks for
    /// `GET /sse?ch=CH`; anything but `200` is an error. Bytes after the head are kept as events.
    pub async fn connect(
        url: &WsUrl,
        source: Option<IpAddr>,
        ch: &str,
        deadline: Duration,
    ) -> Result<SseConn, ConnError> {
        let open = async {
            let mut stream = open(url, source, SynOpts::default()).await?;
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
    /// `Err(Closed(None))` at the end of the stream. Reads go into the thread's scratch buffer
    /// and complete lines are handed over from there, as [`WsConn::recv`] does with frames:
    /// only an incomplete line is copied into the connection.
    pub async fn recv(&mut self, mut on_message: impl FnMut(&[u8])) -> Result<Received, ConnError> {
        let mut received = Received::default();
        if !self.pending.is_empty() {
            let mut pending = std::mem::take(&mut self.pending);
            let used = self.lines(&pending, &mut on_message, &mut received);
            pending.drain(..used);
            self.pending = pending;
            if received.messages > 0 {
                return Ok(received);
            }
        }
        loop {
            // Over TLS, plaintext rustls already decrypted is read before waiting.
            if !self.stream.buffered() {
                self.stream.tcp().readable().await?;
            }
            let step = SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                let n = match self.stream.try_read(&mut scratch) {
                    Ok(0) => return Err(ConnError::Closed(None)),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) => return Err(ConnError::Io(e)),
                };
                self.wire_bytes += n as u64;
                if self.pending.is_empty() {
                    let used = self.lines(&scratch[..n], &mut on_message, &mut received);
                    self.pending.extend_from_slice(&scratch[used..n]);
                } else {
                    let mut pending = std::mem::take(&mut self.pending);
                    pending.extend_from_slice(&scratch[..n]);
                    let used = self.lines(&pending, &mut on_message, &mut received);
                    pending.drain(..used);
                    // Give the memory back once the partial line is gone.
                    self.pending = if pending.is_empty() { Vec::new() } else { pending };
                }
                Ok(())
            });
            step?;
            if self.pending.len() > MAX_LINE {
                return Err(ConnError::Protocol("SSE line too long"));
            }
            if received.messages > 0 {
                return Ok(received);
            }
        }
    }

    /// Hands over the complete `data:` lines at the front of `input`, counting them in
    /// `received`; returns the bytes of complete lines (the rest is an incomplete line).
    fn lines(&mut self, input: &[u8], on_message: &mut impl FnMut(&[u8]), received: &mut Received) -> usize {
        let mut start = 0;
        while let Some(nl) = input[start..].iter().position(|&b| b == b'\n') {
            let line = &input[start..start + nl];
            if let Some(json) = line.strip_prefix(b"data: ") {
                self.message_bytes += json.len() as u64;
                on_message(json);
                received.messages += 1;
            }
            start += nl + 1;
        }
        start
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
