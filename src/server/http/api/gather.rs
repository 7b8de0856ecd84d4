//! API answers assembled from several answers: a batch publish (one answer per channel, from
//! each channel's home, in any order), `GET /api/channels` (one answer per core) and the
//! node-wide actions (one answer per core, plus the broker's about the other nodes). Each
//! waits in the asking core's [`ApiState`](crate::server::control::ApiState), keyed by the
//! HTTP connection, until its last part arrives.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::input::BatchPublish;
use super::{json_response, unavailable};
use crate::http::StatusCode;
use crate::protocol::RequestError;
use crate::server::broker::{Control, PublishResult};
use crate::server::conn::ConnId;
use crate::server::core::CoreState;

/// A batch publish waiting for its channels' answers.
#[derive(Debug)]
pub struct Batch {
    /// The channels in request order.
    chans: Vec<Arc<str>>,
    /// Their answers, as they come.
    results: Vec<Option<PublishResult>>,
    /// Answers still to come.
    missing: usize,
}

/// A request waiting for answers from every core (and the broker).
#[derive(Debug)]
pub struct Gathering {
    /// The HTTP connection that asked.
    pub conn: ConnId,
    /// Answers still to come.
    pub missing: usize,
    /// What is gathered.
    pub pending: Pending,
}

/// What a [`Gathering`] collects.
#[derive(Debug)]
pub enum Pending {
    /// `GET /api/channels`: subscribers per channel, summed over the cores.
    Channels {
        /// Channel → subscribers on this node.
        rows: BTreeMap<Arc<str>, u64>,
        /// Rows wanted.
        limit: usize,
        /// Some core had more matching channels than `limit`.
        truncated: bool,
    },
    /// A node-wide action.
    Control {
        /// The action.
        msg: Arc<Control>,
        /// Connections (or subscriptions) affected on this node so far.
        affected: u64,
        /// The broker's answer about the other nodes, once it came.
        sent: Option<Result<u64, Box<RequestError>>>,
    },
}

impl Pending {
    /// A channels listing of at most `limit` rows.
    pub fn channels(limit: usize) -> Pending {
        Pending::Channels { rows: BTreeMap::new(), limit, truncated: false }
    }

    /// A node-wide action.
    pub fn control(msg: Arc<Control>) -> Pending {
        Pending::Control { msg, affected: 0, sent: None }
    }
}

impl CoreState {
    /// `POST /api/publish`: one broker publish per channel (the path of `POST
    /// /publish/{ch}`: same dedup with `id` as each channel's Idempotency-Key, same size
    /// limit), answered once every channel's home has.
    pub(super) fn start_batch(&mut self, id: ConnId, p: BatchPublish) {
        let chans: Vec<Arc<str>> = p.channels.iter().map(|c| Arc::from(c.as_str())).collect();
        let n = chans.len();
        self.api
            .batches
            .insert(id, Batch { chans: chans.clone(), results: (0..n).map(|_| None).collect(), missing: n });
        let data = bytes::Bytes::copy_from_slice(p.data.get().as_bytes());
        for ch in chans {
            self.publish(id, &ch, p.id.as_deref().map(Into::into), data.clone());
        }
    }

    /// A publish answer for HTTP connection `id`: taken (`None`) when it belongs to a batch of
    /// `id`, the last one answering the request; given back otherwise.
    pub(crate) fn batch_published(&mut self, id: ConnId, ch: &str, result: PublishResult) -> Option<PublishResult> {
        let Some(b) = self.api.batches.get_mut(&id) else { return Some(result) };
        let i = (0..b.chans.len()).find(|&i| &*b.chans[i] == ch && b.results[i].is_none())?;
        b.results[i] = Some(result);
        b.missing -= 1;
        if b.missing > 0 {
            return None;
        }
        let b = self.api.batches.remove(&id)?;
        let keep_alive = self.session(id).and_then(|s| s.awaiting())?;
        let results: Vec<Value> = b.chans.iter().zip(b.results).map(|(ch, r)| publish_row(ch, r)).collect();
        self.send(id, json_response(StatusCode::OK, &json!({ "results": results }), &[], keep_alive), keep_alive);
        self.serve_pending(id);
        None
    }

    /// One core's channels for the `GET /api/channels` of `id`.
    pub(crate) fn channel_rows(&mut self, id: ConnId, rows: Vec<(Arc<str>, u64)>, more: bool) {
        let Some(g) = self.gathering(id) else { return };
        if let Pending::Channels { rows: all, truncated, .. } = &mut g.pending {
            for (ch, n) in rows {
                *all.entry(ch).or_insert(0) += n;
            }
            *truncated |= more;
        }
        self.progress(id);
    }

    /// One core applied the node-wide action of `id`, affecting `affected` of its connections.
    pub(crate) fn control_done(&mut self, id: ConnId, affected: u64) {
        let Some(g) = self.gathering(id) else { return };
        if let Pending::Control { affected: sum, .. } = &mut g.pending {
            *sum += affected;
        }
        self.progress(id);
    }

    /// The broker told the other nodes about the action of `id` (how many), or could not.
    pub(crate) fn control_sent(&mut self, id: ConnId, result: Result<u64, Box<RequestError>>) {
        let Some(g) = self.gathering(id) else { return };
        if let Pending::Control { sent, .. } = &mut g.pending {
            *sent = Some(result);
        }
        self.progress(id);
    }

    fn gathering(&mut self, id: ConnId) -> Option<&mut Gathering> {
        self.api.gatherings.iter_mut().find(|g| g.conn == id)
    }

    /// Counts one answer for the gathering of `id`; the last one answers the request.
    fn progress(&mut self, id: ConnId) {
        let Some(i) = self.api.gatherings.iter().position(|g| g.conn == id) else { return };
        let g = &mut self.api.gatherings[i];
        g.missing -= 1;
        if g.missing > 0 {
            return;
        }
        let g = self.api.gatherings.swap_remove(i);
        let Some(keep_alive) = self.session(id).and_then(|s| s.awaiting()) else { return };
        let resp = match g.pending {
            Pending::Channels { rows, limit, truncated } => {
                let truncated = truncated || rows.len() > limit;
                let list: Vec<Value> =
                    rows.into_iter().take(limit).map(|(ch, n)| json!({"ch": &*ch, "subscribers": n})).collect();
                json_response(StatusCode::OK, &json!({"channels": list, "truncated": truncated}), &[], keep_alive)
            }
            Pending::Control { msg, affected, sent } => control_answer(&msg, affected, sent, keep_alive),
        };
        self.send(id, resp, keep_alive);
        self.serve_pending(id);
    }
}

/// One channel's row of a batch publish answer: `{"ch","seq"}`, or `{"ch","error","code"
/// [,"retry_after_ms"]}` (`unavailable`: not stored; `unknown_outcome`: perhaps stored,
/// retry with the same `id`; `limit`: `limits.max_channels`).
fn publish_row(ch: &str, r: Option<PublishResult>) -> Value {
    match r {
        Some(PublishResult::Stored { seq }) => json!({"ch": ch, "seq": seq}),
        Some(PublishResult::Refused(e)) => {
            let mut row = json!({"ch": ch, "error": e.reason, "code": e.code});
            if let (Some(ms), Some(m)) = (e.retry_after_ms, row.as_object_mut()) {
                m.insert("retry_after_ms".into(), ms.into());
            }
            row
        }
        None => json!({"ch": ch, "error": "no answer", "code": crate::protocol::codes::UNAVAILABLE}),
    }
}

/// The answer to a node-wide action: 200 `{WHAT: affected, "other_nodes": N, …}`, or 503
/// with what this node did when the other nodes could not be told.
fn control_answer(
    msg: &Control,
    affected: u64,
    sent: Option<Result<u64, Box<RequestError>>>,
    keep_alive: bool,
) -> Vec<u8> {
    let mut done = match msg {
        Control::Disconnect { .. } => json!({"closed": affected}),
        Control::Unsubscribe { .. } => json!({"unsubscribed": affected}),
        Control::Revoke { revocation } => json!({"closed": affected, "until_ms": revocation.until_ms()}),
    };
    match sent {
        Some(Ok(n)) => {
            if let Some(m) = done.as_object_mut() {
                m.insert("other_nodes".into(), n.into());
            }
            json_response(StatusCode::OK, &done, &[], keep_alive)
        }
        Some(Err(e)) => unavailable(&e, done, keep_alive),
        None => unavailable(&RequestError::unavailable("the broker did not answer", 1000), done, keep_alive),
    }
}
