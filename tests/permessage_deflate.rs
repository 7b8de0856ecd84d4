//! permessage-deflate (RFC 7692, docs/protocol.md "Compression") against a live server: the
//! upgrade negotiates it (or declines it, never a 400); a subscriber that negotiated it and one
//! that did not (Python `websockets`, an independent implementation) both get every seq once
//! with byte-identical text after inflation, each message compressed once for the whole
//! process; large messages go out with RSV1, small ones plain; a client's compressed messages
//! are inflated, a deflate bomb closes 1009 without the server's memory growing, and RSV1
//! misuse closes 1002.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;

use common::*;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use serde_json::Value;
use tether::ws::codec::encode_client_frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CH: &str = "md.book";

/// A realistic order-book snapshot of about 1 KiB: 20 levels a side of price and size strings.
fn book(k: u64) -> String {
    let level = |i: u64, side: i64| {
        let px = 9_732_150 + side * (50 + i as i64 * 50 + ((k + i) % 7) as i64);
        format!(
            "[\"{}.{:02}\",\"{}.{:05}\"]",
            px / 100,
            px % 100,
            (k * 13 + i * 7) % 9,
            (k * 7919 + i * 104_729) % 100_000
        )
    };
    let bids: Vec<String> = (0..20).map(|i| level(i, -1)).collect();
    let asks: Vec<String> = (0..20).map(|i| level(i, 1)).collect();
    format!(
        "{{\"type\":\"snapshot\",\"symbol\":\"BTC-USD\",\"seq\":{k},\"ts\":{},\"bids\":[{}],\"asks\":[{}]}}",
        1_765_000_000_000u64 + k * 37,
        bids.join(","),
        asks.join(",")
    )
}

/// A trade tick of about 120 bytes.
fn tick(k: u64) -> String {
    format!("{{\"type\":\"trade\",\"symbol\":\"BTC-USD\",\"px\":\"97321.{:02}\",\"sz\":\"0.0{k:04}\",\"side\":\"buy\",\"ts\":{}}}", k % 100, 1_765_000_000_000u64 + k)
}

/// Upgrades a raw connection on `path` offering `offer` (if any); returns the stream, the
/// answer's `Sec-WebSocket-Extensions` (if any) and the bytes after the head.
async fn upgrade(addr: SocketAddr, path: &str, offer: Option<&str>) -> (TcpStream, Option<String>, Vec<u8>) {
    let mut s = connect(addr).await;
    let ext = offer.map(|o| format!("Sec-WebSocket-Extensions: {o}\r\n")).unwrap_or_default();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {SAMPLE_KEY}\r\nSec-WebSocket-Version: 13\r\n{ext}\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let (status, head, rest) = read_head(&mut s).await;
    assert_eq!(status, 101, "upgrade offering {offer:?}: {head}");
    (s, header(&head, "sec-websocket-extensions").map(str::to_owned), rest)
}

/// One server frame read raw: (first byte, payload).
async fn raw_frame(s: &mut TcpStream, buf: &mut Vec<u8>) -> (u8, Vec<u8>) {
    loop {
        if buf.len() >= 2 {
            let (hl, len) = match buf[1] & 0x7f {
                126 if buf.len() >= 4 => (4, u16::from_be_bytes([buf[2], buf[3]]) as usize),
                127 if buf.len() >= 10 => (10, u64::from_be_bytes(buf[2..10].try_into().unwrap()) as usize),
                126 | 127 => (usize::MAX, 0),
                n => (2, n as usize),
            };
            if hl != usize::MAX && buf.len() >= hl + len {
                let first = buf[0];
                let payload = buf[hl..hl + len].to_vec();
                buf.drain(..hl + len);
                return (first, payload);
            }
        }
        let mut chunk = [0u8; 16384];
        let n = tokio::time::timeout(STEP, s.read(&mut chunk)).await.expect("a frame in time").expect("read");
        assert!(n > 0, "EOF while waiting for a frame; have {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The next non-ping frame.
async fn data_frame(s: &mut TcpStream, buf: &mut Vec<u8>) -> (u8, Vec<u8>) {
    loop {
        let f = raw_frame(s, buf).await;
        if f.0 & 0x0f != OP_PING {
            return f;
        }
    }
}

/// The close code of the next close frame (skipping anything else).
async fn close_code(s: &mut TcpStream, buf: &mut Vec<u8>) -> u16 {
    loop {
        let (first, payload) = raw_frame(s, buf).await;
        if first & 0x0f == OP_CLOSE {
            return u16::from_be_bytes([payload[0], payload[1]]);
        }
    }
}

/// `data` compressed as one permessage-deflate message (RFC 7692 §7.2.1: sync flush, the
/// `00 00 ff ff` tail stripped), with this test's own DEFLATE.
fn compress(data: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::best(), false);
    let mut out = Vec::with_capacity(data.len() / 2 + 1024);
    while c.total_in() < data.len() as u64 || out.len() == out.capacity() {
        out.reserve(out.capacity().max(1024));
        c.compress_vec(&data[c.total_in() as usize..], &mut out, FlushCompress::Sync).unwrap();
    }
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

/// A compressed server payload inflated (RFC 7692 §7.2.2), with this test's own DEFLATE.
fn inflate(payload: &[u8]) -> Vec<u8> {
    let mut input = payload.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut d = Decompress::new(false);
    let mut out = Vec::with_capacity(64 << 10);
    d.decompress_vec(&input, &mut out, FlushDecompress::Sync).unwrap();
    assert_eq!(d.total_in(), input.len() as u64, "inflated in one go");
    out
}

/// A masked client text frame of `payload` compressed (RSV1 set).
fn compressed_client_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = encode_client_frame(OP_TEXT, true, &compress(payload), [0x11, 0x22, 0x33, 0x44]);
    out[0] |= 0x40;
    out
}

#[test]
fn the_offer_matrix_live() {
    let server = Server::start("", &[]);
    let off = Server::start("[compression]\nenabled = false\n", &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let answer = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";
        let rows: &[(Option<&str>, Option<&str>)] = &[
            (None, None),
            (Some("permessage-deflate"), Some(answer)),
            (Some("permessage-deflate; client_max_window_bits"), Some(answer)),
            (Some("permessage-deflate; client_no_context_takeover"), Some(answer)),
            (Some("permessage-deflate; server_max_window_bits=10"), None),
            (Some("permessage-deflate; server_max_window_bits=10, permessage-deflate"), Some(answer)),
            (Some("permessage-deflate; bogus"), None),
            (Some("permessage-deflate; client_no_context_takeover; client_no_context_takeover"), None),
            (Some("x-webkit-deflate-frame"), None),
        ];
        for (offer, want) in rows {
            let (_, got, _) = upgrade(server.addr, "/ws", *offer).await;
            assert_eq!(got.as_deref(), *want, "offer {offer:?}");
        }
        let (_, got, _) = upgrade(off.addr, "/ws", Some("permessage-deflate")).await;
        assert_eq!(got, None, "compression.enabled = false declines every offer");
    });
}

#[test]
fn compressed_and_plain_subscribers_get_the_same_messages() {
    const N: u64 = 40;
    let server = Server::start("", &[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common/deflate_subscribers.py");
    let url = format!("ws://{}/ws", server.addr);
    let mut child = Command::new("python3")
        .args([script, &url, CH, &N.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn python3 (pip install websockets: scripts/setup)");
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = rx.recv_timeout(STEP).expect("the Python subscribers subscribed in time");
    assert_eq!(first, "ready", "Python subscribers: {first}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    // A raw subscriber with deflate too, to see the RSV1 bit on the wire.
    let (mut raw, ext, mut buf) = rt.block_on(upgrade(server.addr, "/ws", Some("permessage-deflate")));
    assert!(ext.is_some());
    let mut sent = Vec::new();
    rt.block_on(async {
        raw.write_all(&encode_client_frame(OP_TEXT, true, br#"{"op":"sub","ch":"md.book"}"#, [1, 2, 3, 4]))
            .await
            .unwrap();
        let (_, sub) = data_frame(&mut raw, &mut buf).await;
        assert!(String::from_utf8_lossy(&sub).contains("subscribed"), "{}", String::from_utf8_lossy(&sub));
        let mut publisher = HttpConn::new(server.addr).await;
        for k in 1..=N {
            let body = if k % 2 == 1 { book(k) } else { tick(k) };
            assert_eq!(publisher.publish(CH, body.as_bytes()).await, k);
            sent.push(body);
        }
        for k in 1..=N {
            let (first, payload) = data_frame(&mut raw, &mut buf).await;
            let big = k % 2 == 1;
            assert_eq!(first, if big { 0xC1 } else { 0x81 }, "seq {k}: RSV1 set on the snapshot, clear on the tick");
            let text = if big { inflate(&payload) } else { payload.clone() };
            assert_eq!(msg_seq(&text), k);
            if big {
                let plain_len = text.len();
                assert!(payload.len() * 2 <= plain_len, "seq {k}: {} of {plain_len} bytes", payload.len());
            }
        }
    });
    let line = rx.recv_timeout(STEP).expect("the Python subscribers got every message in time");
    let status = wait_child(child, STEP, "python subscribers").status;
    assert!(status.success(), "python: {line}");
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(v["extensions"]["deflate"], serde_json::json!(["permessage-deflate"]), "{}", v["extensions"]);
    assert_eq!(v["extensions"]["plain"], serde_json::json!([]));
    let (z, p) = (v["got"]["deflate"].as_array().unwrap(), v["got"]["plain"].as_array().unwrap());
    for (i, (z, p)) in z.iter().zip(p).enumerate() {
        let k = i as u64 + 1;
        assert_eq!((z[0].as_u64(), p[0].as_u64()), (Some(k), Some(k)), "every seq once, in order");
        assert_eq!(z[1], p[1], "seq {k}: the same text after inflation");
        let m: Value = serde_json::from_str(z[1].as_str().unwrap()).unwrap();
        let data: Value = serde_json::from_str(&sent[i]).unwrap();
        assert_eq!(m["data"], data, "seq {k}: the published data");
    }
    assert_eq!((z.len(), p.len()), (N as usize, N as usize));
    // Compressed once per message for the whole process, whatever the cores of the subscribers.
    let m = server.scrape().expect("/metrics");
    assert_eq!(m.sum("tether_deflate_messages_total", &["result=\"compressed\""]), (N / 2) as f64);
    assert_eq!(m.sum("tether_deflate_messages_total", &["result=\"plain\""]), (N / 2) as f64);
    assert_eq!(m.sum("tether_deflate_connections", &[]), 1.0, "the raw subscriber (Python's closed)");
    let (plain, deflated) = (
        m.sum("tether_deflate_bytes_total", &["form=\"plain\""]),
        m.sum("tether_deflate_bytes_total", &["form=\"deflated\""]),
    );
    assert!(deflated > 0.0 && deflated * 2.0 <= plain, "deflated {deflated} of {plain} bytes");
}

#[test]
fn client_messages_inflate_and_misuse_closes() {
    let server = Server::start("", &["--echo"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // A compressed request is inflated and served.
        let (mut s, ext, mut buf) = upgrade(server.addr, "/ws", Some("permessage-deflate")).await;
        assert!(ext.is_some());
        s.write_all(&compressed_client_frame(br#"{"op":"sub","ch":"md.in"}"#)).await.unwrap();
        let (_, answer) = data_frame(&mut s, &mut buf).await;
        assert!(String::from_utf8_lossy(&answer).contains("\"subscribed\""), "{}", String::from_utf8_lossy(&answer));

        // /echo echoes a large message compressed, a small one plain.
        let (mut e, _, mut ebuf) = upgrade(server.addr, "/echo", Some("permessage-deflate")).await;
        let big = book(7);
        e.write_all(&compressed_client_frame(big.as_bytes())).await.unwrap();
        let (first, payload) = data_frame(&mut e, &mut ebuf).await;
        assert_eq!(first, 0xC1);
        assert_eq!(inflate(&payload), big.as_bytes());
        e.write_all(&encode_client_frame(OP_TEXT, true, b"hi", [1, 2, 3, 4])).await.unwrap();
        assert_eq!(data_frame(&mut e, &mut ebuf).await, (0x81, b"hi".to_vec()));

        // A bomb: 64 MiB of zeros in ~64 KiB compressed, against max_message_bytes 65536.
        let rss_before = server.rss_kib();
        let (mut b, _, mut bbuf) = upgrade(server.addr, "/ws", Some("permessage-deflate")).await;
        let bomb = compressed_client_frame(&vec![b' '; 64 << 20]);
        assert!(bomb.len() <= 65536, "the bomb itself fits the limit: {}", bomb.len());
        b.write_all(&bomb).await.unwrap();
        assert_eq!(close_code(&mut b, &mut bbuf).await, 1009);
        let rss_after = server.rss_kib();
        assert!(rss_after < rss_before + 8 * 1024, "RSS {rss_before} KiB → {rss_after} KiB after the bomb");

        // RSV1 without the extension; on a control frame; on a continuation frame.
        let (mut p, ext, mut pbuf) = upgrade(server.addr, "/ws", None).await;
        assert_eq!(ext, None);
        p.write_all(&compressed_client_frame(b"{\"op\":\"sub\",\"ch\":\"x\"}")).await.unwrap();
        assert_eq!(close_code(&mut p, &mut pbuf).await, 1002);
        let (mut c, _, mut cbuf) = upgrade(server.addr, "/ws", Some("permessage-deflate")).await;
        let mut ping = encode_client_frame(OP_PING, true, b"x", [1, 2, 3, 4]);
        ping[0] |= 0x40;
        c.write_all(&ping).await.unwrap();
        assert_eq!(close_code(&mut c, &mut cbuf).await, 1002);
        let (mut f, _, mut fbuf) = upgrade(server.addr, "/ws", Some("permessage-deflate")).await;
        f.write_all(&encode_client_frame(OP_TEXT, false, b"{\"op\":", [1, 2, 3, 4])).await.unwrap();
        let mut cont = encode_client_frame(OP_CONT, true, b"1}", [1, 2, 3, 4]);
        cont[0] |= 0x40;
        f.write_all(&cont).await.unwrap();
        assert_eq!(close_code(&mut f, &mut fbuf).await, 1002);
    });
}
