//! Secrets stay out of logs and out of ambiguity (docs/security.md): URLs that reach a log
//! line or an error message lose their userinfo and query values; an upgrade carrying two
//! tokens is refused (400), not resolved first-wins; `iss` must be one string when
//! `jwt_issuer` is set; a repeated key in an admin JSON body is refused; feed ids that a
//! standard HTTP client cannot address again (dot-segments) are refused naming `id`.
//! Real server processes, real sockets; tokens minted with `tether::auth::mint` and, for the
//! malformed ones, `jsonwebtoken`.

mod common;

use std::time::Duration;

use common::auth::*;
use common::*;
use serde_json::{json, Value};

/// Waits (bounded) until the server's log contains `needle`.
fn wait_log(srv: &Server, needle: &str, limit: Duration) -> String {
    eventually_sync(limit, &format!("{needle:?} in the log"), || {
        let log = String::from_utf8_lossy(&srv.log_bytes()).into_owned();
        if log.contains(needle) {
            Ok(log)
        } else {
            Err(format!("log tail:\n{}", srv.log_tail(20)))
        }
    })
}

const SECRETS: [&str; 3] = ["pa55word", "T0KENVALUE", "hunter2pw"];

fn assert_no_secret(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} shows the secret {s}:\n{text}");
    }
}

#[tokio::test]
async fn feed_and_redis_urls_are_logged_without_their_secrets() {
    // A feed whose upstream refuses (port 1) and a Redis that is not there: each failed
    // connect is logged at warn, with the URL.
    let cfg = "cores = 1\n[broker]\nkind = \"redis\"\nurl = \"redis://:hunter2pw@127.0.0.1:1/0\"\n\
               request_timeout_ms = 300\n[feeds]\nstore = \"memory\"\n[[feeds.static]]\nid = \"leaky\"\n\
               url = \"ws://user:pa55word@127.0.0.1:1/x?token=T0KENVALUE&from=1\"\nchannel = \"c\"\n\
               seq_pointer = \"/seq\"\n";
    let srv = Server::start(cfg, &[]);
    let log = wait_log(&srv, "cannot connect upstream", STEP);
    assert!(log.contains("ws://…@127.0.0.1:1/x?token=…&from=…"), "the URL is still recognisable:\n{log}");
    let log = wait_log(&srv, "cannot connect to redis", STEP);
    assert!(log.contains("redis://…@127.0.0.1:1/0"), "{log}");
    assert_no_secret("the log", &log);
    let (status, _, body) = http_request(srv.addr, "GET", "/status.json", &[], b"").await;
    assert_eq!(status, 200);
    assert_no_secret("/status.json", &String::from_utf8_lossy(&body));
}

#[test]
fn config_errors_quote_urls_without_their_secrets() {
    for (toml, key) in [
        ("[broker]\nkind = \"redis\"\nurl = \"http://u:pa55word@cache/?token=T0KENVALUE\"\n", "broker.url"),
        ("[broker]\nkind = \"redis\"\ncluster = true\nurls = [\"redis://a:1\", \"unix://:hunter2pw@x\"]\n", "broker.urls[1]"),
        ("[[feeds.static]]\nid = \"a\"\nurl = \"http://u:pa55word@h/?k=T0KENVALUE\"\nchannel = \"c\"\nseq_pointer = \"/s\"\n", "url"),
    ] {
        let path = std::env::temp_dir().join(format!("tether-secret-cfg-{}.toml", std::process::id()));
        std::fs::write(&path, toml).unwrap();
        let out = run_tether(&["serve", "--config", path.to_str().unwrap()]);
        let _ = std::fs::remove_file(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{toml}");
        assert!(stderr.contains(key), "the error names {key}: {stderr}");
        assert_no_secret("the config error", &stderr);
    }
}

/// Sends an upgrade for `path` with `extra` header lines; returns the status and body.
async fn upgrade(addr: std::net::SocketAddr, path: &str, extra: &[(&str, &str)]) -> (u16, String) {
    let (status, _, body, _) = upgrade_keep(addr, path, extra).await;
    (status, body)
}

#[tokio::test]
async fn two_tokens_on_one_upgrade_are_refused() {
    let srv = Server::start(&hs256_config(1000), &["--cores", "1"]);
    let a = hs256(&claims("alice", now_s() + 600, &["*"], &[]));
    let b = hs256(&claims("mallory", now_s() + 600, &["*"], &[]));
    let bearer_a = format!("Bearer {a}");
    // One token, wherever it is, passes.
    assert_eq!(upgrade(srv.addr, &format!("/ws?token={a}"), &[]).await.0, 101);
    assert_eq!(upgrade(srv.addr, "/ws", &[("Authorization", &bearer_a)]).await.0, 101);
    assert_eq!(upgrade(srv.addr, "/ws?token=", &[("Authorization", &bearer_a)]).await.0, 101);
    for (path, bearer) in [
        (format!("/ws?token={a}&token={b}"), None),
        (format!("/ws?token={b}&token={a}"), None),
        (format!("/ws?token={a}&token={a}"), None),
        (format!("/ws?token={a}&x=1&tok%65n={b}"), None),
        (format!("/ws?token={a}&token"), None),
        (format!("/ws?token=&token={a}"), None),
        (format!("/ws?token={b}"), Some(bearer_a.as_str())),
        (format!("/ws?token={a}"), Some(bearer_a.as_str())),
    ] {
        let extra: Vec<(&str, &str)> = bearer.map(|b| ("Authorization", b)).into_iter().collect();
        let (status, body) = upgrade(srv.addr, &path, &extra).await;
        assert_eq!(status, 400, "{path} {bearer:?}: {body}");
        assert!(body.contains("more than one token"), "{body}");
    }
    assert_eq!(srv.gauge().await, 0.0, "only the accepted upgrades were connections, and they closed");
}

#[tokio::test]
async fn iss_must_be_one_string_when_an_issuer_is_set() {
    let cfg = format!("{}jwt_issuer = \"https://issuer.example\"\n", hs256_config(1000));
    let srv = Server::start(&cfg, &["--cores", "1"]);
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).unwrap();
    let sign = |iss: Option<Value>| {
        let mut c = json!({"sub": "u", "exp": now_s() + 600, "channels": {"sub": ["*"]}});
        if let Some(iss) = iss {
            c["iss"] = iss;
        }
        jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), &c, &key).unwrap()
    };
    let good = sign(Some(json!("https://issuer.example")));
    assert_eq!(upgrade(srv.addr, &format!("/ws?token={good}"), &[]).await.0, 101);
    for iss in [
        Some(json!(["https://issuer.example"])),
        Some(json!(["https://issuer.example", "https://evil.example"])),
        Some(json!(["https://evil.example", "https://issuer.example"])),
        Some(json!({"iss": "https://issuer.example"})),
        Some(json!(7)),
        Some(json!("https://evil.example")),
        None,
    ] {
        let (status, body) = upgrade(srv.addr, &format!("/ws?token={}", sign(iss.clone())), &[]).await;
        assert_eq!((status, body.contains("wrong issuer")), (401, true), "iss {iss:?}: {body}");
    }
}

#[tokio::test]
async fn admin_bodies_with_a_repeated_key_and_dot_segment_ids_are_refused() {
    let srv = Server::start("cores = 1\n[feeds]\nstore = \"memory\"\n", &[]);
    let put = |path: &'static str, body: String| async move {
        let (status, _, body) = http_request(srv.addr, "PUT", path, &[], body.as_bytes()).await;
        (status, serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null))
    };
    let ok = r#""url":"ws://127.0.0.1:1/a","channel":"c","seq_pointer":"/seq""#;
    for (body, field) in [
        (format!(r#"{{{ok},"url":"ws://127.0.0.1:1/b"}}"#), "url"),
        (format!(r#"{{"channel":"other",{ok}}}"#), "channel"),
        (format!(r#"{{{ok},"desired_state":"STOPPED","desired_state":"STARTED"}}"#), "desired_state"),
        (format!(r#"{{"id":"f","id":"f",{ok}}}"#), "id"),
    ] {
        let (status, v) = put("/feeds/f", body.clone()).await;
        assert_eq!((status, v["field"].as_str()), (400, Some(field)), "{body}: {v}");
    }
    let (status, _, _) = http_request(srv.addr, "GET", "/feeds/f", &[], b"").await;
    assert_eq!(status, 404, "nothing was stored");
    for path in ["/feeds/.", "/feeds/..", "/feeds/./stop", "/feeds/../start"] {
        let method = if path.ends_with("start") || path.ends_with("stop") { "POST" } else { "PUT" };
        let (status, _, body) = http_request(srv.addr, method, path, &[], format!("{{{ok}}}").as_bytes()).await;
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert_eq!((status, v["field"].as_str()), (400, Some("id")), "{method} {path}: {v}");
    }
    let (status, _, _) = http_request(srv.addr, "PUT", "/feeds/a..b", &[], format!("{{{ok}}}").as_bytes()).await;
    assert_eq!(status, 201, "dots inside an id are fine");

    for id in [".", ".."] {
        let toml = format!(
            "[[feeds.static]]\nid = \"{id}\"\nurl = \"ws://127.0.0.1:1/\"\nchannel = \"c\"\nseq_pointer = \"/s\"\n"
        );
        let path = std::env::temp_dir().join(format!("tether-dot-id-{}.toml", std::process::id()));
        std::fs::write(&path, toml).unwrap();
        let out = run_tether(&["serve", "--config", path.to_str().unwrap()]);
        let _ = std::fs::remove_file(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("id") && stderr.contains("dot-segment"), "{id}: {stderr}");
    }
}
