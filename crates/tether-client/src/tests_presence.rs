//! Presence through the client against fake tether servers on 127.0.0.1:0: answers matched to
//! requests per channel in order, pages followed, diffs and resets surfaced, and a
//! `join_leave` subscription made again after a cut with the client's own presence reset;
//! `tether sub --join-leave --append-to F` keeps F to messages.

use serde_json::json;
use tokio::sync::oneshot;

use super::tests_e2e::{accept, bounded, close, drain, fast, listen, msg, next_data, recv, send, temp_dir};
use super::*;

fn join_leave() -> SubscribeOptions {
    SubscribeOptions { join_leave: true, ..SubscribeOptions::default() }
}

#[tokio::test]
async fn answers_go_to_the_request_they_answer_in_order_per_channel() {
    bounded(async {
        let (l, url) = listen().await;
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"x","join_leave":true}));
            assert_eq!(recv(&mut ws).await, json!({"op":"presence","ch":"x"}));
            assert_eq!(recv(&mut ws).await, json!({"op":"presence_stats","ch":"y"}));
            assert_eq!(recv(&mut ws).await, json!({"op":"presence_stats","ch":"x"}));
            // Another channel's answer may come first; x's come in request order.
            send(&mut ws, r#"{"op":"presence_stats","ch":"y","clients":0,"users":0}"#).await;
            send(&mut ws, r#"{"op":"error","code":"forbidden","reason":"no","ch":"x"}"#).await;
            let page = r#"{"op":"presence","ch":"x","members":[{"client":"a","user":"u","info":{"k":1}}],"next":"c1"}"#;
            send(&mut ws, page).await;
            let limit = r#"{"op":"error","code":"limit","reason":"presence_rate","retry_after_ms":250,"ch":"x"}"#;
            send(&mut ws, limit).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"presence","ch":"x","cursor":"c1"}));
            send(&mut ws, r#"{"op":"presence","ch":"x","members":[{"client":"b"}]}"#).await;
            drain(ws).await;
        });
        let mut c = Client::connect(fast(&url)).expect("client");
        c.subscribe_with("x", join_leave()).expect("sub");
        let asker = c.publisher();
        let (members, stats_y, stats_x) = tokio::join!(
            async {
                tokio::task::yield_now().await;
                asker.presence("x").await
            },
            async {
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                asker.presence_stats("y").await
            },
            async {
                for _ in 0..6 {
                    tokio::task::yield_now().await;
                }
                asker.presence_stats("x").await
            },
        );
        let members = members.expect("members");
        assert_eq!(members.iter().map(|m| m.client.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(members[0].to_string(), r#"{"client":"a","user":"u","info":{"k":1}}"#);
        assert_eq!(stats_y.expect("stats"), PresenceStats { ch: "y".into(), clients: 0, users: 0 });
        assert_eq!(
            stats_x,
            Err(ClientError::Refused {
                code: "limit".into(),
                reason: "presence_rate".into(),
                retry_after: Some(std::time::Duration::from_millis(250)),
            })
        );
        match next_data(&mut c).await {
            Event::Error { code, ch, .. } => assert_eq!((code.as_str(), ch.as_deref()), ("forbidden", Some("x"))),
            other => panic!("the sub's refusal, got {other:?}"),
        }
        c.close().await;
        server.await.expect("server");
    })
    .await;
}

#[tokio::test]
async fn join_leave_is_made_again_after_a_cut_and_the_view_reset() {
    bounded(async {
        let (l, url) = listen().await;
        let (cut, when) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"room","join_leave":true}));
            send(&mut ws, r#"{"op":"subscribed","ch":"room","seq":0,"epoch":"e"}"#).await;
            send(&mut ws, r#"{"op":"presence_diff","ch":"room","joins":[{"client":"me"}],"leaves":[]}"#).await;
            send(&mut ws, r#"{"op":"presence_reset","ch":"room"}"#).await;
            // A query in flight when the connection is cut is asked again from its first page.
            assert_eq!(recv(&mut ws).await, json!({"op":"presence","ch":"room"}));
            send(&mut ws, r#"{"op":"presence","ch":"room","members":[{"client":"old"}],"next":"k"}"#).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"presence","ch":"room","cursor":"k"}));
            when.await.expect("cut");
            drop(ws);
            let mut ws = accept(&l).await;
            let resub = recv(&mut ws).await;
            assert_eq!(resub, json!({"op":"sub","ch":"room","from":0,"epoch":"e","join_leave":true}));
            assert_eq!(recv(&mut ws).await, json!({"op":"presence","ch":"room"}));
            send(&mut ws, r#"{"op":"subscribed","ch":"room","seq":0,"epoch":"e","recovered":true}"#).await;
            send(&mut ws, r#"{"op":"presence","ch":"room","members":[{"client":"new"}]}"#).await;
            send(&mut ws, r#"{"op":"presence_diff","ch":"room","joins":[{"client":"me2"}],"leaves":[]}"#).await;
            drain(ws).await;
        });
        let mut c = Client::connect(fast(&url)).expect("client");
        c.subscribe_with("room", join_leave()).expect("sub");
        assert!(matches!(next_data(&mut c).await, Event::Subscribed { .. }));
        match next_data(&mut c).await {
            Event::PresenceDiff { ch, joins, leaves, raw } => {
                assert_eq!((ch.as_str(), joins.len(), leaves.len()), ("room", 1, 0));
                assert_eq!(raw, r#"{"op":"presence_diff","ch":"room","joins":[{"client":"me"}],"leaves":[]}"#);
            }
            other => panic!("{other:?}"),
        }
        match next_data(&mut c).await {
            Event::PresenceReset { ch, reconnected } => assert_eq!((ch.as_str(), reconnected), ("room", false)),
            other => panic!("{other:?}"),
        }
        let asker = c.publisher();
        let query = tokio::spawn(async move { asker.presence("room").await });
        // The server cuts once the second page was asked for on the first connection.
        cut.send(()).expect("cut");
        let members = query.await.expect("task").expect("members");
        assert_eq!(members, vec![Member { client: "new".into(), user: None, info: None }]);
        assert!(matches!(next_data(&mut c).await, Event::Subscribed { recovered: Some(true), .. }));
        match next_data(&mut c).await {
            Event::PresenceReset { ch, reconnected } => assert_eq!((ch.as_str(), reconnected), ("room", true)),
            other => panic!("the client's reset after the resubscription, got {other:?}"),
        }
        assert!(matches!(next_data(&mut c).await, Event::PresenceDiff { .. }));
        c.close().await;
        server.await.expect("server");
    })
    .await;
}

#[tokio::test]
async fn sub_command_keeps_presence_lines_out_of_the_append_file() {
    bounded(async {
        let (l, url) = listen().await;
        let dir = temp_dir("join-leave-append");
        let path = dir.join("out.jsonl");
        let server = tokio::spawn(async move {
            let mut ws = accept(&l).await;
            assert_eq!(recv(&mut ws).await, json!({"op":"sub","ch":"room","join_leave":true}));
            send(&mut ws, r#"{"op":"subscribed","ch":"room","seq":0,"epoch":"e"}"#).await;
            send(&mut ws, r#"{"op":"presence_diff","ch":"room","joins":[{"client":"me"}],"leaves":[]}"#).await;
            send(&mut ws, &msg("room", 1)).await;
            send(&mut ws, r#"{"op":"presence_reset","ch":"room"}"#).await;
            send(&mut ws, &msg("room", 2)).await;
            close(ws, 1008, "done").await;
        });
        let args = SubArgs {
            url: url.clone(),
            channel: "room".into(),
            from: None,
            offset_file: None,
            append_to: Some(path.clone()),
            token: None,
            join_leave: true,
        };
        let end = super::cli::run_sub_with(fast(&url), args, std::future::pending()).await;
        assert_eq!(end, Err(ClientError::Closed { code: 1008, reason: "done".into() }));
        // The file holds the messages only (its last line is the resume point); the presence
        // lines went to stdout.
        let lines: Vec<String> = std::fs::read_to_string(&path).expect("read").lines().map(str::to_string).collect();
        assert_eq!(lines, [msg("room", 1), msg("room", 2)]);
        server.await.expect("server");
        std::fs::remove_dir_all(dir).ok();
    })
    .await;
}
