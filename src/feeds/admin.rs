//! The admin API's side in the feeds thread (`/feeds`, DESIGN §7 "Admin API", docs/feeds.md):
//! the HTTP code on a core parses the request into an [`AdminRequest`], hands it to the feeds
//! thread and answers with the [`AdminReply`] when it comes back; the core never waits on the
//! store.

use crate::http::StatusCode;
use std::sync::atomic::Ordering::Relaxed;

use serde_json::{json, Value};

use super::record::{validate_id, DesiredState, Feed, FeedDef};
use super::runtime::{now_ms, Supervisor};
use super::{LeaseError, LeaseStore};

/// One admin request about feeds. Ids are checked by the feeds thread (400 naming `id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminRequest {
    /// `GET /feeds`: every feed.
    List,
    /// `GET /feeds/{id}`: one feed with its live fields.
    Get(String),
    /// `PUT /feeds/{id}` with its JSON body (the `[[feeds.static]]` fields; `id` optional,
    /// equal to the path's when given).
    Put(String, Vec<u8>),
    /// `POST /feeds/{id}/start`.
    Start(String),
    /// `POST /feeds/{id}/stop`.
    Stop(String),
    /// `DELETE /feeds/{id}`.
    Delete(String),
}

/// The answer: an HTTP status and a JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminReply {
    /// 200, 201, 400, 404 or 503.
    pub status: StatusCode,
    /// Compact JSON: the record(s), or `{"error":…,"field":…}`.
    pub body: Vec<u8>,
}

impl AdminReply {
    fn json(status: StatusCode, v: &Value) -> AdminReply {
        AdminReply { status, body: serde_json::to_vec(v).unwrap_or_default() }
    }

    /// 400 naming `field`.
    pub fn bad(field: &str, reason: impl std::fmt::Display) -> AdminReply {
        AdminReply::json(StatusCode::BAD_REQUEST, &json!({"error": format!("{field}: {reason}"), "field": field}))
    }

    fn not_found(id: &str) -> AdminReply {
        AdminReply::json(StatusCode::NOT_FOUND, &json!({"error": format!("no feed {id}")}))
    }

    /// 503: the lease store cannot answer now.
    pub fn unavailable(reason: impl std::fmt::Display) -> AdminReply {
        AdminReply::json(StatusCode::SERVICE_UNAVAILABLE, &json!({"error": reason.to_string()}))
    }

    fn from_store(e: LeaseError) -> AdminReply {
        match e {
            LeaseError::Invalid(f) => AdminReply::bad(f.field, f.reason),
            LeaseError::NotFound => AdminReply::json(StatusCode::NOT_FOUND, &json!({"error": "no such feed"})),
            // Sent and not answered in time: 504, and the body says so (docs/feeds.md).
            e @ LeaseError::Unknown(_) => AdminReply::json(
                StatusCode::GATEWAY_TIMEOUT,
                &json!({"error": format!("{e}: read the feed, or retry the same request"), "outcome": "unknown"}),
            ),
            other => AdminReply::unavailable(other),
        }
    }
}

/// Parses a `PUT /feeds/{id}` body: a JSON object of the [`FeedDef`] fields, unknown fields
/// refused, a repeated key refused (naming it), `id` taken from the path. Errors name the
/// field.
pub fn parse_put(id: &str, body: &[u8]) -> Result<FeedDef, AdminReply> {
    let mut v: Value = crate::http::json::parse_unique(body).map_err(|e| {
        let msg = e.to_string();
        match msg.strip_prefix("duplicate field `").and_then(|m| m.split('`').next()) {
            Some(field) => AdminReply::bad(field, format!("{msg}: a field may appear once")),
            None => AdminReply::bad("body", format!("not JSON: {msg}")),
        }
    })?;
    let Some(obj) = v.as_object_mut() else { return Err(AdminReply::bad("body", "must be a JSON object")) };
    match obj.get("id") {
        None => {
            obj.insert("id".into(), Value::String(id.into()));
        }
        Some(Value::String(s)) if s == id => {}
        Some(_) => return Err(AdminReply::bad("id", "must equal the id in the path (or be left out)")),
    }
    let def: FeedDef = serde_json::from_value(v).map_err(|e| {
        let msg = e.to_string();
        let field = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"))
            .unwrap_or("body")
            .to_owned();
        AdminReply::bad(&field, msg)
    })?;
    def.validate().map_err(|e| AdminReply::bad(e.field, e.reason))?;
    Ok(def)
}

impl Supervisor {
    /// Serves one admin request.
    pub(super) async fn admin(&mut self, req: AdminRequest) -> AdminReply {
        let id = match &req {
            AdminRequest::List => None,
            AdminRequest::Get(id)
            | AdminRequest::Put(id, _)
            | AdminRequest::Start(id)
            | AdminRequest::Stop(id)
            | AdminRequest::Delete(id) => Some(id.clone()),
        };
        if let Some(Err(e)) = id.as_deref().map(validate_id) {
            return AdminReply::bad(e.field, e.reason);
        }
        let id = id.unwrap_or_default();
        match req {
            AdminRequest::List => match self.bounded(self.store.list()).await {
                Ok(mut feeds) => {
                    feeds.sort_by(|a, b| a.def.id.cmp(&b.def.id));
                    AdminReply::json(StatusCode::OK, &Value::Array(feeds.iter().map(|f| self.view(f)).collect()))
                }
                Err(e) => AdminReply::from_store(e),
            },
            AdminRequest::Get(_) => match self.bounded(self.store.get(&id)).await {
                Ok(Some(f)) => AdminReply::json(StatusCode::OK, &self.view(&f)),
                Ok(None) => AdminReply::not_found(&id),
                Err(e) => AdminReply::from_store(e),
            },
            AdminRequest::Put(_, body) => {
                let def = match parse_put(&id, &body) {
                    Ok(d) => d,
                    Err(r) => return r,
                };
                let created = match self.bounded(self.store.put(&def)).await {
                    Ok(c) => c,
                    Err(e) => return AdminReply::from_store(e),
                };
                self.settle(&id).await;
                self.get_reply(&id, if created { StatusCode::CREATED } else { StatusCode::OK }).await
            }
            AdminRequest::Start(_) | AdminRequest::Stop(_) => {
                let want =
                    if matches!(req, AdminRequest::Start(_)) { DesiredState::Started } else { DesiredState::Stopped };
                let mut def = match self.bounded(self.store.get(&id)).await {
                    Ok(Some(f)) => f.def,
                    Ok(None) => return AdminReply::not_found(&id),
                    Err(e) => return AdminReply::from_store(e),
                };
                def.desired_state = want;
                if let Err(e) = self.bounded(self.store.put(&def)).await {
                    return AdminReply::from_store(e);
                }
                self.settle(&id).await;
                self.get_reply(&id, StatusCode::OK).await
            }
            AdminRequest::Delete(_) => match self.bounded(self.store.delete(&id)).await {
                Ok(true) => {
                    self.hard_stop(&id).await;
                    AdminReply::json(StatusCode::OK, &json!({"deleted": id}))
                }
                Ok(false) => AdminReply::not_found(&id),
                Err(e) => AdminReply::from_store(e),
            },
        }
    }

    /// After a change through the API: apply it here at once (stop and release a STOPPED feed
    /// held here, acquire a free STARTED one, reconnect a changed one). Other nodes apply it
    /// at their next renew or reconcile.
    async fn settle(&mut self, id: &str) {
        if let Ok(Some(f)) = self.bounded(self.store.get(id)).await {
            self.check_one(f).await;
        }
    }

    /// The answer to a write that succeeded: `status` with the feed as read back. A read that
    /// fails then does not turn the answer into a failure (the write happened).
    async fn get_reply(&self, id: &str, status: StatusCode) -> AdminReply {
        match self.bounded(self.store.get(id)).await {
            Ok(Some(f)) => AdminReply::json(status, &self.view(&f)),
            Ok(None) => AdminReply::not_found(id),
            Err(e) => AdminReply::json(
                status,
                &json!({"id": id, "written": true, "error": format!("reading it back failed: {e}")}),
            ),
        }
    }

    /// The record as the API shows it, with the live fields `connected`, `lag_ms` and
    /// `reconnects` when this node owns the feed (`null` otherwise: only the owner knows).
    fn view(&self, f: &Feed) -> Value {
        let mut v = serde_json::to_value(f).unwrap_or(Value::Null);
        let live = self.shared.metrics().find(&f.def.id).filter(|p| p.owned.load(Relaxed));
        if let Some(obj) = v.as_object_mut() {
            let now = now_ms();
            obj.insert("connected".into(), live.as_ref().map_or(Value::Null, |p| p.connected.load(Relaxed).into()));
            obj.insert("lag_ms".into(), live.as_ref().and_then(|p| p.lag_ms(now)).map_or(Value::Null, Value::from));
            obj.insert("reconnects".into(), live.as_ref().map_or(Value::Null, |p| p.reconnects.load(Relaxed).into()));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_body_errors_name_the_field() {
        let ok = br#"{"url":"ws://h/s","channel":"c","seq_pointer":"/seq"}"#;
        assert_eq!(parse_put("a", ok).unwrap().id, "a");
        let field = |body: &[u8]| {
            let r = parse_put("a", body).unwrap_err();
            assert_eq!(r.status, 400);
            serde_json::from_slice::<Value>(&r.body).unwrap()["field"].as_str().unwrap().to_owned()
        };
        assert_eq!(field(br#"{"url":"http://h/","channel":"c","seq_pointer":"/seq"}"#), "url");
        assert_eq!(field(br#"{"url":"ws://h/","channel":"c","seq_pointer":"/seq","colour":1}"#), "colour");
        assert_eq!(field(br#"{"url":"ws://h/","seq_pointer":"/seq"}"#), "channel");
        assert_eq!(field(br#"{"id":"b","url":"ws://h/","channel":"c","seq_pointer":"/seq"}"#), "id");
        assert_eq!(field(b"[1]"), "body");
        assert_eq!(field(b"{"), "body");
    }
}
