//! Logs never carry client bytes raw (docs/security.md, "Logs"): a channel name, a close
//! reason, an `Origin` header value and a publish target holding a newline, a forged log line
//! and an ANSI colour sequence (`ESC [31m`, and the UTF-8 C1 `CSI`) reach the server's debug
//! log escaped (`\n`, `\x1b`, `\xc2\x9b`), and the log holds no raw control byte and no
//! forged line.

mod common;

use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

/// Text that would start a log line of its own if written raw.
const FORGED: &str = "2026-01-01T00:00:00.000000Z ERROR tether: forged";

/// Polls the server's log until it holds every one of `wanted`; panics after `limit`.
fn wait_for(srv: &Server, wanted: &[String], limit: Duration) -> Vec<u8> {
    eventually_sync(limit, "every wanted line in the log", || {
        let log = srv.log_bytes();
        let text = String::from_utf8_lossy(&log);
        let missing: Vec<&String> = wanted.iter().filter(|w| !text.contains(w.as_str())).collect();
        if missing.is_empty() {
            Ok(log)
        } else {
            Err(format!("missing {missing:?}\n{}", srv.log_tail(40)))
        }
    })
}

#[tokio::test]
async fn client_bytes_are_escaped_in_the_debug_log() {
    let config = "allowed_origins = [\"https://app.example\"]\n";
    let srv =
        Server::start_with_env(config, "127.0.0.1:0".parse().unwrap(), &["--cores", "1"], &[("TETHER_LOG", "debug")]);

    // An independent client (tokio-tungstenite): a channel name and a close reason.
    let mut ws = tung::connect(&srv.ws_url()).await;
    let channel = format!("evil\n{FORGED}\u{1b}[31m");
    let sub = serde_json::json!({"op": "sub", "ch": channel}).to_string();
    ws.send(Message::text(sub)).await.unwrap();
    let reply = loop {
        match tokio::time::timeout(STEP, ws.next()).await.expect("reply in time").expect("open").unwrap() {
            Message::Text(t) => break serde_json::from_str::<serde_json::Value>(&t).unwrap(),
            _ => continue,
        }
    };
    assert_eq!(reply["code"], "bad_channel", "{reply}");
    let reason = format!("bye\n{FORGED}\u{1b}[31mred\u{9b}0m");
    ws.send(Message::Close(Some(CloseFrame { code: CloseCode::Normal, reason: reason.into() }))).await.unwrap();
    // The server echoes the close; the stream then ends.
    while let Ok(Some(Ok(_))) = tokio::time::timeout(STEP, ws.next()).await {}

    // A raw client: an upgrade refused for its Origin (a header value with the C1 CSI).
    let mut raw = connect(srv.addr).await;
    let origin = "https://evil.example\u{9b}31m";
    let head = format!(
        "GET /ws HTTP/1.1\r\nHost: {}\r\nOrigin: {origin}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {SAMPLE_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n",
        srv.addr
    );
    raw.write_all(head.as_bytes()).await.unwrap();
    let (status, _, _) = read_head(&mut raw).await;
    assert_eq!(status, 403);

    // An HTTP publish whose channel decodes to a newline and an escape sequence.
    let (status, _, _) = http_request(srv.addr, "POST", "/publish/a%0Ab%1B%5B31m", &[], b"1").await;
    assert_eq!(status, 400);

    let log = wait_for(
        &srv,
        &[
            "code=\"bad_channel\"".to_owned(),
            format!("ch=\"evil\\n{FORGED}\\x1b[31m\""),
            format!("reason=\"bye\\n{FORGED}\\x1b[31mred\\xc2\\x9b0m\""),
            "origin=\"https://evil.example\\xc2\\x9b31m\"".to_owned(),
            "publish refused".to_owned(),
            "ch=\"a\\nb\\x1b[31m\"".to_owned(),
        ],
        STEP,
    );
    let raw_control = log.iter().position(|&b| (b < 0x20 && b != b'\n') || b == 0x7f);
    assert!(
        raw_control.is_none(),
        "raw control byte in the log at {raw_control:?}:\n{}",
        String::from_utf8_lossy(&log)
    );
    let text = String::from_utf8(log).expect("the log is UTF-8");
    assert!(!text.contains('\u{9b}'), "raw C1 CSI in the log:\n{text}");
    for line in text.lines() {
        assert!(!line.starts_with(FORGED) && !line.starts_with("red"), "forged log line: {line}");
        if line.contains("forged") {
            let ours = line.contains("request refused") || line.contains("peer sent a close frame");
            assert!(ours, "client text outside its field: {line}");
        }
    }
}
