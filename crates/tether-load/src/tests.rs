//! Unit tests of the argument parsers, the report, the connection share arithmetic, the
//! payload shapes and the permessage-deflate inflater.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use super::args::Payload;
use super::args::{parse_duration, parse_sources, parse_ws_url};
use super::procs::aggregate;
use super::publish::{channel_index, data, stamp};
use super::report::{Latency, Report};
use super::wire::{accept_key, inflate_with, scan_str, scan_u64};
use super::{full_jitter, share};

#[test]
fn durations_take_units() {
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
    assert!(parse_duration("3 days").is_err());
    assert!(parse_duration("").is_err());
}

#[test]
fn sources_expand_ranges_and_lists() {
    let s = parse_sources("127.0.0.2-127.0.0.4,10.0.0.1").unwrap();
    assert_eq!(s.0.len(), 4);
    assert_eq!(s.pick(0), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
    assert_eq!(s.pick(3), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    assert_eq!(s.pick(4), s.pick(0));
    assert_eq!(parse_sources("127.0.0.2-127.0.0.254").unwrap().0.len(), 253);
    assert!(parse_sources("127.0.0.9-127.0.0.2").is_err());
    assert!(parse_sources("nope").is_err());
    assert!(parse_sources("").is_err());
}

#[test]
fn ws_urls_resolve() {
    let u = parse_ws_url("ws://127.0.0.1:9000/ws").unwrap();
    assert_eq!(u.addr.port(), 9000);
    assert_eq!(u.host, "127.0.0.1:9000");
    assert_eq!(u.path, "/ws");
    assert_eq!(parse_ws_url("ws://127.0.0.1").unwrap().addr.port(), 80);
    assert_eq!(parse_ws_url("ws://127.0.0.1:1").unwrap().path, "/");
    // A `?token=` (docs/security.md) is part of the request target every connection sends.
    assert_eq!(parse_ws_url("ws://127.0.0.1:1/ws?token=a.b.c").unwrap().path, "/ws?token=a.b.c");
    assert!(parse_ws_url("ftp://127.0.0.1/ws").is_err());
    let plain = parse_ws_url("http://127.0.0.1/ws").unwrap();
    assert_eq!((plain.addr.port(), plain.tls.is_none()), (80, true));
}

#[test]
fn accept_key_matches_rfc_6455_example() {
    // RFC 6455 §1.3.
    assert_eq!(accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

#[test]
fn scanners_read_the_wire_shapes() {
    let m = br#"{"op":"msg","ch":"load.fanout.ab.3","seq":42,"data":{"t":1700000000000000000,"k":7}}"#;
    assert_eq!(scan_str(m, "op"), Some(&b"msg"[..]));
    assert_eq!(scan_u64(m, "seq"), Some(42));
    assert_eq!(scan_u64(m, "t"), Some(1_700_000_000_000_000_000));
    assert_eq!(scan_u64(m, "k"), Some(7));
    assert_eq!(scan_str(m, "ch").and_then(channel_index), Some(3));
    assert_eq!(scan_u64(m, "missing"), None);
    assert_eq!(scan_u64(br#"{"t" : 5}"#, "t"), Some(5));
    assert_eq!(scan_u64(br#"{"t":"x"}"#, "t"), None);
    // A key inside a string value is not mistaken for the key.
    assert_eq!(scan_u64(br#"{"a":"t","t":9}"#, "t"), Some(9));
}

#[test]
fn stamps_have_the_requested_size() {
    for size in [64, 100, 1024] {
        let s = stamp(12, size);
        assert_eq!(s.len(), size, "{s}");
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["k"], 12);
        assert!(v["t"].as_u64().unwrap() > 0);
    }
    // Too small for padding: the bare stamp.
    assert!(serde_json::from_str::<serde_json::Value>(&stamp(1, 0)).is_ok());
}

#[test]
fn shares_cover_every_index_once() {
    let mut seen = vec![0; 101];
    for p in 0..3 {
        for t in 0..2 {
            for i in share(101, p, 3, t, 2) {
                seen[i] += 1;
            }
        }
    }
    assert!(seen.iter().all(|&n| n == 1));
}

#[test]
fn full_jitter_stays_under_the_ceiling() {
    let (base, cap) = (Duration::from_millis(500), Duration::from_secs(30));
    for attempt in 0..40 {
        let d = full_jitter(base, cap, attempt);
        assert!(d <= cap);
        assert!(d <= base * 2u32.saturating_pow(attempt.min(20)));
    }
}

#[test]
fn report_json_keeps_field_order() {
    let mut r = Report::new("idle");
    r.set("connections", 3).set("errors", 0).set("connections", 4);
    assert_eq!(r.to_json_line(), r#"{"scenario":"idle","connections":4,"errors":0}"#);
    assert!(r.to_table().contains("connections"));
}

#[test]
fn latency_quantiles_in_ms() {
    let mut l = Latency::new();
    for us in 1..=1000 {
        l.record_us(us);
    }
    assert!((l.quantile_ms(0.5) - 0.5).abs() < 0.01);
    assert!((l.max_ms() - 1.0).abs() < 0.01);
    assert_eq!(Latency::new().quantile_ms(0.99), 0.0);
}

#[test]
fn child_reports_aggregate() {
    let a = serde_json::json!({"scenario":"idle","connections":10,"errors":1,"connect_s":1.5,"procs":1,"error_kinds":{"refused":1}});
    let b =
        serde_json::json!({"scenario":"idle","connections":12,"errors":0,"connect_s":2.5,"procs":1,"error_kinds":{}});
    let r = aggregate("idle", &[a, b], &["connect_s"]);
    assert_eq!(r.get("connections"), Some(&serde_json::json!(22)));
    assert_eq!(r.get("errors"), Some(&serde_json::json!(1)));
    assert_eq!(r.get("connect_s"), Some(&serde_json::json!(2.5)));
    assert_eq!(r.get("error_kinds"), Some(&serde_json::json!({"refused":1})));
}

#[test]
fn broadcasts_time_stamped_msgs_per_seq_and_merge_exactly() {
    use super::broadcast::Broadcasts;
    let mut a = Broadcasts::default();
    a.record(br#"{"op":"msg","ch":"load.idle.0","seq":2,"data":{"t":1000000}}"#, 3_000_000);
    a.record(br#"{"op":"msg","ch":"load.idle.0","seq":2,"data":{"t":1000000}}"#, 5_000_000);
    // Unstamped messages and other ops are not timed.
    a.record(br#"{"op":"msg","ch":"load.idle.0","seq":1,"data":{"warmup":true}}"#, 5_000_000);
    a.record(br#"{"op":"subscribed","ch":"load.idle.0","seq":0,"epoch":"e"}"#, 5_000_000);
    let mut b = Broadcasts::default();
    b.record(br#"{"op":"msg","ch":"load.idle.0","seq":3,"data":{"t":1000000}}"#, 2_000_000);
    let mut report = Report::new("idle");
    b.fill(&mut report);
    let json: serde_json::Value = serde_json::from_str(&report.to_json_line()).unwrap();
    a.merge(&Broadcasts::from_report(&json).unwrap());
    assert_eq!(a.received(), 3);
    assert_eq!(a.0.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
    // 3 significant digits: within 0.1 %.
    assert!((a.0[&2].max_ms() - 4.0).abs() < 0.005, "{}", a.0[&2].max_ms());
    assert!((a.0[&3].max_ms() - 1.0).abs() < 0.002, "{}", a.0[&3].max_ms());
    let bad = serde_json::json!({"broadcast_hist": {"x": []}});
    let Err(e) = Broadcasts::from_report(&bad) else { panic!("a bad seq key was accepted") };
    assert!(e.contains("seq \"x\""), "{e}");
}

/// Raw DEFLATE of `bytes` ending in a sync flush, its `00 00 ff ff` tail removed (RFC 7692
/// §7.2.1), as a server sends a message.
fn deflated(bytes: &[u8]) -> Vec<u8> {
    let mut z = flate2::Compress::new(flate2::Compression::default(), false);
    let mut out = Vec::with_capacity(bytes.len() + 64);
    z.compress_vec(bytes, &mut out, flate2::FlushCompress::Sync).unwrap();
    assert_eq!(z.total_in() as usize, bytes.len(), "output buffer too small for the test input");
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

#[test]
fn payload_shapes_carry_the_stamp_and_are_json() {
    for (payload, size, range) in
        [(Payload::Book, 1024, 1000..1100), (Payload::Tick, 0, 100..140), (Payload::Pad, 300, 300..301)]
    {
        let d = data(payload, 7, size);
        let v: serde_json::Value = serde_json::from_str(&d).unwrap_or_else(|e| panic!("{payload:?}: {e}: {d}"));
        assert_eq!(v["k"], 7, "{d}");
        assert!(scan_u64(d.as_bytes(), "t").is_some_and(|t| t > 1_600_000_000_000_000_000), "{d}");
        assert!(range.contains(&d.len()), "{payload:?}: {} bytes", d.len());
    }
    // Every snapshot differs (a compressor gets no help from repeats across messages).
    assert_ne!(data(Payload::Book, 1, 1024)[30..], data(Payload::Book, 2, 1024)[30..]);
}

#[test]
fn inflater_restores_messages_and_stops_at_its_bound() {
    let book = data(Payload::Book, 3, 4096);
    for _ in 0..2 {
        // The per-thread inflater is reset between messages (no context takeover).
        let got = inflate_with(&deflated(book.as_bytes()), <[u8]>::to_vec).expect("inflates");
        assert_eq!(got, book.as_bytes());
    }
    assert_eq!(inflate_with(&deflated(b""), <[u8]>::len).expect("empty message"), 0);
    let bomb = deflated(&vec![0u8; (16 << 20) + 1]);
    assert!(bomb.len() < 64 << 10);
    assert!(inflate_with(&bomb, |_| ()).is_err(), "a message past 16 MiB is refused");
    assert!(inflate_with(&[0xff, 0xff, 0xff], |_| ()).is_err(), "not DEFLATE");
}

/// The SSE reader hands over every `data:` line once, whether a line comes whole, split over
/// several reads, or several to a read, and skips comments and other fields.
#[test]
fn sse_reader_joins_lines_split_across_reads() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = parse_ws_url(&format!("ws://{}/ws", listener.local_addr().expect("addr"))).expect("url");
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut head = vec![0u8; 1024];
            let _ = s.read(&mut head).await.expect("request");
            let body: &[&[u8]] = &[
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n: hi\n\nevent: msg\nid: a:1:1\ndata: {\"k\":1}\n\n",
                b"event: msg\nid: a:1:2\nda",
                b"ta: {\"k\":",
                b"2}\n\nevent: msg\ndata: {\"k\":3}\n\nevent: msg\ndata: {\"k\":4}\n",
                b"\n",
            ];
            for part in body {
                s.write_all(part).await.expect("write");
                s.flush().await.expect("flush");
                // Pauses make separate reads likely; the result must be the same either way.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let mut conn = super::sse::SseConn::connect(&url, None, "a", Duration::from_secs(5)).await.expect("connect");
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while got.len() < 4 {
            let step = tokio::time::timeout_at(deadline, conn.recv(|m| got.push(m.to_vec())));
            step.await.unwrap_or_else(|_| panic!("only {got:?} within 5 s")).expect("recv");
        }
        let want: Vec<Vec<u8>> = (1..=4).map(|k| format!("{{\"k\":{k}}}").into_bytes()).collect();
        assert_eq!(got, want);
        assert_eq!(conn.message_bytes, 4 * 7);
        server.await.expect("server");
    });
}
