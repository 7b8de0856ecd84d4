//! The HTTP side of a core: what a plain HTTP request on the WebSocket port is routed to and
//! how it is answered. Requests are parsed by the session
//! ([`Session::next_request`](crate::session::Session::next_request), with
//! [`crate::http::parse_request`]); the bytes of every answer are built by [`crate::http`].
//!
//! - [`route`]: the router: the upgrade (`GET /ws`, `GET /echo`), `POST /publish/{channel}`,
//!   `/healthz`, `/readyz`, `/metrics`, `/connections`, and the refusals.
//! - [`sse`]: `GET /sse`, a Server-Sent Events stream of one or more channels, admitted as an
//!   upgrade is and resumed by `Last-Event-ID` / `from=`.
//! - [`auth`]: the guards of the HTTP API: publish keys on `POST /publish/{channel}`, the
//!   admin token (or a loopback peer) on the admin endpoints, and the browser guard (403, 421).
//! - [`feeds`]: the admin API of feeds (`/feeds`), answered by the feeds thread.
//! - [`status`]: the live status page `GET /status`, its assets (compiled in from
//!   `server/http/status/`) and `GET /status.json`.
//! - [`inspect`]: `GET /connections` and the per-core part of `/status.json`, gathered from
//!   every core.
//! - [`api`]: the server API under `/api/` (docs/api.md): batch publish, history, channels,
//!   disconnect, unsubscribe, revoke.

pub mod api;
pub mod auth;
pub mod feeds;
pub mod inspect;
pub mod route;
pub mod sse;
pub mod status;
