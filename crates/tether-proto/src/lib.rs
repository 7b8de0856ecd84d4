//! tether-proto — the sans-IO core of tether: bytes in, bytes and decisions out. Nothing here
//! opens a socket, reads a clock or starts a thread; the server (`tether`), its client and its
//! load tool drive it. Its `Cargo.toml` holds no runtime, socket or OS crate (no monoio,
//! tokio, mio, socket2 or libc), and the workspace's `tests/layers.rs` fails when one appears,
//! so sans-IO is a build failure to break, not a comment.
//!
//! # Layout
//!
//! Bottom first: a module names only modules above it in this list.
//!
//! - [`http`]: plain HTTP/1.1: request heads parsed ([`http::request`]), bodies decoded
//!   ([`http::body`]), responses built ([`http::response`](mod@http::response)) for the
//!   non-WebSocket endpoints and refused upgrades (RFC 9110, RFC 9112; docs/http.md).
//! - [`ws`]: RFC 6455 pieces: [`ws::handshake`] (the upgrade check on a parsed request,
//!   §4.2) and [`ws::codec`] (frame decoding and encoding, fragments, UTF-8, close codes,
//!   §5–§7).
//! - [`published`]: one published message in every encoding a subscriber may take (plain,
//!   permessage-deflate), each made at most once for the whole process, lazily.
//! - [`protocol`]: the pub/sub wire protocol v1 (docs/protocol.md): client ops in, server
//!   frames out, the close-code contract and the reconnect backoff.
//! - [`sse`]: Server-Sent Events (WHATWG HTML §9.2): the `GET /sse` response head, message,
//!   reset, error and close events (each message's encoded once and shared), heartbeat
//!   comments, and the positions (`Last-Event-ID`, `from=`) a client resumes from.
//! - [`tick`]: the session's time base (a [`tick::Tick`] of 10 ms, passed in, never read) and
//!   the heartbeat grid a core files pings on.
//! - [`session`]: one connection's decisions (quinn-proto's shape: `handle_*` in, `poll_*`
//!   out, events handed up through [`session::Events::poll_event`]): HTTP requests and the
//!   upgrade, frames, the close handshake, heartbeats, the outbound queue and its overflow
//!   policies, resume replay pacing, per-connection limits and token expiry, and what they
//!   count ([`session::SessionStats`]). The server keeps one [`session::Session`] per
//!   connection in its core's slab and does its I/O.
//! - [`duration`]: durations as an operator types them (`30s`, `500ms`, `1.5m`), for the
//!   server's, the client's and the load tool's command lines.
//! - [`redact`]: URLs with their secrets taken out, for logs and error messages (used by the
//!   server's log lines and the client's alike).

#![warn(missing_docs, unreachable_pub)]

pub mod duration;
pub mod http;
pub mod protocol;
pub mod published;
pub mod redact;
pub mod session;
pub mod sse;
pub mod tick;
pub mod ws;
