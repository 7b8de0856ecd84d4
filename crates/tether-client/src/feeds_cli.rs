//! `tether feeds`: the command line of the feeds admin API (docs/feeds.md, "Admin API").
//! Each subcommand is one HTTP/1.1 request to a node's `/feeds` endpoints, with the admin
//! token as `Authorization: Bearer`; the node validates (a bad field is its 400, printed as
//! is), so the CLI and the API can never disagree on what a feed may be.
//!
//! It lives with the other client tools, not in the server: a blocking HTTP client (ureq,
//! `node_http`) that only talks to a node, so the server library does not carry ureq
//! (tests/layers.rs).
//!
//! Exit codes: 0 done; 1 the node refused (4xx/5xx, its error printed) or could not be
//! reached; 2 bad usage or an unreadable token or body file.

use std::io::Read;
use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::node_http::{finish, read_token, Failure, Node};

/// `tether feeds`: list, show, create or replace, start, stop and delete upstream feeds
/// through a node's admin API.
#[derive(clap::Args, Debug)]
pub struct FeedsArgs {
    /// The node's HTTP base URL (the WebSocket port, plain HTTP).
    #[arg(long, env = "TETHER_ADMIN_URL", default_value = "http://127.0.0.1:8080")]
    admin: String,
    /// The admin token (`[admin] token`); without one only a loopback node answers, and only
    /// when it has no token configured.
    #[arg(long, env = "TETHER_ADMIN_TOKEN", hide_env_values = true, conflicts_with = "token_file")]
    token: Option<String>,
    /// A file holding the admin token (surrounding whitespace ignored).
    #[arg(long)]
    token_file: Option<PathBuf>,
    #[command(subcommand)]
    cmd: FeedsCmd,
}

/// One admin API call.
#[derive(clap::Subcommand, Debug)]
enum FeedsCmd {
    /// Every feed as a table (id, desired state, owner, fencing token, last seq), or the raw
    /// JSON array with --json.
    List {
        /// Print the API's JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// One feed's record with the owner's live fields (`connected`, `lag_ms`, `reconnects`;
    /// null when asked of a node that does not own it), as JSON.
    Get {
        /// Feed id.
        id: String,
    },
    /// Creates or replaces a feed (the whole definition: a field not given takes its
    /// default; the lease is kept). The fields come from the flags, or from --json / --file.
    Put(PutArgs),
    /// Sets the feed's desired state to STARTED: a node acquires it and connects upstream,
    /// resuming from its last_seq.
    Start {
        /// Feed id.
        id: String,
    },
    /// Sets the feed's desired state to STOPPED: its owner closes the upstream (within one
    /// renew interval), stores last_seq and releases the lease.
    Stop {
        /// Feed id.
        id: String,
    },
    /// Deletes the feed and its lease; its owner closes the upstream.
    Delete {
        /// Feed id.
        id: String,
    },
}

/// `tether feeds put`: the definition fields of docs/feeds.md, "The feed record".
#[derive(clap::Args, Debug)]
struct PutArgs {
    /// Feed id: 1–64 bytes of [A-Za-z0-9._-].
    id: String,
    /// The whole definition as a JSON object (the API's PUT body).
    #[arg(long, conflicts_with_all = ["file", "url", "channel", "seq_pointer", "subscribe", "resume_query", "stopped"])]
    json: Option<String>,
    /// A file holding the definition as a JSON object; `-` reads standard input.
    #[arg(long, conflicts_with_all = ["url", "channel", "seq_pointer", "subscribe", "resume_query", "stopped"])]
    file: Option<PathBuf>,
    /// Upstream URL, ws:// or wss://.
    #[arg(long)]
    url: Option<String>,
    /// The channel its messages are published into.
    #[arg(long)]
    channel: Option<String>,
    /// JSON pointer to the upstream message's own seq or id, e.g. /seq.
    #[arg(long)]
    seq_pointer: Option<String>,
    /// Text sent after connecting, with {last_seq} substituted.
    #[arg(long)]
    subscribe: Option<String>,
    /// Query parameter set to last_seq on reconnect, e.g. from.
    #[arg(long)]
    resume_query: Option<String>,
    /// Create it STOPPED (default STARTED).
    #[arg(long)]
    stopped: bool,
}

impl FeedsArgs {
    /// Runs the subcommand: prints the answer on stdout, an error on stderr; returns the exit
    /// code (0 done, 1 refused or unreachable, 2 bad usage).
    pub fn run(self) -> i32 {
        finish("tether feeds", self.call())
    }

    fn call(self) -> Result<String, Failure> {
        let token = read_token(self.token.as_deref(), self.token_file.as_deref())?;
        let hint = " (give the node's [admin] token with --token, --token-file or TETHER_ADMIN_TOKEN)";
        let api = Node::new(&self.admin, "--admin", token, hint)?;
        match self.cmd {
            FeedsCmd::List { json } => {
                let v = api.request("GET", "/feeds", None)?;
                Ok(if json { pretty(&v) } else { table(&v) })
            }
            FeedsCmd::Get { id } => api.request("GET", &feed_path(&id, ""), None).map(|v| pretty(&v)),
            FeedsCmd::Put(args) => {
                let body = args.body()?;
                api.request("PUT", &feed_path(&args.id, ""), Some(body)).map(|v| pretty(&v))
            }
            FeedsCmd::Start { id } => api.request("POST", &feed_path(&id, "/start"), None).map(|v| pretty(&v)),
            FeedsCmd::Stop { id } => api.request("POST", &feed_path(&id, "/stop"), None).map(|v| pretty(&v)),
            FeedsCmd::Delete { id } => {
                api.request("DELETE", &feed_path(&id, ""), None)?;
                Ok(format!("deleted {id}"))
            }
        }
    }
}

impl PutArgs {
    /// The PUT body: --json, --file, or an object built from the flags (only those given;
    /// the node fills the defaults and names a missing required field).
    fn body(&self) -> Result<Vec<u8>, Failure> {
        if let Some(json) = &self.json {
            return Ok(json.clone().into_bytes());
        }
        if let Some(path) = &self.file {
            let mut body = Vec::new();
            let read = if path.as_os_str() == "-" {
                std::io::stdin().read_to_end(&mut body)
            } else {
                std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut body))
            };
            read.map_err(|e| Failure::usage(format!("cannot read --file {}: {e}", path.display())))?;
            return Ok(body);
        }
        let mut obj = Map::new();
        let fields = [
            ("url", &self.url),
            ("channel", &self.channel),
            ("seq_pointer", &self.seq_pointer),
            ("subscribe", &self.subscribe),
            ("resume_query", &self.resume_query),
        ];
        for (name, value) in fields {
            if let Some(v) = value {
                obj.insert(name.into(), Value::String(v.clone()));
            }
        }
        if self.stopped {
            obj.insert("desired_state".into(), Value::String("STOPPED".into()));
        }
        Ok(serde_json::to_vec(&Value::Object(obj)).unwrap_or_default())
    }
}

/// What an id may hold unencoded: the id alphabet `[A-Za-z0-9._-]`.
const ID_SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'.').remove(b'_').remove(b'-');

/// `/feeds/<id><suffix>`, any byte outside the id alphabet percent-encoded so that any input
/// stays one path segment (the node then refuses such an id with 400 naming `id`).
fn feed_path(id: &str, suffix: &str) -> String {
    let id = percent_encoding::utf8_percent_encode(id, ID_SEGMENT);
    format!("/feeds/{id}{suffix}")
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// `GET /feeds` as an aligned table: ID, STATE, OWNER, TOKEN, LAST_SEQ, EXPIRES_AT_MS.
fn table(v: &Value) -> String {
    let cell = |f: &Value, k: &str| match f.get(k) {
        None | Some(Value::Null) => "-".to_owned(),
        Some(Value::String(s)) if s.is_empty() => "-".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let keys = ["id", "desired_state", "lease_owner", "fencing_token", "last_seq", "lease_expires_at_ms"];
    let mut rows = vec![["ID", "STATE", "OWNER", "TOKEN", "LAST_SEQ", "EXPIRES_AT_MS"].map(str::to_owned).to_vec()];
    for f in v.as_array().into_iter().flatten() {
        rows.push(keys.iter().map(|k| cell(f, k)).collect());
    }
    let widths: Vec<usize> =
        (0..keys.len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let lines: Vec<String> = rows
        .iter()
        .map(|r| {
            let cells: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_one_path_segment() {
        assert_eq!(feed_path("btc.usd_1-x", "/stop"), "/feeds/btc.usd_1-x/stop");
        assert_eq!(feed_path("a/b?c", ""), "/feeds/a%2Fb%3Fc");
    }

    #[test]
    fn the_table_aligns_and_marks_absent_fields() {
        let v = serde_json::json!([
            {"id": "a", "desired_state": "STARTED", "lease_owner": "host-1", "fencing_token": 3, "last_seq": "17", "lease_expires_at_ms": 5},
            {"id": "bbbb", "desired_state": "STOPPED", "lease_owner": null, "fencing_token": 0, "last_seq": null, "lease_expires_at_ms": 0},
        ]);
        let t = table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("ID    STATE"), "{t}");
        assert!(lines[2].starts_with("bbbb  STOPPED  -"), "{t}");
    }
}
