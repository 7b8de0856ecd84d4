//! The admin API of feeds (DESIGN §7 "Admin API", docs/feeds.md): `GET /feeds`,
//! `GET /feeds/{id}`, `PUT /feeds/{id}`, `POST /feeds/{id}/start|stop`, `DELETE /feeds/{id}`,
//! behind the admin token like `/connections`. The core routes the request and hands it to
//! the feeds thread ([`crate::feeds::runtime::Command::Admin`]); the answer comes back through
//! [`crate::server::feed_port`] and is written then, so a core never waits on the lease store.

use super::auth::Guarded;
use crate::feeds::admin::{AdminReply, AdminRequest};
use crate::feeds::runtime::Command;
use crate::http;
use crate::http::StatusCode;
use crate::http::{Method, Request};
use crate::server::core::CoreState;
use crate::server::ConnId;

/// What a `/feeds…` request resolves to before the feeds thread sees it.
enum Route {
    /// Hand it to the feeds thread.
    Ask(AdminRequest),
    /// Answer at once: a status, its reason and the `Allow` header of a 405.
    Refuse(StatusCode, &'static str, Option<&'static str>),
}

/// Routes `method` on `rest`, the path after `/feeds`.
fn route(method: Method, rest: &str, body: &[u8]) -> Route {
    let segments: Vec<&str> = rest.strip_prefix('/').map_or(Vec::new(), |r| r.split('/').collect());
    match (method, segments.as_slice()) {
        (Method::Get | Method::Head, []) => Route::Ask(AdminRequest::List),
        (_, []) => Route::Refuse(StatusCode::METHOD_NOT_ALLOWED, "use GET or HEAD", Some("GET, HEAD")),
        (Method::Get | Method::Head, [id]) => Route::Ask(AdminRequest::Get((*id).into())),
        (Method::Put, [id]) => Route::Ask(AdminRequest::Put((*id).into(), body.to_vec())),
        (Method::Delete, [id]) => Route::Ask(AdminRequest::Delete((*id).into())),
        (_, [_]) => Route::Refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "use GET, HEAD, PUT or DELETE",
            Some("GET, HEAD, PUT, DELETE"),
        ),
        (Method::Post, [id, "start"]) => Route::Ask(AdminRequest::Start((*id).into())),
        (Method::Post, [id, "stop"]) => Route::Ask(AdminRequest::Stop((*id).into())),
        (_, [_, "start" | "stop"]) => Route::Refuse(StatusCode::METHOD_NOT_ALLOWED, "use POST", Some("POST")),
        _ => Route::Refuse(StatusCode::NOT_FOUND, "no such endpoint", None),
    }
}

impl CoreState {
    /// `/feeds…`: checks the admin token (401), routes (404, 405), then asks the feeds thread.
    pub(super) fn feeds_api(&mut self, id: ConnId, req: &Request, body: &[u8]) {
        let keep_alive = req.keep_alive;
        if let Err(r) = self.check_admin(id, req) {
            return self.refuse_auth(id, Guarded::Admin, r, keep_alive);
        }
        let ask = match route(req.method, &req.path["/feeds".len()..], body) {
            Route::Ask(a) => a,
            Route::Refuse(status, reason, allow) => {
                let allow: Vec<(&str, &str)> = allow.map(|a| ("Allow", a)).into_iter().collect();
                return self.send(id, http::error_response(status, reason, &allow, keep_alive), keep_alive);
            }
        };
        if let Some(s) = self.session(id) {
            s.await_answer(keep_alive);
        }
        let answer = self.shared.feed_ports.answerer(self.me, id);
        if let Err(e) = self.shared.feed_commands.send(Command::Admin(ask, answer)) {
            if let Command::Admin(_, answer) = e.0 {
                answer(AdminReply::unavailable("the feed runtime has stopped"));
            }
        }
    }

    /// The feeds thread answered the admin request of `id`.
    pub fn answer_feeds(&mut self, id: ConnId, reply: AdminReply) {
        let Some(keep_alive) = self.session(id).and_then(|s| s.awaiting()) else { return };
        let resp = http::response(reply.status, "application/json", &reply.body, &[], keep_alive);
        self.send(id, resp, keep_alive);
        self.serve_pending(id);
    }
}
