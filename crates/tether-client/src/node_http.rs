//! One node's HTTP API as the command-line tools call it (`tether feeds`, `tether api`):
//! blocking HTTP/1.1 through ureq, a bearer credential, the JSON answer on 2xx and the node's
//! own error otherwise. The node validates every input (its 400 names the field and is
//! printed as is), so a tool and the API never disagree on what is valid.
//!
//! Exit codes of the tools: 0 done; 1 the node refused (4xx/5xx) or could not be reached;
//! 2 bad usage, or an unreadable token or body file.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// How long one request may take, connect included. A node answers once its store (lease
/// store, Redis) has, and one that cannot answer says so (503) well before this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a call failed: the message printed and the exit code.
pub(crate) struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    /// Bad usage (exit 2).
    pub fn usage(message: String) -> Failure {
        Failure { code: 2, message }
    }

    /// Refused or unreachable (exit 1).
    pub fn remote(message: String) -> Failure {
        Failure { code: 1, message }
    }
}

/// The credential: `token` as given, or the content of `token_file` (surrounding whitespace
/// ignored), or none.
pub(crate) fn read_token(token: Option<&str>, token_file: Option<&Path>) -> Result<Option<String>, Failure> {
    match (token, token_file) {
        (Some(t), _) => Ok(Some(t.trim().to_owned())),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map(|t| Some(t.trim().to_owned()))
            .map_err(|e| Failure::usage(format!("cannot read --token-file {}: {e}", path.display()))),
        (None, None) => Ok(None),
    }
}

/// One node's HTTP API.
pub(crate) struct Node {
    base: String,
    token: Option<String>,
    /// Added to a 401's message: how to give the credential this API wants.
    hint_401: &'static str,
}

impl Node {
    /// The node at `base` (an `http://` URL; the API is plain HTTP on the WebSocket port).
    pub fn new(base: &str, flag: &str, token: Option<String>, hint_401: &'static str) -> Result<Node, Failure> {
        let base = base.trim_end_matches('/');
        if !base.starts_with("http://") {
            return Err(Failure::usage(format!(
                "{flag} {base}: must be an http:// URL of the node (the API is plain HTTP on the WebSocket port)"
            )));
        }
        Ok(Node { base: base.to_owned(), token, hint_401 })
    }

    /// Sends one request (a body is sent as JSON); the JSON answer on 2xx, else a failure
    /// carrying the node's error.
    pub fn request(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Value, Failure> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build()
            .into();
        let url = format!("{}{path}", self.base);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let json = "application/json";
        let sent = match (method, body) {
            ("PUT", Some(b)) => with_auth(agent.put(&url), &auth).header("Content-Type", json).send(&b[..]),
            ("POST", Some(b)) => with_auth(agent.post(&url), &auth).header("Content-Type", json).send(&b[..]),
            ("POST", None) => with_auth(agent.post(&url), &auth).send_empty(),
            ("DELETE", _) => with_auth(agent.delete(&url), &auth).call(),
            _ => with_auth(agent.get(&url), &auth).call(),
        };
        let mut resp = sent.map_err(|e| Failure::remote(format!("{method} {url}: {e}")))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| Failure::remote(format!("{method} {url}: reading the answer: {e}")))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if (200..300).contains(&status) {
            return Ok(v);
        }
        let why = v.get("error").and_then(Value::as_str).map_or_else(|| v.to_string(), str::to_owned);
        let hint = if status == 401 { self.hint_401 } else { "" };
        Err(Failure::remote(format!("{method} {path}: HTTP {status}: {why}{hint}")))
    }
}

fn with_auth<B>(req: ureq::RequestBuilder<B>, auth: &Option<String>) -> ureq::RequestBuilder<B> {
    match auth {
        Some(a) => req.header("Authorization", a),
        None => req,
    }
}

/// Prints the outcome of a tool's call: the answer on stdout (exit 0), or `tool: message`
/// on stderr with the failure's exit code.
pub(crate) fn finish(tool: &str, outcome: Result<String, Failure>) -> i32 {
    match outcome {
        Ok(out) => {
            println!("{out}");
            0
        }
        Err(f) => {
            eprintln!("{tool}: {}", f.message);
            f.code
        }
    }
}
