//! Plain HTTP/1.1, sans-IO: request heads parsed from bytes (the WebSocket upgrade included,
//! whose RFC 6455 checks are `crate::ws::handshake`'s), request targets and bodies decoded,
//! responses built as bytes for the non-WebSocket endpoints (`POST /publish/{channel}`,
//! `/healthz`, `/readyz`, `/metrics`, `/connections`, …) and for refused upgrades.
//!
//! - [`request`]: the request head ([`parse_request`] → [`Request`] or [`HttpError`]) and the
//!   target ([`percent_decode`], [`query_param`]).
//! - [`body`]: the `chunked` transfer coding ([`decode_chunked`]).
//! - [`response`](mod@response): responses and heads, the JSON error body, refused upgrades, `HEAD`
//!   answers, `Expect: 100-continue`.
//! - `date`: the `Date` header (IMF-fixdate), formatted once per second.
//! - [`json`]: JSON bodies that refuse duplicate keys.
//!
//! Which requirement of RFC 9110/9112 is met where: `docs/http.md`.

pub mod body;
mod date;
pub mod json;
pub mod request;
pub mod response;

/// HTTP status codes (RFC 9110 §15), from the `http` crate: every status tether answers with.
pub use ::http::StatusCode;
pub use body::decode_chunked;
pub use date::imf_fixdate;
pub use request::{parse_request, percent_decode, query_param, query_values, HttpError, Method, Request, MAX_HEADERS};
pub use response::{
    error_response, expectation, handshake_rejection, head_only, reason_phrase, response, response_head, stream_head,
    Expectation, CONTINUE,
};

#[cfg(test)]
mod tests;
