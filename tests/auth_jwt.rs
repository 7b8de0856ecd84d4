//! JWT connection auth (DESIGN §9, docs/security.md), on a real server over real sockets: the
//! upgrade needs a valid token (401 with a reason otherwise, counted as `unauthorized`), RS256 /
//! ES256 / EdDSA keys each accept their own tokens, channel rights answer `forbidden` while the
//! connection stays, `tether token` mints what the server accepts, and a bad key file refuses to
//! start.

mod common;

use base64::Engine as _;
use common::auth::*;
use common::tung::next_json;
use common::*;
use futures::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// Sends an upgrade for `path` with `extra` header lines; returns status, head and body.
async fn upgrade(addr: std::net::SocketAddr, path: &str, extra: &[(&str, &str)]) -> (u16, String, String) {
    let (status, head, body, _) = upgrade_keep(addr, path, extra).await;
    (status, head, body)
}

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

/// `token` with the first character of its signature changed.
fn flip_signature(token: &str) -> String {
    let i = token.rfind('.').expect("signature") + 1;
    let c = if token.as_bytes()[i] == b'A' { "B" } else { "A" };
    format!("{}{c}{}", &token[..i], &token[i + 1..])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_needs_a_valid_token() {
    let _serial = serial().await;
    // At debug, so the refusals are logged (without the token).
    let any = "127.0.0.1:0".parse().expect("address");
    let srv = Server::start_with_env(&pem_config("rs256.pub.pem"), any, &["--cores", "2"], &[("TETHER_LOG", "debug")]);
    let now = now_s();
    let good = pem_token("rs256.key.pem", &claims("alice", now + 60, &["news.*"], &[]));
    let payload = good.split('.').nth(1).expect("payload").to_string();
    let pem = std::fs::read(key("rs256.pub.pem")).expect("public key");
    // HS256 "signed" with the RS256 public key's PEM bytes as the HMAC secret.
    let confused = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims("alice", now + 60, &["news.*"], &[]),
        &jsonwebtoken::EncodingKey::from_secret(&pem).expect("key"),
    )
    .expect("sign");
    let refused = [
        ("no token", String::new(), "missing token"),
        ("bad signature", flip_signature(&good), "bad signature"),
        ("alg none", format!("{}.{payload}.", b64(&json!({"alg":"none","typ":"JWT"}))), "algorithm not accepted"),
        ("HS/RS confusion", confused, "algorithm not accepted"),
        ("expired", pem_token("rs256.key.pem", &claims("alice", now - 5, &[], &[])), "token expired"),
        (
            "not yet valid",
            pem_token("rs256.key.pem", &{
                let mut c = claims("alice", now + 60, &[], &[]);
                c.nbf = Some(now + 30);
                c
            }),
            "token not yet valid",
        ),
    ];
    for (what, token, reason) in &refused {
        let path = if token.is_empty() { "/ws".to_string() } else { format!("/ws?token={token}") };
        let (status, head, body) = upgrade(srv.addr, &path, &[]).await;
        assert_eq!((status, body.as_str()), (401, *reason), "{what}: {head}");
        let challenge = header(&head, "WWW-Authenticate").unwrap_or_else(|| panic!("{what}: no challenge in {head}"));
        assert!(challenge.starts_with("Bearer realm=\"tether\""), "{what}: {challenge}");
        assert_eq!(challenge.contains("invalid_token"), !token.is_empty(), "{what}: {challenge}");
    }
    assert_eq!(srv.metric("tether_handshake_failures_total", &["reason=\"unauthorized\""]).await, 6.0);
    assert_eq!(srv.gauge().await, 0.0, "no refused upgrade became a connection");
    let log = srv.log_tail(400);
    assert!(log.contains("unauthorized") && log.contains("bad signature"), "refusals are logged:\n{log}");
    assert!(!log.contains(&payload), "a token reached the log:\n{log}");

    // The good token, on the URL (tokio-tungstenite) and as Authorization: Bearer (raw).
    let (mut ws, resp) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(ws_url_with(srv.addr, &good)))
        .await
        .expect("connect in time")
        .expect("101 with a good token");
    assert_eq!(resp.status().as_u16(), 101);
    let bearer = format!("Bearer {good}");
    let (status, head, _, _open) = upgrade_keep(srv.addr, "/ws", &[("Authorization", &bearer)]).await;
    assert_eq!(status, 101, "{head}");
    srv.wait_gauge(2.0, STEP).await;
    ws.send(Message::text(r#"{"op":"sub","ch":"news.a"}"#)).await.expect("send");
    assert_eq!(next_json(&mut ws).await["op"], "subscribed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn es256_and_eddsa_keys_accept_their_tokens() {
    let _serial = serial().await;
    for (public, private) in [("es256.pub.pem", "es256.key.pem"), ("ed25519.pub.pem", "ed25519.key.pem")] {
        let srv = Server::start(&pem_config(public), &["--cores", "1"]);
        let token = pem_token(private, &claims("alice", now_s() + 60, &["news.*"], &[]));
        let (status, head, _) = upgrade(srv.addr, &format!("/ws?token={token}"), &[]).await;
        assert_eq!(status, 101, "{public}: {head}");
        // A token of the other family is refused by name.
        let other = pem_token("rs256.key.pem", &claims("alice", now_s() + 60, &[], &[]));
        let (status, _, body) = upgrade(srv.addr, &format!("/ws?token={other}"), &[]).await;
        assert_eq!((status, body.as_str()), (401, "algorithm not accepted"), "{public}");
    }
}

/// Runs the `tether` binary with `args`, bounded in time; returns (exit code, stdout, stderr).
fn tether(args: &[&str]) -> (i32, String, String) {
    let out = run_tether(args);
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_rights_refuse_with_forbidden_and_the_connection_stays() {
    let _serial = serial().await;
    let srv = Server::start(&hs256_config(30_000), &["--cores", "2"]);
    let (code, token, err) = tether(&[
        "token",
        "--secret",
        SECRET,
        "--sub",
        "alice",
        "--exp-in",
        "10m",
        "--sub-channel",
        "news.*",
        "--pub-channel",
        "chat.1",
    ]);
    assert_eq!(code, 0, "tether token: {err}");
    let mut ws = tung::connect(&ws_url_with(srv.addr, &token)).await;

    ws.send(Message::text(r#"{"op":"sub","ch":"news.a"}"#)).await.expect("send");
    let v = next_json(&mut ws).await;
    assert_eq!((v["op"].as_str(), v["ch"].as_str()), (Some("subscribed"), Some("news.a")), "{v}");

    ws.send(Message::text(r#"{"op":"sub","ch":"admin.x"}"#)).await.expect("send");
    let v = next_json(&mut ws).await;
    assert_eq!(
        (v["op"].as_str(), v["code"].as_str(), v["ch"].as_str()),
        (Some("error"), Some("forbidden"), Some("admin.x")),
        "{v}"
    );

    ws.send(Message::text(r#"{"op":"pub","ch":"chat.1","id":"p1","data":{"n":1}}"#)).await.expect("send");
    let v = next_json(&mut ws).await;
    assert_eq!((v["op"].as_str(), v["id"].as_str(), v["seq"].as_u64()), (Some("ack"), Some("p1"), Some(1)), "{v}");

    ws.send(Message::text(r#"{"op":"pub","ch":"chat.2","id":"p2","data":{"n":2}}"#)).await.expect("send");
    let v = next_json(&mut ws).await;
    assert_eq!(
        (v["op"].as_str(), v["code"].as_str(), v["id"].as_str(), v["ch"].as_str()),
        (Some("error"), Some("forbidden"), Some("p2"), Some("chat.2")),
        "{v}"
    );

    // Still open and still served: a publish to the allowed subscription arrives, and an
    // allowed publish is acked.
    assert_eq!(srv.publish("news.a", r#"{"hello":1}"#).await, 1);
    let v = next_json(&mut ws).await;
    assert_eq!((v["op"].as_str(), v["seq"].as_u64(), &v["data"]), (Some("msg"), Some(1), &json!({"hello":1})), "{v}");
    ws.send(Message::text(r#"{"op":"pub","ch":"chat.1","id":"p3","data":3}"#)).await.expect("send");
    assert_eq!(next_json(&mut ws).await["seq"], 2);
    assert_eq!(srv.gauge().await, 1.0);
    assert_eq!(
        srv.metric("tether_messages_published_total", &[]).await,
        3.0,
        "chat.1 twice, news.a once; chat.2 never"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_with_the_same_claims_share_one_grant_freed_with_the_last() {
    let _serial = serial().await;
    let srv = Server::start(&hs256_config(30_000), &["--cores", "2"]);
    let exp = now_s() + 600;
    let alice = hs256(&claims("alice", exp, &["news.*"], &["chat.1"]));
    let mut open = Vec::new();
    for _ in 0..40 {
        open.push(RawWs::connect(srv.addr, &format!("/ws?token={alice}")).await);
    }
    for user in ["bob", "carol", "dave"] {
        let t = hs256(&claims(user, exp, &["news.*"], &[]));
        open.push(RawWs::connect(srv.addr, &format!("/ws?token={t}")).await);
    }
    srv.wait_gauge(43.0, STEP).await;
    // Alice's 40 connections hold one entry per core they landed on; each other user one.
    let grants = srv.metric("tether_auth_grants", &[]).await;
    assert!((4.0..=5.0).contains(&grants), "{grants} grants for 4 distinct claim sets on 2 cores");
    drop(open);
    srv.wait_gauge(0.0, STEP).await;
    srv.wait_metric("tether_auth_grants", &[], STEP, |v| v == 0.0).await;
}

#[test]
fn tether_token_refuses_without_a_key_and_a_bad_key_file_refuses_to_start() {
    let (code, _, err) = tether(&["token", "--sub", "alice"]);
    assert_eq!(code, 2);
    assert!(err.contains("--secret, --config or --private-key-file"), "{err}");
    let (code, _, err) = tether(&["token", "--sub", "alice", "--private-key-file", "/nonexistent.pem"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent.pem"), "{err}");

    for (file, why) in [("p384.pub.pem", "not a usable ES256 public key"), ("missing.pem", "cannot read the key file")]
    {
        let config = std::env::temp_dir().join(format!("tether-badkey-{}-{file}.toml", std::process::id()));
        std::fs::write(&config, pem_config(file)).expect("config");
        let cfg = config.display().to_string();
        let (code, out, err) = tether(&["serve", "--listen", "127.0.0.1:0", "--config", &cfg]);
        let _ = std::fs::remove_file(&config);
        assert_eq!(code, 2, "{file}: stdout {out:?} stderr {err:?}");
        assert!(err.contains("auth.jwt_public_key_file") && err.contains(why), "{file}: {err}");
    }
}
