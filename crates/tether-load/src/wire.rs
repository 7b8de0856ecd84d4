//! A lean RFC 6455 client for the load generator: raw tokio TCP, a hand-written client
//! handshake (§4.1) and the project's frame codec.
//!
//! An idle [`WsConn`] owns its socket and an empty `Vec`: bytes are read into a per-thread
//! scratch buffer and only the tail of a frame split across reads is kept per connection, so
//! tens of thousands of idle connections cost little more than their kernel sockets. With
//! permessage-deflate agreed (RFC 7692, no context takeover either way), compressed messages
//! are inflated by one inflater per thread into one per-thread buffer, so a deflate connection
//! holds no zlib state either. Over `wss://` the same reads go through rustls
//! ([`crate::tls::Transport`]); plaintext lands in the same scratch buffer.

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

use base64::Engine;
use tokio::net::{TcpSocket, TcpStream};

use super::args::WsUrl;
use super::tls::Transport;
use flate2::{Decompress, FlushDecompress, Status};
use tether_proto::ws::codec::{decode_server_frame_rsv1, encode_client_frame};

/// Largest HTTP response head accepted during the handshake.
const MAX_RESPONSE_HEAD: usize = 8192;
/// Per-thread read buffer: one read drains up to this much from a socket.
const SCRATCH_BYTES: usize = 64 * 1024;

/// Largest message inflated from a permessage-deflate frame, in bytes: a bigger one is a
/// protocol error (a bomb never allocates past it).
const MAX_INFLATED: usize = 16 << 20;
/// The permessage-deflate offer of `--deflate` (RFC 7692 §7.1): no context takeover either way,
/// so every message inflates on its own and one inflater per thread serves every connection.
const DEFLATE_OFFER: &str = "permessage-deflate; client_no_context_takeover; server_no_context_takeover";

thread_local! {
    pub(crate) static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0; SCRATCH_BYTES]);
    /// Per-thread raw-DEFLATE inflater and its output buffer, reset for every message (the
    /// server keeps no context, §7.1.1.1): a deflate connection holds no zlib state.
    static INFLATER: RefCell<(Decompress, Vec<u8>)> = RefCell::new((Decompress::new(false), Vec::new()));
}

/// Inflates one permessage-deflate message (RFC 7692 §7.2.2: the payload, then `00 00 ff ff`)
/// with this thread's inflater and hands the result to `f`. Errors: not valid DEFLATE, or more
/// than [`MAX_INFLATED`] bytes.
pub(crate) fn inflate_with<R>(deflated: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<R, ConnError> {
    const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];
    INFLATER.with(|cell| {
        let (z, out) = &mut *cell.borrow_mut();
        z.reset(false);
        out.clear();
        for mut input in [deflated, &TAIL[..]] {
            loop {
                if out.capacity() - out.len() < 4096 {
                    if out.len() >= MAX_INFLATED {
                        return Err(ConnError::Protocol("inflated message too large"));
                    }
                    // Exact, so the buffer never grows past the bound by more than one step.
                    out.reserve_exact((out.len() + 4096).min(MAX_INFLATED - out.len()).max(4096));
                }
                let (before, written) = (z.total_in(), out.len());
                let status = z
                    .decompress_vec(input, out, FlushDecompress::Sync)
                    .map_err(|_| ConnError::Protocol("bad permessage-deflate data"))?;
                let used = (z.total_in() - before) as usize;
                input = &input[used..];
                let stalled = used == 0 && out.len() == written;
                let full = out.capacity() == out.len();
                if matches!(status, Status::StreamEnd) || stalled || (input.is_empty() && !full) {
                    break;
                }
            }
        }
        if out.len() > MAX_INFLATED {
            return Err(ConnError::Protocol("inflated message too large"));
        }
        Ok(f(out))
    })
}

/// Why a connection attempt or an open connection failed; [`ConnError::kind`] is the key the
/// reports count errors under.
#[derive(Debug)]
pub enum ConnError {
    /// TCP connect, read or write failed.
    Io(io::Error),
    /// The handshake answer was not `101 Switching Protocols` (e.g. 503 when the server is at
    /// `max_connections`).
    Status(u16),
    /// The peer broke RFC 6455 or HTTP/1.1 (bad accept key, bad frame, oversize head).
    Protocol(&'static str),
    /// The peer closed: close code (None when the close frame had no code, or on EOF
    /// without a close frame — reported as 1006 by [`ConnError::close_code`]).
    Closed(Option<u16>),
    /// A deadline passed.
    Timeout,
}

impl ConnError {
    /// A short stable key for error tallies: `refused`, `reset`, `io`, `tls` (a TLS failure:
    /// certificate not trusted, alert), `status_503`, `protocol`, `closed_1012`, `eof`, `timeout`.
    pub fn kind(&self) -> String {
        match self {
            ConnError::Io(e) => match e.kind() {
                io::ErrorKind::ConnectionRefused => "refused".into(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => "reset".into(),
                io::ErrorKind::UnexpectedEof => "eof".into(),
                io::ErrorKind::AddrNotAvailable | io::ErrorKind::AddrInUse => "no_port".into(),
                // Only rustls' errors are mapped to InvalidData here (crate::tls).
                io::ErrorKind::InvalidData => "tls".into(),
                _ if e.raw_os_error() == Some(libc::EMFILE) => "emfile".into(),
                _ => "io".into(),
            },
            ConnError::Status(code) => format!("status_{code}"),
            ConnError::Protocol(_) => "protocol".into(),
            ConnError::Closed(Some(code)) => format!("closed_{code}"),
            ConnError::Closed(None) => "eof".into(),
            ConnError::Timeout => "timeout".into(),
        }
    }

    /// The close code as an application sees it (RFC 6455 §7.1.5): the peer's code, or 1006
    /// for anything without a close frame.
    pub fn close_code(&self) -> u16 {
        match self {
            ConnError::Closed(Some(code)) => *code,
            _ => 1006,
        }
    }
}

impl fmt::Display for ConnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnError::Io(e) => write!(f, "I/O: {e}"),
            ConnError::Status(code) => write!(f, "handshake answered HTTP {code}"),
            ConnError::Protocol(why) => write!(f, "protocol: {why}"),
            ConnError::Closed(code) => write!(f, "closed by peer ({})", code.unwrap_or(1006)),
            ConnError::Timeout => write!(f, "timed out"),
        }
    }
}

impl From<io::Error> for ConnError {
    fn from(e: io::Error) -> Self {
        ConnError::Io(e)
    }
}

/// Opens a TCP connection to `addr`, first binding `source` (port chosen at connect time, so
/// one source address serves every destination: `IP_BIND_ADDRESS_NO_PORT`). Nagle is off.
pub async fn tcp_connect(addr: SocketAddr, source: Option<IpAddr>) -> io::Result<TcpStream> {
    tcp_connect_with(addr, source, SynOpts::default()).await
}

/// Socket options set before `connect`, because they are agreed in the SYN: a later change
/// would not shrink the advertised window scale or the announced MSS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SynOpts {
    /// `SO_RCVBUF` in bytes (the kernel doubles it and enforces a floor): a small one keeps
    /// the advertised window small, so a peer that stops reading stalls the sender at once.
    pub rcvbuf: Option<u32>,
    /// `TCP_MAXSEG` in bytes: the MSS this end announces. The sender's initial send buffer is
    /// sized from its congestion window in segments, so loopback's 64 KiB MSS lets a server's
    /// kernel buffer MiBs for a peer that never reads; 1460 (Ethernet) keeps that realistic.
    pub mss: Option<u32>,
}

/// [`tcp_connect`] with [`SynOpts`] applied first.
pub async fn tcp_connect_with(addr: SocketAddr, source: Option<IpAddr>, opts: SynOpts) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if let Some(bytes) = opts.rcvbuf {
        socket.set_recv_buffer_size(bytes)?;
    }
    if let Some(mss) = opts.mss {
        socket2::SockRef::from(&socket).set_tcp_mss(mss)?;
    }
    if let Some(ip) = source {
        let one: libc::c_int = 1;
        // SAFETY: setsockopt on a socket we own, with a valid int option value.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let stream = socket.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// [`tcp_connect_with`], then the TLS handshake when `url` is `wss://` / `https://`.
pub async fn open(url: &WsUrl, source: Option<IpAddr>, opts: SynOpts) -> io::Result<Transport> {
    let stream = tcp_connect_with(url.addr, source, opts).await?;
    Transport::start(stream, url.tls.as_ref()).await
}

/// A random `Sec-WebSocket-Key` (§4.1: 16 random bytes, base64).
fn random_key() -> String {
    let bytes: [u8; 16] = rand::random();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The `Sec-WebSocket-Accept` a server must answer `key` with (§4.2.2).
/// Computed by tungstenite's `derive_accept_key`, the same function the server's handshake uses.
pub fn accept_key(key: &str) -> String {
    tungstenite::handshake::derive_accept_key(key.as_bytes())
}

/// An open client WebSocket connection.
#[derive(Debug)]
pub struct WsConn {
    stream: Transport,
    /// Bytes of a frame split across reads; empty (no heap) between frames.
    pending: Vec<u8>,
    /// Fragments of a message in progress (§5.4); empty otherwise.
    assembly: Vec<u8>,
    /// permessage-deflate was agreed in the handshake (RFC 7692).
    deflate: bool,
    /// The message in `assembly` is compressed (RSV1 on its first frame).
    assembling_deflated: bool,
    /// Frame bytes of the data messages received (headers included: what crossed the wire).
    pub wire_bytes: u64,
    /// Bytes of the data messages handed to the callback (after inflation).
    pub message_bytes: u64,
}

/// What one [`WsConn::recv`] call delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Received {
    /// Complete data messages handed to the callback.
    pub messages: usize,
    /// Pings answered.
    pub pings: usize,
}

/// Reads an HTTP response head from `stream`: the bytes read (the head and whatever followed
/// it in the same reads) and the head's length, CRLFCRLF included.
pub async fn read_response_head(stream: &mut Transport) -> Result<(Vec<u8>, usize), ConnError> {
    let mut head = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok((head, end + 4));
        }
        if head.len() > MAX_RESPONSE_HEAD {
            return Err(ConnError::Protocol("response head too large"));
        }
    }
}

impl WsConn {
    /// Connects to `url` (binding `source` first when given) and performs the client handshake
    /// (§4.1): `GET path` with a random key; anything but `101` with the right
    /// `Sec-WebSocket-Accept` is an error. Bytes after the response head are kept as frames.
    pub async fn connect(url: &WsUrl, source: Option<IpAddr>) -> Result<WsConn, ConnError> {
        WsConn::connect_opts(url, source, SynOpts::default()).await
    }

    /// [`WsConn::connect`] with [`SynOpts`] set before `connect` (see [`tcp_connect_with`]).
    pub async fn connect_opts(url: &WsUrl, source: Option<IpAddr>, opts: SynOpts) -> Result<WsConn, ConnError> {
        WsConn::connect_offering(url, source, opts, false).await
    }

    /// [`WsConn::connect_opts`], offering permessage-deflate when `deflate` is set
    /// (`client_no_context_takeover; server_no_context_takeover`, RFC 7692 §7.1). A server
    /// that declines gives a plain connection ([`WsConn::deflate`] false); one that accepts
    /// without `server_no_context_takeover` is an error (this client inflates every message
    /// with a fresh per-thread inflater). Compressed messages are inflated before the
    /// callback sees them.
    pub async fn connect_offering(
        url: &WsUrl,
        source: Option<IpAddr>,
        opts: SynOpts,
        deflate: bool,
    ) -> Result<WsConn, ConnError> {
        let mut stream = open(url, source, opts).await?;
        let key = random_key();
        let offer = if deflate { format!("Sec-WebSocket-Extensions: {DEFLATE_OFFER}\r\n") } else { String::new() };
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{offer}\r\n",
            url.path, url.host
        );
        stream.write_all(request.as_bytes()).await?;
        let (mut head, head_len) = read_response_head(&mut stream).await?;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&head[..head_len]) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(ConnError::Protocol("unparsable handshake response")),
        }
        let code = response.code.unwrap_or(0);
        if code != 101 {
            return Err(ConnError::Status(code));
        }
        let expected = accept_key(&key);
        let accept_ok = response
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("sec-websocket-accept") && h.value == expected.as_bytes());
        if !accept_ok {
            return Err(ConnError::Protocol("wrong Sec-WebSocket-Accept"));
        }
        let agreed = response.headers.iter().find(|h| h.name.eq_ignore_ascii_case("sec-websocket-extensions"));
        let agreed = match agreed.map(|h| String::from_utf8_lossy(h.value).to_ascii_lowercase()) {
            None => false,
            Some(v) if !deflate || !v.trim_start().starts_with("permessage-deflate") => {
                return Err(ConnError::Protocol("server answered an extension that was not offered"));
            }
            Some(v) if !v.split(';').any(|p| p.trim() == "server_no_context_takeover") => {
                return Err(ConnError::Protocol("server kept its deflate context"));
            }
            Some(_) => true,
        };
        let pending = head.split_off(head_len);
        Ok(WsConn {
            stream,
            pending,
            assembly: Vec::new(),
            deflate: agreed,
            assembling_deflated: false,
            wire_bytes: 0,
            message_bytes: 0,
        })
    }

    /// permessage-deflate was agreed in the handshake.
    pub fn deflate(&self) -> bool {
        self.deflate
    }

    /// [`WsConn::connect`] with a deadline covering TCP connect and handshake.
    pub async fn connect_within(url: &WsUrl, source: Option<IpAddr>, deadline: Duration) -> Result<WsConn, ConnError> {
        WsConn::connect_opts_within(url, source, SynOpts::default(), deadline).await
    }

    /// [`WsConn::connect_opts`] with a deadline covering TCP connect and handshake.
    pub async fn connect_opts_within(
        url: &WsUrl,
        source: Option<IpAddr>,
        opts: SynOpts,
        deadline: Duration,
    ) -> Result<WsConn, ConnError> {
        WsConn::connect_offering_within(url, source, opts, false, deadline).await
    }

    /// [`WsConn::connect_offering`] with a deadline covering TCP connect and handshake.
    pub async fn connect_offering_within(
        url: &WsUrl,
        source: Option<IpAddr>,
        opts: SynOpts,
        deflate: bool,
        deadline: Duration,
    ) -> Result<WsConn, ConnError> {
        match tokio::time::timeout(deadline, WsConn::connect_offering(url, source, opts, deflate)).await {
            Ok(result) => result,
            Err(_) => Err(ConnError::Timeout),
        }
    }

    /// Sends one text frame (masked with a random key, §5.3).
    pub async fn send_text(&mut self, text: &[u8]) -> Result<(), ConnError> {
        let frame = encode_client_frame(0x1, true, text, rand::random());
        self.stream.write_all(&frame).await?;
        Ok(())
    }

    /// Writes bytes that are already framed (several frames may be concatenated).
    pub async fn send_raw(&mut self, frames: &[u8]) -> Result<(), ConnError> {
        self.stream.write_all(frames).await?;
        Ok(())
    }

    /// Sends a close frame with `code` (§5.5.1) without waiting for the answer.
    pub async fn send_close(&mut self, code: u16) -> Result<(), ConnError> {
        let frame = encode_client_frame(0x8, true, &code.to_be_bytes(), rand::random());
        self.stream.write_all(&frame).await?;
        Ok(())
    }

    /// Drops the connection with a TCP reset (`SO_LINGER` 0): no close handshake (nor TLS
    /// `close_notify`), no TIME_WAIT. Used for `storm --trigger cut` and after `connect`
    /// handshakes.
    pub fn reset(self) {
        // A failure only means the socket is already gone.
        let _ = self.stream.tcp().set_zero_linger();
    }

    /// Waits until the socket is readable, reads what is there once, and calls `on_message`
    /// with the payload of every complete text or binary message, in order. Pings are answered
    /// with pongs (§5.5.2). Returns `Err(Closed(code))` on a close frame (after echoing it,
    /// §5.5.1) or EOF (`Closed(None)`), and `Err(Protocol)` on a bad frame.
    pub async fn recv(&mut self, mut on_message: impl FnMut(&[u8])) -> Result<Received, ConnError> {
        if !self.pending.is_empty() {
            // Frames that arrived with the handshake response, or a buffered partial frame
            // that may already be complete.
            let mut pending = std::mem::take(&mut self.pending);
            let mut out = Vec::new();
            let result = self.parse(&pending, &mut on_message, &mut out);
            let flushed = self.flush(&out).await;
            let (consumed, received) = result?;
            flushed?;
            pending.drain(..consumed);
            self.pending = pending;
            if consumed > 0 {
                return Ok(received);
            }
        }
        loop {
            if !self.stream.buffered() {
                self.stream.tcp().readable().await?;
            }
            let mut out = Vec::new();
            let step = SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                let n = match self.stream.try_read(&mut scratch) {
                    Ok(0) => return Err(ConnError::Closed(None)),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                    Err(e) => return Err(ConnError::Io(e)),
                };
                let received = if self.pending.is_empty() {
                    let (consumed, received) = self.parse(&scratch[..n], &mut on_message, &mut out)?;
                    self.pending.extend_from_slice(&scratch[consumed..n]);
                    received
                } else {
                    let mut pending = std::mem::take(&mut self.pending);
                    pending.extend_from_slice(&scratch[..n]);
                    let (consumed, received) = self.parse(&pending, &mut on_message, &mut out)?;
                    pending.drain(..consumed);
                    // Give the memory back once the partial frame is gone.
                    if pending.is_empty() {
                        pending = Vec::new();
                    }
                    self.pending = pending;
                    received
                };
                Ok(Some(received))
            });
            let flushed = self.flush(&out).await;
            let step = step?;
            flushed?;
            match step {
                Some(received) => return Ok(received),
                None => continue,
            }
        }
    }

    /// Sends the control answers in `out`, and over TLS whatever records rustls queued while
    /// reading (e.g. a KeyUpdate answer).
    async fn flush(&mut self, out: &[u8]) -> Result<(), ConnError> {
        self.stream.write_all(out).await?;
        Ok(())
    }

    /// Decodes complete frames from the front of `input`; control answers go to `out`.
    fn parse(
        &mut self,
        input: &[u8],
        on_message: &mut impl FnMut(&[u8]),
        out: &mut Vec<u8>,
    ) -> Result<(usize, Received), ConnError> {
        let mut consumed = 0;
        let mut received = Received::default();
        loop {
            let frame = decode_server_frame_rsv1(&input[consumed..]).map_err(|v| ConnError::Protocol(v.reason))?;
            let Some((n, fin, opcode, rsv1, payload)) = frame else { break };
            consumed += n;
            if rsv1 && !self.deflate {
                return Err(ConnError::Protocol("RSV1 set without permessage-deflate"));
            }
            if opcode <= 0x2 {
                self.wire_bytes += n as u64;
            }
            match opcode {
                0x1 | 0x2 if fin && self.assembly.is_empty() && !self.assembling_deflated => {
                    received.messages += 1;
                    let len = if rsv1 {
                        inflate_with(&payload, |m| {
                            on_message(m);
                            m.len()
                        })?
                    } else {
                        on_message(&payload);
                        payload.len()
                    };
                    self.message_bytes += len as u64;
                }
                0x0..=0x2 => {
                    if opcode != 0x0 && (!self.assembly.is_empty() || self.assembling_deflated) {
                        return Err(ConnError::Protocol("new message inside a fragmented one"));
                    }
                    self.assembling_deflated |= rsv1;
                    self.assembly.extend_from_slice(&payload);
                    if fin {
                        received.messages += 1;
                        let len = if self.assembling_deflated {
                            inflate_with(&self.assembly, |m| {
                                on_message(m);
                                m.len()
                            })?
                        } else {
                            on_message(&self.assembly);
                            self.assembly.len()
                        };
                        self.message_bytes += len as u64;
                        self.assembly = Vec::new();
                        self.assembling_deflated = false;
                    }
                }
                0x9 => {
                    received.pings += 1;
                    out.extend_from_slice(&encode_client_frame(0xA, true, &payload, rand::random()));
                }
                0xA => {}
                0x8 => {
                    let code = (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
                    // Echo the code (§5.5.1); the caller flushes `out` before reporting the close.
                    out.extend_from_slice(&encode_client_frame(
                        0x8,
                        true,
                        &payload[..payload.len().min(2)],
                        rand::random(),
                    ));
                    return Err(ConnError::Closed(code));
                }
                _ => return Err(ConnError::Protocol("unexpected opcode")),
            }
        }
        Ok((consumed, received))
    }
}

/// Finds `"key":` in a JSON text and returns the unsigned integer after it (whitespace
/// allowed before the digits). A fast scan for the fixed shapes this tool reads; `None` when
/// the key is absent or not followed by digits.
pub fn scan_u64(json: &[u8], key: &str) -> Option<u64> {
    let at = find_key(json, key)?;
    let rest = &json[at..];
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let digits = rest[start..].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 20 {
        return None;
    }
    std::str::from_utf8(&rest[start..start + digits]).ok()?.parse().ok()
}

/// Finds `"key":"` and returns the string up to the next quote (no escapes: channel names,
/// ops and epochs never contain any).
pub fn scan_str<'a>(json: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let at = find_key(json, key)?;
    let rest = &json[at..];
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest[start] != b'"' {
        return None;
    }
    let body = &rest[start + 1..];
    let end = body.iter().position(|&b| b == b'"')?;
    Some(&body[..end])
}

/// Index just after `"key":` (whitespace allowed before the colon).
fn find_key(json: &[u8], key: &str) -> Option<usize> {
    let key = key.as_bytes();
    let mut from = 0;
    while from + key.len() + 2 <= json.len() {
        let at = from + json[from..].iter().position(|&b| b == b'"')?;
        let after = at + 1 + key.len();
        if json.len() > after && &json[at + 1..after] == key && json[after] == b'"' {
            let mut i = after + 1;
            while i < json.len() && json[i].is_ascii_whitespace() {
                i += 1;
            }
            if i < json.len() && json[i] == b':' {
                return Some(i + 1);
            }
        }
        from = at + 1;
    }
    None
}
