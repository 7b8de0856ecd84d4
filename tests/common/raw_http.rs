//! A raw HTTP/1.1 client on `std::net::TcpStream` for the RFC 9110/9112 tests: bytes go out
//! exactly as written, responses are split by hand. Every read is bounded by a deadline and a
//! helper that runs out of time panics with what it saw.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::STEP;

/// One response as read off the wire.
#[derive(Debug, Clone)]
pub struct Response {
    /// `HTTP/1.1` (the version of the status line).
    pub version: String,
    pub status: u16,
    /// The head, status line to the last header line, without the final CRLFCRLF.
    pub head: String,
    /// The content, as framed by `Content-Length` (empty for HEAD, 1xx, 204, 304).
    pub body: Vec<u8>,
}

impl Response {
    /// Values of header `name` (case-insensitive), in order.
    pub fn headers(&self, name: &str) -> Vec<&str> {
        self.head
            .split("\r\n")
            .skip(1)
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim())
            })
            .collect()
    }

    /// The one value of header `name`; panics when it is missing or repeated.
    pub fn header(&self, name: &str) -> &str {
        match self.headers(name).as_slice() {
            [v] => v,
            other => panic!("header {name}: {other:?} in\n{}", self.head),
        }
    }

    /// Whether header `name` is present.
    pub fn has(&self, name: &str) -> bool {
        !self.headers(name).is_empty()
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A raw connection.
pub struct RawHttp {
    pub s: TcpStream,
    /// Bytes read and not yet consumed.
    pub buf: Vec<u8>,
}

impl RawHttp {
    pub fn connect(addr: SocketAddr) -> RawHttp {
        let s = TcpStream::connect_timeout(&addr, STEP).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        RawHttp { s, buf: Vec::new() }
    }

    /// Connects from source address `from` (e.g. 127.0.0.2, standing for a remote peer of a
    /// server that admits only 127.0.0.1 as local).
    pub fn connect_from(from: std::net::IpAddr, addr: SocketAddr) -> RawHttp {
        let domain = socket2::Domain::for_address(addr);
        let sock = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP)).expect("socket");
        sock.bind(&SocketAddr::new(from, 0).into()).expect("bind source address");
        sock.connect_timeout(&addr.into(), STEP).expect("connect");
        let s: TcpStream = sock.into();
        s.set_nodelay(true).expect("nodelay");
        RawHttp { s, buf: Vec::new() }
    }

    /// Writes `bytes` as they are.
    pub fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.s.write_all(bytes.as_ref()).expect("write request");
    }

    /// Reads more bytes before `deadline`: `Some(n)` (0 = EOF), `None` when the deadline
    /// passed with nothing new.
    fn fill(&mut self, deadline: Instant) -> Option<usize> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        self.s.set_read_timeout(Some(left)).expect("read timeout");
        let mut chunk = [0u8; 16384];
        match self.s.read(&mut chunk) {
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Some(n)
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => None,
            // A reset counts as the end of the stream.
            Err(_) => Some(0),
        }
    }

    /// The next response; `head_request` says the request was HEAD (no content follows).
    pub fn response_to(&mut self, head_request: bool) -> Response {
        let deadline = Instant::now() + STEP;
        let end = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            match self.fill(deadline) {
                Some(0) => {
                    panic!("connection ended before a full response head; got {:?}", String::from_utf8_lossy(&self.buf))
                }
                Some(_) => {}
                None => panic!("no full response head within {STEP:?}; got {:?}", String::from_utf8_lossy(&self.buf)),
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end + 4);
        let mut parts = head.splitn(3, ' ');
        let version = parts.next().unwrap_or_default().to_owned();
        let status: u16 =
            parts.next().and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("bad status line in {head:?}"));
        let mut r = Response { version, status, head, body: Vec::new() };
        let bodiless = head_request || (100..200).contains(&status) || status == 204 || status == 304;
        if !bodiless {
            let len: usize =
                r.headers("content-length").first().map(|v| v.parse().expect("Content-Length")).unwrap_or(0);
            while self.buf.len() < len {
                match self.fill(deadline) {
                    Some(0) => panic!("connection ended mid-content ({} of {len} bytes)", self.buf.len()),
                    Some(_) => {}
                    None => panic!("content incomplete after {STEP:?} ({} of {len} bytes)", self.buf.len()),
                }
            }
            r.body = self.buf.drain(..len).collect();
        }
        r
    }

    /// The next response to a non-HEAD request.
    pub fn response(&mut self) -> Response {
        self.response_to(false)
    }

    /// Asserts that nothing arrives within `d` (the connection stays open and silent).
    pub fn silent_for(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        while Instant::now() < deadline {
            match self.fill(deadline) {
                None => break,
                Some(0) => panic!("connection ended while silence was expected"),
                Some(_) => {}
            }
        }
        assert!(self.buf.is_empty(), "expected nothing, got {:?}", String::from_utf8_lossy(&self.buf));
    }

    /// Reads until the server ends the connection (within `limit`) and returns whatever came
    /// before the end; panics if the connection is still open after `limit`.
    pub fn until_closed(&mut self, limit: Duration) -> Vec<u8> {
        let deadline = Instant::now() + limit;
        loop {
            match self.fill(deadline) {
                Some(0) => return std::mem::take(&mut self.buf),
                Some(_) => {}
                None => panic!("connection still open after {limit:?}; got {:?}", String::from_utf8_lossy(&self.buf)),
            }
        }
    }
}

/// Sends `request` on a fresh connection and returns the first response.
pub fn ask(addr: SocketAddr, request: &str) -> Response {
    let mut c = RawHttp::connect(addr);
    c.send(request);
    c.response_to(request.starts_with("HEAD "))
}
