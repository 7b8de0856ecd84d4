//! RFC 6455 framing over raw sockets: each violation closes only its own connection, with the
//! right close code (§7.4.1), and the close handshake completes (§5.5.1, §7.1).

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::io::AsyncWriteExt;

// close_timeout_ms short: after an unparseable frame the server cannot find our close reply
// in the stream and waits out the close-handshake deadline.
const CONFIG: &str = "[limits]\nmax_message_bytes = 4096\nclose_timeout_ms = 1000\n";

fn start() -> Server {
    Server::start(CONFIG, &["--cores", "2", "--echo"])
}

/// Reads to the close frame, answers it and checks the server then ends TCP.
async fn close_code_then_end(ws: &mut RawWs) -> u16 {
    let code = ws.expect_close(STEP).await;
    ws.send(OP_CLOSE, true, &code.to_be_bytes()).await;
    let (_ended, frames) = ws.until_end(STEP).await;
    assert!(frames.is_empty(), "frames after the close frame: {frames:?}");
    code
}

#[tokio::test]
async fn unmasked_frame_gets_1002() {
    let srv = start();
    let mut ws = RawWs::connect(srv.addr, "/echo").await;
    // FIN + text, MASK bit clear (§5.1: the server must fail the connection).
    ws.s.write_all(&[0x81, 0x05, b'h', b'e', b'l', b'l', b'o']).await.unwrap();
    assert_eq!(close_code_then_end(&mut ws).await, 1002);
    srv.wait_gauge(0.0, STEP).await;
}

#[tokio::test]
async fn oversize_message_gets_1009() {
    let srv = start();
    let mut bystander = RawWs::connect(srv.addr, "/echo").await;

    let mut ws = RawWs::connect(srv.addr, "/echo").await;
    ws.send(OP_BINARY, true, &vec![7u8; 5000]).await;
    assert_eq!(close_code_then_end(&mut ws).await, 1009, "one 5000-byte frame over a 4096 limit");

    // The same limit across fragments: 200 fragments of 64 bytes (12800 bytes in all).
    let mut ws = RawWs::connect(srv.addr, "/echo").await;
    let mut all = Vec::new();
    all.extend(tether::ws::codec::encode_client_frame(OP_BINARY, false, &[1u8; 64], [1, 2, 3, 4]));
    for _ in 0..198 {
        all.extend(tether::ws::codec::encode_client_frame(OP_CONT, false, &[1u8; 64], [1, 2, 3, 4]));
    }
    all.extend(tether::ws::codec::encode_client_frame(OP_CONT, true, &[1u8; 64], [1, 2, 3, 4]));
    // The server may close before taking all of it; a write error then is expected.
    let _ = ws.s.write_all(&all).await;
    let code = ws.expect_close(STEP).await;
    assert_eq!(code, 1009, "fragmented message over the limit");

    // A violation fails only its own connection.
    bystander.send(OP_TEXT, true, b"still here").await;
    let f = bystander.frame(STEP).await;
    assert_eq!((f.opcode, f.text()), (OP_TEXT, "still here"));
}

#[tokio::test]
async fn invalid_utf8_gets_1007() {
    let srv = start();
    let mut ws = RawWs::connect(srv.addr, "/echo").await;
    ws.send(OP_TEXT, true, &[b'o', b'k', 0xff, 0xfe]).await;
    assert_eq!(close_code_then_end(&mut ws).await, 1007);

    // Also on the pub/sub endpoint, where text frames carry JSON.
    let mut ws = RawWs::connect(srv.addr, "/ws").await;
    ws.send(OP_TEXT, true, &[b'{', 0xc3, 0x28, b'}']).await;
    assert_eq!(close_code_then_end(&mut ws).await, 1007);
}

#[tokio::test]
async fn ping_between_fragments_gets_its_pong() {
    let srv = start();
    // /echo: the fragmented message comes back whole after the pong.
    let mut ws = RawWs::connect(srv.addr, "/echo").await;
    ws.send(OP_TEXT, false, b"hello, ").await;
    ws.send(OP_PING, true, b"p1").await;
    ws.send(OP_CONT, false, b"frag").await;
    ws.send(OP_PING, true, b"p2").await;
    ws.send(OP_CONT, true, b"mented world").await;
    let f = ws.frame(STEP).await;
    assert_eq!((f.opcode, &f.payload[..]), (OP_PONG, &b"p1"[..]), "first pong");
    let f = ws.frame(STEP).await;
    assert_eq!((f.opcode, &f.payload[..]), (OP_PONG, &b"p2"[..]), "second pong");
    let f = ws.frame(STEP).await;
    assert_eq!((f.opcode, f.text()), (OP_TEXT, "hello, fragmented world"));

    // /ws: a fragmented `sub` is processed after the pong.
    let mut ws = RawWs::connect(srv.addr, "/ws").await;
    let req = json!({"op": "sub", "ch": "frag.test"}).to_string();
    let (a, b) = req.as_bytes().split_at(7);
    ws.send(OP_TEXT, false, a).await;
    ws.send(OP_PING, true, b"mid").await;
    ws.send(OP_CONT, true, b).await;
    let f = ws.frame(STEP).await;
    assert_eq!((f.opcode, &f.payload[..]), (OP_PONG, &b"mid"[..]));
    let v = ws.frame(STEP).await.json();
    assert_eq!(v["op"], "subscribed", "{v}");
    assert_eq!(v["ch"], "frag.test", "{v}");
}

#[tokio::test]
async fn bad_close_code_gets_1002() {
    let srv = start();
    for bad in [1005u16, 999, 1006, 5000] {
        let mut ws = RawWs::connect(srv.addr, "/echo").await;
        ws.send(OP_CLOSE, true, &bad.to_be_bytes()).await;
        let code = ws.expect_close(STEP).await;
        assert_eq!(code, 1002, "client close code {bad}");
        let (_ended, frames) = ws.until_end(STEP).await;
        assert!(frames.is_empty(), "frames after close: {frames:?}");
    }
    srv.wait_gauge(0.0, STEP).await;
}

#[tokio::test]
async fn close_handshake_completes() {
    let srv = start();
    for path in ["/echo", "/ws"] {
        let mut ws = RawWs::connect(srv.addr, path).await;
        let mut payload = 1000u16.to_be_bytes().to_vec();
        payload.extend_from_slice(b"bye");
        ws.send(OP_CLOSE, true, &payload).await;
        let f = ws.frame(STEP).await;
        assert_eq!(f.opcode, OP_CLOSE, "{path}: expected the close echo, got {f:?}");
        assert_eq!(f.close_code(), 1000, "{path}");
        // The server closes TCP after the close handshake (§7.1.1): an EOF, no more frames.
        let (ended, frames) = ws.until_end(Duration::from_secs(5)).await;
        assert!(frames.is_empty(), "{path}: frames after close: {frames:?}");
        assert!(matches!(ended, Ended::Eof), "{path}: TCP ended with {ended:?}");
    }
    srv.wait_gauge(0.0, STEP).await;
    let m = srv.metrics().await;
    assert!(m.sum("tether_closes_total", &["code=\"1000\""]) >= 2.0, "closes by code 1000 counted");
}
