//! End-to-end tests of the upgrade refusals and of the `tether sub` / `tether pub` tools
//! (one URL and a comma-separated list) against fake tether servers on 127.0.0.1:0.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;

use super::cli::{publish_once, publish_with, run_sub_until, run_sub_with};
use super::tests_e2e::{accept, bounded, close, drain, fast, listen, msg, next, recv, send, temp_dir};
use super::*;

/// Answers one HTTP request with `response` instead of upgrading.
async fn refuse_upgrade(l: &TcpListener, response: &str) {
    let (mut s, _) = l.accept().await.expect("accept");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk).await.expect("read");
        assert!(n > 0, "request ended early");
        buf.extend_from_slice(&chunk[..n]);
    }
    s.write_all(response.as_bytes()).await.expect("write");
}

#[tokio::test]
async fn upgrade_refusals_retry_on_503_and_stop_on_404() {
    bounded(async {
        let (l, url) = listen().await;
        let server = tokio::spawn(async move {
            let busy = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n";
            refuse_upgrade(&l, busy).await;
            refuse_upgrade(&l, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await;
        });
        let mut c = Client::connect(fast(&url)).expect("client");
        match next(&mut c).await {
            Event::Disconnected { code: None, retry_in, .. } => {
                assert!(retry_in >= Duration::from_secs(2), "Retry-After is the floor: {retry_in:?}");
            }
            other => panic!("{other:?}"),
        }
        let err = timeout(Duration::from_secs(5), c.next_event()).await.expect("in time");
        assert_eq!(err.expect_err("stopped"), ClientError::Handshake { status: 404, reason: "Not Found".into() });
        server.await.expect("server");
    })
    .await;
}

#[tokio::test]
async fn pub_command_retries_until_acked_with_a_stable_id() {
    bounded(async {
        let (l, url) = listen().await;
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            let first = recv(&mut ws).await;
            assert_eq!(first, json!({"op":"pub","ch":"c","id":"fixed-1","data":{"a":[1,2]}}));
            drop(ws);
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, first);
            send(&mut ws, r#"{"op":"ack","id":"fixed-1","ch":"c","seq":9}"#).await;
            drain(ws).await;
        });
        let args = PubArgs {
            url: url.clone(),
            channel: "c".into(),
            data: r#"{"a":[1,2]}"#.into(),
            id: Some("fixed-1".into()),
            token: None,
        };
        let data: Box<serde_json::value::RawValue> = serde_json::from_str(&args.data).expect("json");
        let ack = publish_with(fast(&url), &args, &data).await.expect("acked");
        assert_eq!(ack.raw, r#"{"op":"ack","id":"fixed-1","ch":"c","seq":9}"#);
        server.await.expect("server");
    })
    .await;
}

#[tokio::test]
async fn sub_command_appends_each_seq_exactly_once_across_a_cut() {
    bounded(async {
        let (l, url) = listen().await;
        let dir = temp_dir("append");
        let path = dir.join("out.jsonl");
        let mut existing = format!("{}\n{}\n", msg("c", 1), msg("c", 2));
        existing.push_str(r#"{"op":"msg","ch":"c","se"#); // torn by a SIGKILL
        std::fs::write(&path, existing).expect("write");

        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"c","from":2}));
            let sub = r#"{"op":"subscribed","ch":"c","seq":4,"epoch":"e","recovered":true}"#;
            send(&mut ws, sub).await;
            send(&mut ws, &msg("c", 3)).await;
            send(&mut ws, &msg("c", 4)).await;
            drop(ws); // cut

            let mut ws = accept(&l).await;
            let sub = recv(&mut ws).await;
            assert_eq!(sub["epoch"], "e");
            let from = sub["from"].as_u64().expect("from");
            assert!((2..=4).contains(&from), "resumes from a committed seq: {sub}");
            let sub = r#"{"op":"subscribed","ch":"c","seq":5,"epoch":"e","recovered":true}"#;
            send(&mut ws, sub).await;
            for seq in from + 1..=5 {
                send(&mut ws, &msg("c", seq)).await;
            }
            send(&mut ws, &msg("c", 5)).await; // duplicate
            close(ws, 1008, "done").await;
        });

        let args = SubArgs {
            url: url.clone(),
            channel: "c".into(),
            from: None,
            offset_file: None,
            append_to: Some(path.clone()),
            token: None,
            join_leave: false,
        };
        let end = run_sub_with(fast(&url), args, std::future::pending()).await;
        assert_eq!(end, Err(ClientError::Closed { code: 1008, reason: "done".into() }));
        let lines: Vec<String> = std::fs::read_to_string(&path).expect("read").lines().map(str::to_string).collect();
        let want: Vec<String> = (1..=5).map(|seq| msg("c", seq)).collect();
        assert_eq!(lines, want);
        server.await.expect("server");
        std::fs::remove_dir_all(dir).ok();
    })
    .await;
}

/// A `ws://` URL where nothing listens (connection refused).
async fn dead_url() -> String {
    let (l, url) = listen().await;
    drop(l);
    url
}

#[tokio::test]
async fn pub_command_moves_past_a_dead_url() {
    bounded(async {
        let dead = dead_url().await;
        let (l, live) = listen().await;
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"pub","ch":"c","id":"fixed-2","data":[1]}));
            send(&mut ws, r#"{"op":"ack","id":"fixed-2","ch":"c","seq":1}"#).await;
            drain(ws).await;
        });
        // The command's own configuration (default backoff): the second URL is tried promptly.
        let args = PubArgs {
            url: format!("{dead},{live}"),
            channel: "c".into(),
            data: "[1]".into(),
            id: Some("fixed-2".into()),
            token: None,
        };
        let started = std::time::Instant::now();
        let ack = publish_once(&args).await.expect("acked by the live URL");
        assert_eq!(ack.seq, 1);
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        server.await.expect("server");
    })
    .await;
}

#[tokio::test]
async fn sub_command_takes_a_url_list_and_resumes_on_the_next() {
    bounded(async {
        let (a, url_a) = listen().await;
        let (b, url_b) = listen().await;
        let dir = temp_dir("urls");
        let path = dir.join("out.jsonl");
        let node_a = tokio::spawn(async move {
            let mut ws = accept(&a).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"c"}));
            send(&mut ws, r#"{"op":"subscribed","ch":"c","seq":0,"epoch":"e"}"#).await;
            send(&mut ws, &msg("c", 1)).await;
            send(&mut ws, &msg("c", 2)).await;
            drop(ws); // node a dies
        });
        let node_b = tokio::spawn(async move {
            let mut ws = accept(&b).await;
            let sub = recv(&mut ws).await;
            assert_eq!(sub["epoch"], "e", "{sub}");
            let from = sub["from"].as_u64().expect("from");
            assert!(from <= 2, "resumes from a committed seq: {sub}");
            send(&mut ws, r#"{"op":"subscribed","ch":"c","seq":3,"epoch":"e","recovered":true}"#).await;
            for seq in from + 1..=3 {
                send(&mut ws, &msg("c", seq)).await;
            }
            close(ws, 1008, "done").await;
        });
        let args = SubArgs {
            url: format!("{url_a},{url_b}"),
            channel: "c".into(),
            from: None,
            offset_file: None,
            append_to: Some(path.clone()),
            token: None,
            join_leave: false,
        };
        let end = run_sub_until(args, std::future::pending()).await;
        assert_eq!(end, Err(ClientError::Closed { code: 1008, reason: "done".into() }));
        let lines: Vec<String> = std::fs::read_to_string(&path).expect("read").lines().map(str::to_string).collect();
        let want: Vec<String> = (1..=3).map(|seq| msg("c", seq)).collect();
        assert_eq!(lines, want);
        node_a.await.expect("node a");
        node_b.await.expect("node b");
        std::fs::remove_dir_all(dir).ok();
    })
    .await;
}

#[test]
fn stderr_lines_keep_the_protocol_key_order() {
    use super::cli::stderr_line;
    let reset = Event::Reset { ch: "news".into(), seq: 42, epoch: "e1".into(), reason: "epoch".into(), oldest: 1 };
    assert_eq!(
        stderr_line(&reset).unwrap(),
        r#"{"op":"reset","ch":"news","seq":42,"epoch":"e1","reason":"epoch","oldest":1}"#
    );
    let gone = Event::Disconnected {
        code: Some(1012),
        reason: "{\"reason\":\"restart\"}".into(),
        retry_in: Duration::from_millis(850),
    };
    assert_eq!(
        stderr_line(&gone).unwrap(),
        r#"{"event":"disconnected","code":1012,"reason":"{\"reason\":\"restart\"}","retry_in_ms":850}"#
    );
    let cut = Event::Disconnected { code: None, reason: "connection reset".into(), retry_in: Duration::from_millis(3) };
    assert_eq!(
        stderr_line(&cut).unwrap(),
        r#"{"event":"disconnected","code":null,"reason":"connection reset","retry_in_ms":3}"#
    );
    let refused = Event::Error { code: "bad_channel".into(), reason: "invalid channel".into(), id: None, ch: None };
    assert_eq!(
        stderr_line(&refused).unwrap(),
        r#"{"op":"error","code":"bad_channel","reason":"invalid channel","id":null,"ch":null}"#
    );
    let forbidden =
        Event::Error { code: "forbidden".into(), reason: "no".into(), id: None, ch: Some("admin.x".into()) };
    assert_eq!(
        stderr_line(&forbidden).unwrap(),
        r#"{"op":"error","code":"forbidden","reason":"no","id":null,"ch":"admin.x"}"#
    );
    let ended = Event::Unsubscribed { ch: "news".into() };
    assert_eq!(stderr_line(&ended).unwrap(), r#"{"op":"unsubscribed","ch":"news","reason":"server"}"#);
    let retrying = Event::Retrying {
        code: "unavailable".into(),
        reason: "redis down".into(),
        id: Some("p1".into()),
        ch: Some("news".into()),
        retry_in: Duration::from_millis(1000),
    };
    assert_eq!(
        stderr_line(&retrying).unwrap(),
        r#"{"event":"retrying","code":"unavailable","reason":"redis down","id":"p1","ch":"news","retry_in_ms":1000}"#
    );
    assert_eq!(
        stderr_line(&Event::Connected { url: "ws://a/ws".into() }).unwrap(),
        r#"{"event":"connected","url":"ws://a/ws"}"#
    );
}
