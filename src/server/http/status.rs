//! The live status page (docs/operations.md, "Status page"): `GET /status` (an HTML page),
//! its script and style sheet (`GET /status/status.js`, `GET /status/status.css`), and the
//! JSON it polls about every second, `GET /status.json`.
//!
//! The assets are compiled into the binary (`include_str!`: no CDN, no external font, no
//! build step) and hold no data. The data is `/status.json`: the counters of `/metrics`, read
//! from the same per-core atomics, plus each core's summed queues, the top connections by
//! queued bytes and the presence channels with the most members, gathered from every core over
//! the bus like `/connections`. It is guarded
//! like `/connections` (`admin.token`, or with no token only local peers).
//!
//! A browser cannot attach `Authorization` to a navigation, so a refused `GET /status` is
//! answered 401 *with the page*: the page takes the token from its URL fragment
//! (`/status#token=…`, never sent to the server nor in a `Referer`), keeps it in the tab's
//! `sessionStorage`, and sends it as `Authorization: Bearer` on every `/status.json` fetch;
//! when that fetch is refused, the page shows the server's reason and how to pass the token.

use crate::http::StatusCode;
use std::sync::atomic::Ordering::Relaxed;

use serde_json::{json, Map, Value};

use super::auth::Guarded;
use super::inspect::Gather;
use crate::http;
use crate::http::{Method, Request};
use crate::server::bus::{ConnRow, CoreLoad, PresenceRow};
use crate::server::conn::ConnId;
use crate::server::core::CoreState;
use crate::server::Shared;
use crate::session::stats::OVERFLOW_POLICIES;
use crate::session::ReapReason;

/// The page, its script and its style sheet, as compiled in.
const PAGE: &str = include_str!("status/status.html");
const SCRIPT: &str = include_str!("status/status.js");
const STYLE: &str = include_str!("status/status.css");

/// Only this origin's script, style and fetches; nothing inline, no frames, no forms. The
/// page builds its sparklines as SVG elements through the DOM, which this allows.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The resources under `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// `GET /status`: the HTML page (guarded; refused, it is still sent, with 401).
    Page,
    /// `GET /status.json`: the data (guarded like `/connections`).
    Json,
    /// `GET /status/status.js`: the page's script (open: it holds no data).
    Script,
    /// `GET /status/status.css`: the page's style sheet (open).
    Style,
}

impl Resource {
    /// The resource at `path` (the request target without its query), if it is one.
    pub fn at(path: &str) -> Option<Resource> {
        match path {
            "/status" => Some(Resource::Page),
            "/status.json" => Some(Resource::Json),
            "/status/status.js" => Some(Resource::Script),
            "/status/status.css" => Some(Resource::Style),
            _ => None,
        }
    }
}

impl CoreState {
    /// Answers a request for one of the status [`Resource`]s: GET and HEAD only (else 405
    /// with `Allow`), the admin guard on the page and the JSON.
    pub fn serve_status(&mut self, id: ConnId, req: &Request, what: Resource) {
        let keep_alive = req.keep_alive;
        if !matches!(req.method, Method::Get | Method::Head) {
            let resp = http::error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "use GET or HEAD",
                &[("Allow", "GET, HEAD")],
                keep_alive,
            );
            return self.send(id, resp, keep_alive);
        }
        let guard = match what {
            Resource::Page | Resource::Json => self.check_admin(id, req),
            Resource::Script | Resource::Style => Ok(()),
        };
        let nosniff = ("X-Content-Type-Options", "nosniff");
        let resp = match what {
            Resource::Script => {
                let headers = [("Cache-Control", "no-cache"), nosniff];
                http::response(
                    StatusCode::OK,
                    "text/javascript; charset=utf-8",
                    SCRIPT.as_bytes(),
                    &headers,
                    keep_alive,
                )
            }
            Resource::Style => {
                let headers = [("Cache-Control", "no-cache"), nosniff];
                http::response(StatusCode::OK, "text/css; charset=utf-8", STYLE.as_bytes(), &headers, keep_alive)
            }
            Resource::Page => {
                // Refused, the page is still what the browser needs: it carries no data, and
                // its script gets the token to `/status.json`. Not counted as an auth failure:
                // every browser that opens the page with a token gets this 401 first.
                let (status, challenge) = match guard {
                    Ok(()) => (StatusCode::OK, None),
                    Err(r) if r.status == StatusCode::UNAUTHORIZED => {
                        (StatusCode::UNAUTHORIZED, Some(("WWW-Authenticate", r.challenge)))
                    }
                    Err(r) => return self.refuse_auth(id, Guarded::Admin, r, keep_alive),
                };
                let mut headers = vec![
                    ("Cache-Control", "no-store"),
                    ("Content-Security-Policy", CSP),
                    ("Referrer-Policy", "no-referrer"),
                    nosniff,
                ];
                headers.extend(challenge);
                http::response(status, "text/html; charset=utf-8", PAGE.as_bytes(), &headers, keep_alive)
            }
            Resource::Json => {
                if let Err(r) = guard {
                    return self.refuse_auth(id, Guarded::Admin, r, keep_alive);
                }
                if let Some(s) = self.conn(id) {
                    s.session.await_answer(keep_alive);
                }
                return self.start_inspect(id, super::inspect::top_of(req), Gather::Status);
            }
        };
        self.send(id, resp, keep_alive);
    }

    /// Every core answered the `GET /status.json` of `id`: its top connections, loads and
    /// presence channels.
    pub fn answer_status(&mut self, id: ConnId, top: Vec<ConnRow>, loads: Vec<CoreLoad>, presence: Vec<PresenceRow>) {
        let Some(keep_alive) = self.session(id).and_then(|s| s.awaiting()) else { return };
        let body = status_json(&self.shared, self.clock.now_ms(), top, &loads, presence);
        let headers = [("Cache-Control", "no-store")];
        self.send(id, http::response(StatusCode::OK, "application/json", &body, &headers, keep_alive), keep_alive);
        self.serve_pending(id);
    }
}

/// The body of `GET /status.json` (its fields are listed in docs/http.md). Counters and
/// gauges are read from the same per-core atomics as `/metrics` (`*_total` keys are the
/// `tether_*_total` counters), `uptime_ms` is the process's clock in milliseconds (the page
/// divides counter deltas by its deltas for the rates), `loads` has one entry per core
/// in core order, and `presence` lists the presence channels with the most members, most first.
pub fn status_json(
    shared: &Shared,
    uptime_ms: u64,
    top: Vec<ConnRow>,
    loads: &[CoreLoad],
    presence: Vec<PresenceRow>,
) -> Vec<u8> {
    let m = &shared.metrics;
    let gauge = |v: i64| v.max(0) as u64;
    let cores: Vec<Value> = m
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let load =
                loads.iter().find(|l| l.core == i).copied().unwrap_or(CoreLoad { core: i, ..CoreLoad::default() });
            json!({
                "core": i,
                "connections": gauge(c.connections.load(Relaxed)),
                "sse_connections": gauge(c.sse_connections.load(Relaxed)),
                "published_total": c.published.load(Relaxed),
                "delivered_total": c.delivered.load(Relaxed),
                "queued_bytes": load.queued_bytes,
                "queued_messages": load.queued_messages,
                "backlogged": load.backlogged,
                "drain_remaining": gauge(c.session.drain_remaining.load(Relaxed)),
                "bus_spilled": gauge(c.bus_spilled.load(Relaxed)),
            })
        })
        .collect();
    let sum = |f: &dyn Fn(&crate::server::metrics::CoreMetrics) -> u64| m.iter().map(f).sum::<u64>();
    let mut overflow = Map::new();
    for (i, policy) in OVERFLOW_POLICIES.iter().enumerate() {
        overflow.insert((*policy).into(), sum(&|c| c.session.overflows()[i]).into());
    }
    let mut reaped = Map::new();
    for why in ReapReason::ALL {
        reaped.insert(why.as_str().into(), sum(&|c| c.reaped_count(why)).into());
    }
    let cfg = &shared.config;
    let body = json!({
        "uptime_ms": uptime_ms,
        "connections": sum(&|c| gauge(c.connections.load(Relaxed))),
        "connections_by_transport": {
            "websocket": sum(&|c| gauge(c.connections.load(Relaxed) - c.sse_connections.load(Relaxed))),
            "sse": sum(&|c| gauge(c.sse_connections.load(Relaxed))),
        },
        "max_connections": cfg.max_connections,
        "channels": shared.channels.count(),
        "published_total": sum(&|c| c.published.load(Relaxed)),
        "delivered_total": sum(&|c| c.delivered.load(Relaxed)),
        "publish_duplicates_total": sum(&|c| c.publish_duplicates.load(Relaxed)),
        "pings_sent_total": sum(&|c| c.session.pings_sent.load(Relaxed)),
        "overflow_total": overflow,
        "reaped_total": reaped,
        "heartbeat": {
            "ping_interval_ms": cfg.heartbeat.ping_interval_ms,
            "pong_timeout_ms": cfg.heartbeat.pong_timeout_ms,
        },
        "drain": {
            "draining": shared.draining(),
            "close_code": shared.drain_code().map(u16::from),
            "remaining": sum(&|c| gauge(c.session.drain_remaining.load(Relaxed))),
        },
        "broker": {
            "kind": cfg.broker.kind.as_str(),
            "up": shared.broker.up.load(Relaxed),
            "pubsub_up": shared.broker.pubsub_up.load(Relaxed),
        },
        "presence": {
            "members": sum(&|c| gauge(c.presence_members.load(Relaxed))),
            "untracked_total": sum(&|c| c.presence_untracked.load(Relaxed)),
            "windows_total": {
                "diff": sum(&|c| c.presence_frames[0].load(Relaxed)),
                "reset": sum(&|c| c.presence_frames[1].load(Relaxed)),
            },
            "channels": presence,
        },
        "compression": {
            "deflate_connections": sum(&|c| gauge(c.session.deflate_connections.load(Relaxed))),
            "messages_total": {
                "compressed": sum(&|c| c.session.deflate.compressed.load(Relaxed)),
                "plain": sum(&|c| c.session.deflate.skipped.load(Relaxed)),
            },
            "bytes_total": {
                "plain": sum(&|c| c.session.deflate.plain_bytes.load(Relaxed)),
                "deflated": sum(&|c| c.session.deflate.deflated_bytes.load(Relaxed)),
            },
        },
        "cores": cores,
        "top": top,
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_by_path() {
        assert_eq!(Resource::at("/status"), Some(Resource::Page));
        assert_eq!(Resource::at("/status.json"), Some(Resource::Json));
        assert_eq!(Resource::at("/status/status.js"), Some(Resource::Script));
        assert_eq!(Resource::at("/status/status.css"), Some(Resource::Style));
        for other in ["/status/", "/status/other.js", "/statusx", "/Status"] {
            assert_eq!(Resource::at(other), None, "{other}");
        }
    }

    #[test]
    fn top_defaults_to_10_and_stops_at_10000() {
        let top = |target: &str| {
            let head = format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n");
            crate::server::http::inspect::top_of(&crate::http::parse_request(head.as_bytes(), 8192).unwrap().unwrap())
        };
        assert_eq!(top("/status.json"), 10);
        assert_eq!(top("/status.json?top=3"), 3);
        assert_eq!(top("/status.json?top=0"), 0);
        assert_eq!(top("/status.json?top=99999999"), 10_000);
        assert_eq!(top("/status.json?top=x"), 10);
    }

    #[test]
    fn assets_load_nothing_from_elsewhere() {
        for (name, text) in [("status.html", PAGE), ("status.js", SCRIPT), ("status.css", STYLE)] {
            // The SVG namespace is a name, not a place anything is loaded from.
            let text = text.replace("\"http://www.w3.org/2000/svg\"", "");
            for external in ["http://", "https://", "//fonts.", "@import"] {
                assert!(!text.contains(external), "{name} refers to {external}");
            }
        }
        // Everything the page links is served.
        for linked in ["status/status.js", "status/status.css"] {
            assert!(PAGE.contains(linked) && Resource::at(&format!("/{linked}")).is_some(), "{linked}");
        }
    }
}
