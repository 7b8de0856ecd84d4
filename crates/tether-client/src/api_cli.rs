//! `tether api`: the command line of the server API (docs/api.md). Each subcommand is one
//! HTTP/1.1 request to a node's `/api/` endpoints with the publish key (or, on a node without
//! publish keys, the admin token) as `Authorization: Bearer`, and prints the node's JSON
//! answer as one line. The node validates (a bad field is its 400, printed as is).
//!
//! Exit codes: 0 done; 1 the node refused (4xx/5xx) or could not be reached; 2 bad usage.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::node_http::{finish, read_token, Failure, Node};

/// `tether api`: batch publish, history, channels, presence, disconnect, unsubscribe and revoke
/// through a node's server API.
#[derive(clap::Args, Debug)]
pub struct ApiArgs {
    /// The node's HTTP base URL (the WebSocket port, plain HTTP).
    #[arg(long, env = "TETHER_API_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// A publish key (`auth.publish_keys`), or the admin token on a node without publish
    /// keys; without one only a loopback node with neither configured answers.
    #[arg(long, env = "TETHER_API_KEY", hide_env_values = true, conflicts_with = "token_file")]
    token: Option<String>,
    /// A file holding the key (surrounding whitespace ignored).
    #[arg(long)]
    token_file: Option<PathBuf>,
    #[command(subcommand)]
    cmd: ApiCmd,
}

/// One server API call.
#[derive(clap::Subcommand, Debug)]
enum ApiCmd {
    /// Publishes one JSON value to several channels (each gets its own seq); prints one row
    /// per channel.
    Publish {
        /// The JSON value to publish as `data`.
        data: String,
        /// A channel; repeat for several (at most 100).
        #[arg(long = "channel", short = 'c', required = true)]
        channels: Vec<String>,
        /// Dedup id, the Idempotency-Key of every channel (a retry with it is stored once).
        #[arg(long)]
        id: Option<String>,
    },
    /// A page of a channel's history: the messages after --from (the newest without it).
    History {
        /// Channel name.
        channel: String,
        /// Messages after this seq.
        #[arg(long)]
        from: Option<u64>,
        /// Most messages (1-1000, default 100).
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Channels with subscribers on this node, with their counts.
    Channels {
        /// Only names starting with it.
        #[arg(long)]
        prefix: Option<String>,
        /// Most channels (1-10000, default 1000).
        #[arg(long)]
        limit: Option<u64>,
    },
    /// A page of a presence channel's members, on every node (`next`, when printed, is the
    /// --cursor of the next page).
    Presence {
        /// Channel name.
        channel: String,
        /// The `next` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// How many connections and distinct users are in a presence channel, on every node.
    PresenceStats {
        /// Channel name.
        channel: String,
    },
    /// Closes every connection of a user (the JWT `sub`) on every node.
    Disconnect {
        /// The user.
        user: String,
        /// Close code: 4000-4999, or 1001, 1011, 1012, 1013 (default 4003).
        #[arg(long)]
        code: Option<u16>,
        /// Close reason, at most 123 bytes.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Ends a user's subscription to a channel on every node.
    Unsubscribe {
        /// The user.
        user: String,
        /// The channel.
        channel: String,
    },
    /// Revokes a token by its id, or a user's tokens issued until now; closes their
    /// connections (4003).
    Revoke {
        /// The token id (`jti`).
        #[arg(long, required_unless_present = "user", conflicts_with = "user")]
        jti: Option<String>,
        /// The user (`sub`).
        #[arg(long)]
        user: Option<String>,
        /// Until when, milliseconds since the Unix epoch (default: 24 h from now).
        #[arg(long)]
        until_ms: Option<u64>,
    },
}

/// What each subcommand sends: method, path (with query) and body.
fn request(cmd: ApiCmd) -> Result<(&'static str, String, Option<Value>), Failure> {
    let q = |pairs: &[(&str, Option<String>)]| {
        let set: Vec<String> = pairs
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", percent_encoding::utf8_percent_encode(v, QUERY))))
            .collect();
        if set.is_empty() {
            String::new()
        } else {
            format!("?{}", set.join("&"))
        }
    };
    Ok(match cmd {
        ApiCmd::Publish { data, channels, id } => {
            let data: Value =
                serde_json::from_str(&data).map_err(|e| Failure::usage(format!("DATA is not JSON: {e}")))?;
            let mut body = json!({"channels": channels, "data": data});
            if let Some(id) = id {
                body["id"] = id.into();
            }
            ("POST", "/api/publish".into(), Some(body))
        }
        ApiCmd::History { channel, from, limit } => {
            let ch = percent_encoding::utf8_percent_encode(&channel, QUERY);
            let query = q(&[("from", from.map(|f| f.to_string())), ("limit", limit.map(|l| l.to_string()))]);
            ("GET", format!("/api/history/{ch}{query}"), None)
        }
        ApiCmd::Channels { prefix, limit } => {
            ("GET", format!("/api/channels{}", q(&[("prefix", prefix), ("limit", limit.map(|l| l.to_string()))])), None)
        }
        ApiCmd::Presence { channel, cursor } => {
            let ch = percent_encoding::utf8_percent_encode(&channel, QUERY);
            ("GET", format!("/api/presence/{ch}{}", q(&[("cursor", cursor)])), None)
        }
        ApiCmd::PresenceStats { channel } => {
            let ch = percent_encoding::utf8_percent_encode(&channel, QUERY);
            ("GET", format!("/api/presence_stats/{ch}"), None)
        }
        ApiCmd::Disconnect { user, code, reason } => {
            let mut body = json!({ "user": user });
            if let Some(c) = code {
                body["code"] = c.into();
            }
            if let Some(r) = reason {
                body["reason"] = r.into();
            }
            ("POST", "/api/disconnect".into(), Some(body))
        }
        ApiCmd::Unsubscribe { user, channel } => {
            ("POST", "/api/unsubscribe".into(), Some(json!({"user": user, "ch": channel})))
        }
        ApiCmd::Revoke { jti, user, until_ms } => {
            let mut body = match (jti, user) {
                (Some(j), _) => json!({ "jti": j }),
                (None, Some(u)) => json!({ "user": u }),
                (None, None) => return Err(Failure::usage("give --jti or --user".into())),
            };
            if let Some(t) = until_ms {
                body["until_ms"] = t.into();
            }
            ("POST", "/api/revoke".into(), Some(body))
        }
    })
}

/// What a path segment or query value may hold unencoded: the channel alphabet.
const QUERY: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'.').remove(b'_').remove(b'-').remove(b':');

impl ApiArgs {
    /// Runs the subcommand: prints the node's JSON answer on stdout as one line, an error on
    /// stderr; returns the exit code (0 done, 1 refused or unreachable, 2 bad usage).
    pub fn run(self) -> i32 {
        finish("tether api", self.call())
    }

    fn call(self) -> Result<String, Failure> {
        let token = read_token(self.token.as_deref(), self.token_file.as_deref())?;
        let hint = " (give a publish key, or the admin token on a node without publish keys, with --token, \
                    --token-file or TETHER_API_KEY)";
        let node = Node::new(&self.url, "--url", token, hint)?;
        let (method, path, body) = request(self.cmd)?;
        let body = body.map(|b| serde_json::to_vec(&b).unwrap_or_default());
        node.request(method, &path, body).map(|v| v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        api: ApiArgs,
    }

    fn sent(args: &[&str]) -> (&'static str, String, Option<Value>) {
        let cli = Cli::try_parse_from(std::iter::once("api").chain(args.iter().copied())).expect("parses");
        request(cli.api.cmd).ok().expect("a request")
    }

    #[test]
    fn each_subcommand_is_one_request() {
        assert_eq!(
            sent(&["publish", "-c", "a", "-c", "b", r#"{"x":1}"#, "--id", "k"]),
            ("POST", "/api/publish".into(), Some(json!({"channels":["a","b"],"data":{"x":1},"id":"k"})))
        );
        assert_eq!(sent(&["history", "a:b", "--from", "3"]), ("GET", "/api/history/a:b?from=3".into(), None));
        assert_eq!(sent(&["channels"]), ("GET", "/api/channels".into(), None));
        assert_eq!(sent(&["presence", "room.1", "--cursor", "0-1-2"]).1, "/api/presence/room.1?cursor=0-1-2");
        assert_eq!(sent(&["presence-stats", "room.1"]), ("GET", "/api/presence_stats/room.1".into(), None));
        assert_eq!(sent(&["channels", "--prefix", "x y"]).1, "/api/channels?prefix=x%20y");
        assert_eq!(sent(&["disconnect", "alice", "--code", "4000"]).2, Some(json!({"user":"alice","code":4000})));
        assert_eq!(sent(&["unsubscribe", "alice", "news"]).2, Some(json!({"user":"alice","ch":"news"})));
        assert_eq!(sent(&["revoke", "--user", "bob"]).2, Some(json!({"user":"bob"})));
        assert!(Cli::try_parse_from(["api", "revoke"]).is_err(), "--jti or --user");
        assert!(Cli::try_parse_from(["api", "revoke", "--jti", "a", "--user", "b"]).is_err());
    }
}
