//! Fencing in the broker (docs/feeds.md "Fencing", issue 11 item 5): a feed's publish carries
//! its lease's fencing token, and a channel's home refuses one whose token is lower than the
//! highest it has seen for that feed, atomically with the publish. The same story runs against
//! the memory broker's channel store (`Homes`, as the memory broker calls it on the home core)
//! and against the Redis publish script (`PUBLISH_LUA`, with the arguments the Redis broker
//! builds) on a real `redis-server` started by the test:
//! - token 1 publishes; token 2 publishes; token 2 again publishes (equal is accepted);
//! - token 1 again is fenced out: no seq, nothing in history, no dedup record (its id is stored
//!   by the owner's next publish, as a new message), and the next accepted publish gets the
//!   next seq (no gap);
//! - another feed on the same channel is independent, and unfenced publishes are unaffected;
//! - on Redis: in a batch (one script call) a fenced-out publish between two accepted ones
//!   leaves their seqs consecutive; the fence hash `PREFIX{CH}:f` holds the highest token with
//!   the channel's TTL; after `SCRIPT FLUSH` (the script sent again with `EVAL`) the fence
//!   still holds.

mod common;

use std::sync::Arc;

use common::redis::RedisProc;
use redis::Value;
use tether::server::broker::cap::ChannelCap;
use tether::server::broker::epoch::{Numbering, TOMBSTONES_PER_CORE};
use tether::server::broker::home::{Dedup, FenceCheck, Homes};
use tether::server::broker::redis::keys::{Keys, PublishCall, PublishParams, PUBLISH_LUA};
use tether::server::broker::Fence;

const CH: &str = "feed.ticks";
const PREFIX: &str = "fence:";
const TTL_MS: u64 = 600_000;

/// What a publish came to: stored as a seq, a duplicate of a seq, or fenced out by a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Stored(u64),
    Duplicate(u64),
    Fenced { highest: u64 },
}
use Outcome::*;

/// One publish: channel, publish id, fence (feed id, token).
type Pub<'a> = (&'a str, Option<&'a str>, Option<(&'a str, u64)>);

// ---- memory ----

fn homes() -> Homes {
    let cap = Arc::new(ChannelCap::new(usize::MAX));
    Homes::new(1, Dedup::new(60_000, 1000), Numbering::new("e0".into(), TOMBSTONES_PER_CORE), cap)
}

/// A publish as the memory broker serves it on the channel's home core: the fence check,
/// then (accepted) the publish.
fn memory_publish(h: &mut Homes, (ch, id, fence): Pub) -> Outcome {
    if let Some((feed, token)) = fence {
        match h.fence(ch, &Fence { feed: feed.into(), token }, 100).expect("under max_channels") {
            FenceCheck::Accepted => {}
            FenceCheck::Fenced { highest } => return Fenced { highest },
            FenceCheck::TooManyFeeds => panic!("a channel of two feeds is full"),
        }
    }
    let (p, _) = h.publish(ch, id, b"{}", 100, 0).expect("under max_channels");
    if p.frame.is_some() {
        Stored(p.seq)
    } else {
        Duplicate(p.seq)
    }
}

// ---- redis ----

/// The Redis side: a connection and what the test checks with `redis-cli`.
struct RedisSide<'a> {
    redis: &'a RedisProc,
    con: redis::aio::MultiplexedConnection,
    keys: Keys,
    /// Script calls that found the script cache empty and sent its text (`EVAL`).
    reloads: usize,
}

impl RedisSide<'_> {
    /// One call of the publish script for `pubs`, as the Redis broker makes it (`EVALSHA`,
    /// then `EVAL` on `NOSCRIPT`); an outcome per publish.
    async fn call(&mut self, pubs: &[Pub<'_>]) -> Vec<Outcome> {
        let mut call = PublishCall::default();
        for (ch, id, fence) in pubs {
            call.push(ch, *id, b"{}", *fence, || 100);
        }
        // No deadline here (tests/redis_unknown_outcome.rs checks it).
        let params = PublishParams {
            ttl_ms: TTL_MS,
            dedup_window_ms: 60_000,
            epoch: "e0",
            command: "PUBLISH",
            deadline_ms: u64::MAX,
        };
        let sha = redis::Script::new(PUBLISH_LUA).get_hash().to_owned();
        let cmd = |name: &str, first: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(first);
            call.args(&self.keys, &params, |a| {
                cmd.arg(a);
            });
            cmd
        };
        let reply = match cmd("EVALSHA", &sha).query_async::<Value>(&mut self.con).await {
            Err(e) if e.code() == Some("NOSCRIPT") => {
                self.reloads += 1;
                cmd("EVAL", PUBLISH_LUA).query_async::<Value>(&mut self.con).await
            }
            r => r,
        };
        let Value::Array(a) = reply.expect("the publish script runs") else { panic!("not an array") };
        assert_eq!(a.len(), 3 * pubs.len(), "a triple per publish, no error: {a:?}");
        let int = |v: &Value| match v {
            Value::Int(i) => *i as u64,
            Value::BulkString(b) => std::str::from_utf8(b).unwrap().parse().unwrap(),
            v => panic!("not a number: {v:?}"),
        };
        a.chunks(3)
            .map(|t| match int(&t[2]) {
                0 => Stored(int(&t[0])),
                1 => Duplicate(int(&t[0])),
                2 => Fenced { highest: int(&t[0]) },
                k => panic!("kind {k}"),
            })
            .collect()
    }

    async fn publish(&mut self, p: Pub<'_>) -> Outcome {
        self.call(&[p]).await[0]
    }

    fn cli(&self, args: &[&str]) -> String {
        self.redis.cli(args).trim_end().to_owned()
    }
}

/// The behaviour both brokers share: each publish (one at a time) and what it must come to.
const STORY: &[(Pub<'static>, Outcome, &str)] = &[
    ((CH, Some("f:1"), Some(("f", 1))), Stored(1), "the first owner"),
    ((CH, Some("f:2"), Some(("f", 2))), Stored(2), "a takeover"),
    ((CH, Some("f:3"), Some(("f", 2))), Stored(3), "an equal token goes on"),
    ((CH, Some("f:4"), Some(("f", 1))), Fenced { highest: 2 }, "the paused ex-owner"),
    ((CH, Some("f:4"), Some(("f", 2))), Stored(4), "the refused id was not recorded; no gap"),
    ((CH, Some("f:4"), Some(("f", 2))), Duplicate(4), "dedup still works"),
    ((CH, None, Some(("g", 1))), Stored(5), "another feed has its own highest token"),
    ((CH, None, Some(("f", 1))), Fenced { highest: 2 }, "f did not move"),
    ((CH, None, None), Stored(6), "unfenced publishes are not affected"),
    ((CH, None, Some(("f", 3))), Stored(7), "a second takeover"),
    ((CH, None, Some(("f", 2))), Fenced { highest: 3 }, "fences the previous owner out"),
    ((CH, None, Some(("g", 1))), Stored(8), "g did not move"),
];

#[test]
fn memory_broker_refuses_stale_tokens() {
    let mut h = homes();
    for (i, (p, want, why)) in STORY.iter().enumerate() {
        assert_eq!(memory_publish(&mut h, *p), *want, "publish {}: {why}", i + 1);
    }
    let c = h.get(CH).expect("the channel");
    assert_eq!(c.head, 8, "fenced-out publishes took no seq");
    assert_eq!(c.batch(0, 8).len(), 8, "history holds exactly the 8 stored messages");
    assert_eq!(h.dedup.get(CH, "f:4", 0), Some(4));
}

#[tokio::test]
async fn redis_publish_script_refuses_stale_tokens() {
    let redis = RedisProc::start();
    let client = redis::Client::open(redis.url()).expect("redis url");
    let con = client.get_multiplexed_async_connection().await.expect("connect to redis");
    let mut r = RedisSide { redis: &redis, con, keys: Keys::new(PREFIX), reloads: 0 };

    // One publish per script call, like a feed publishing alone on its node.
    for (i, (p, want, why)) in STORY.iter().enumerate() {
        assert_eq!(r.publish(*p).await, *want, "publish {}: {why}", i + 1);
    }

    let fences = PREFIX.to_owned() + "{" + CH + "}:f";
    assert_eq!(r.cli(&["HGET", &fences, "f"]), "3");
    assert_eq!(r.cli(&["HGET", &fences, "g"]), "1");
    let ttl: u64 = r.cli(&["PTTL", &fences]).parse().expect("a ttl");
    assert!(ttl > 0 && ttl <= TTL_MS, "the fence hash has the channel's ttl: {ttl}");
    let meta = PREFIX.to_owned() + "{" + CH + "}:m";
    let stream = PREFIX.to_owned() + "{" + CH + "}:s";
    assert_eq!(r.cli(&["HGET", &meta, "seq"]), "8");
    assert_eq!(r.cli(&["XLEN", &stream]), "8", "fenced-out publishes are not in history");

    // A batch (one script call): a fenced-out publish between two accepted ones, with ids,
    // leaves no gap and no dedup key.
    let batch = r
        .call(&[
            (CH, Some("b:1"), Some(("f", 3))),
            (CH, Some("b:2"), Some(("f", 2))),
            (CH, Some("b:3"), Some(("f", 4))),
        ])
        .await;
    assert_eq!(batch, [Stored(9), Fenced { highest: 3 }, Stored(10)]);
    assert_eq!(r.cli(&["EXISTS", &(PREFIX.to_owned() + "{" + CH + "}:d:b:2")]), "0");
    assert_eq!(r.cli(&["HGET", &fences, "f"]), "4", "raised within the call");

    // The script cache emptied (as after a restart): the script is sent again, the fence holds.
    assert_eq!(r.reloads, 1, "only the first call loaded the script");
    assert_eq!(r.cli(&["SCRIPT", "FLUSH"]), "OK");
    assert_eq!(r.publish((CH, None, Some(("f", 3)))).await, Fenced { highest: 4 });
    assert_eq!(r.reloads, 2);
    assert_eq!(r.publish((CH, None, Some(("f", 4)))).await, Stored(11));
    assert_eq!(r.publish((CH, None, None)).await, Stored(12));

    // Tokens compare exactly over the whole u64 range (as decimal strings, not Lua numbers).
    assert_eq!(r.publish(("other", None, Some(("f", u64::MAX)))).await, Stored(1));
    assert_eq!(r.publish(("other", None, Some(("f", u64::MAX - 1)))).await, Fenced { highest: u64::MAX });
    assert_eq!(r.publish(("other", None, Some(("f", 9)))).await, Fenced { highest: u64::MAX });
}
