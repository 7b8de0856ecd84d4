//! The lease store contract (docs/feeds.md, "The lease rules"): behaviour bodies that every
//! `LeaseStore` backend must pass, and [`lease_contract_tests!`], which runs each of them as one
//! `#[tokio::test]` against a backend. Included with `mod lease_contract;` by
//! `tests/feed_leases.rs` (memory, Redis) and `tests/feed_leases_dynamodb.rs` (DynamoDB on
//! moto). Times are a simulated clock passed into every call.
//! - concurrent acquirers of one feed (one store handle each: separate connections where the
//!   backend has them): exactly one wins, with fencing token 1, and every other is told who
//!   holds it; over several takeovers, each round has one winner and the token grows by one;
//! - after expiry another node acquires with token + 1, and the old owner's renew and release
//!   are refused and change nothing;
//! - a release frees the lease at once (acquirable long before the old expiry), keeps
//!   `last_seq`, and notifies `released()` subscribers; a refused release notifies nobody;
//! - `put` replacing a definition keeps the lease fields;
//! - `renew_many` of 600 leases (across the Redis and DynamoDB request chunks) follows
//!   `renew`'s rules for each: in one batch, ours are renewed with their `last_seq`, one taken
//!   over and one expired answer `Lost` with what the store holds, one deleted `NotFound`, and
//!   the refused ones change nothing; it takes far fewer requests than leases; duplicate ids
//!   and malformed arguments refuse the whole call before anything is written;
//! - 1,000 feeds: `get_many` returns them in order with `None` for a missing id, `list` and
//!   `delete` agree;
//! - malformed arguments are refused naming the field, before the store is asked.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use tether::feeds::metrics::StoreOp;
use tether::feeds::{DesiredState, FeedDef, LeaseError, LeaseStore, LeaseTerm, Renewal};

/// The simulated clock's start, Unix epoch ms.
pub const T0: u64 = 1_700_000_000_000;
/// Bound on every wait for a notification.
pub const WAIT: Duration = Duration::from_secs(5);
/// Acquirers racing for one feed: the length of the `nodes` vector the racing bodies take.
pub const RACERS: usize = 32;
/// Takeover rounds of [`racing_takeovers_increase_tokens`].
const ROUNDS: u64 = 5;

/// A valid definition of feed `id`, channel `feed.ID`.
pub fn def(id: &str) -> FeedDef {
    FeedDef {
        id: id.into(),
        url: format!("wss://upstream.example/{id}"),
        channel: format!("feed.{id}"),
        desired_state: DesiredState::Started,
        subscribe: r#"{"op":"sub","from":{last_seq}}"#.into(),
        resume_query: "from".into(),
        seq_pointer: "/seq".into(),
    }
}

/// Every node in `nodes` tries to acquire `id` at `now_ms` for `lease_ms` at the same moment
/// (a barrier); returns the winner's index and token, and the `Held` answers of the others.
async fn race<S: LeaseStore + 'static>(
    nodes: &[Arc<S>],
    id: &'static str,
    now_ms: u64,
    lease_ms: u64,
) -> (Vec<(usize, u64)>, Vec<(String, u64)>) {
    let start = Arc::new(tokio::sync::Barrier::new(nodes.len()));
    let mut tasks = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let (s, start) = (node.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            (i, s.acquire(id, LeaseTerm { owner: &format!("node-{i}"), now_ms, lease_ms }).await)
        }));
    }
    let (mut winners, mut held_by) = (Vec::new(), Vec::new());
    for t in tasks {
        match t.await.expect("an acquirer task") {
            (i, Ok(token)) => winners.push((i, token)),
            (_, Err(LeaseError::Held { owner, expires_at_ms })) => held_by.push((owner, expires_at_ms)),
            (i, Err(e)) => panic!("acquirer {i}: {e}"),
        }
    }
    (winners, held_by)
}

pub async fn one_of_many_concurrent_acquirers_wins<S: LeaseStore + 'static>(nodes: Vec<Arc<S>>) {
    assert_eq!(nodes.len(), RACERS);
    let s = nodes[0].clone();
    assert!(s.put(&def("race")).await.unwrap());
    let (winners, held_by) = race(&nodes, "race", T0, 20_000).await;
    assert_eq!(winners.len(), 1, "exactly one acquirer wins: {winners:?}");
    let (w, token) = winners[0];
    assert_eq!(token, 1, "the first acquire gets fencing token 1");
    let owner = format!("node-{w}");
    assert_eq!(held_by.len(), RACERS - 1);
    assert!(held_by.iter().all(|(o, e)| *o == owner && *e == T0 + 20_000), "losers see the winner: {held_by:?}");
    let f = s.get("race").await.unwrap().expect("the feed exists");
    assert_eq!(f.lease.lease_owner.as_deref(), Some(owner.as_str()));
    assert_eq!((f.lease.fencing_token, f.lease.lease_expires_at_ms), (1, T0 + 20_000));
}

/// Round k: every node races for the lease the round before left to expire; exactly one wins,
/// with token k (one more than the last holder's), and the last holder is fenced out.
pub async fn racing_takeovers_increase_tokens<S: LeaseStore + 'static>(nodes: Vec<Arc<S>>) {
    const LEASE: u64 = 1_000;
    let s = nodes[0].clone();
    s.put(&def("takeovers")).await.unwrap();
    let mut last: Option<(usize, u64)> = None;
    for round in 1..=ROUNDS {
        let now = T0 + round * LEASE; // the previous round's lease ends exactly now: free
        let (winners, held_by) = race(&nodes, "takeovers", now, LEASE).await;
        assert_eq!(winners.len(), 1, "round {round}: exactly one acquirer wins: {winners:?}");
        let (w, token) = winners[0];
        assert_eq!(token, round, "round {round}: the token grows by one per takeover");
        assert!(held_by.iter().all(|(o, e)| *o == format!("node-{w}") && *e == now + LEASE), "{held_by:?}");
        if let Some((prev, prev_token)) = last {
            let r = nodes[prev]
                .renew(
                    LeaseTerm { owner: &format!("node-{prev}"), now_ms: now, lease_ms: LEASE },
                    Renewal { id: "takeovers", token: prev_token, last_seq: None },
                )
                .await;
            assert!(matches!(r, Err(LeaseError::Lost { fencing_token, .. }) if fencing_token == token), "{r:?}");
        }
        last = Some((w, token));
    }
    assert_eq!(s.get("takeovers").await.unwrap().unwrap().lease.fencing_token, ROUNDS);
}

pub async fn takeover_after_expiry_fences_the_old_owner<S: LeaseStore>(s: Arc<S>) {
    s.put(&def("tk")).await.unwrap();
    let t1 = s.acquire("tk", LeaseTerm { owner: "n1", now_ms: T0, lease_ms: 1_000 }).await.unwrap();
    s.renew(
        LeaseTerm { owner: "n1", now_ms: T0 + 500, lease_ms: 1_000 },
        Renewal { id: "tk", token: t1, last_seq: Some("41") },
    )
    .await
    .unwrap();
    // Renewed to T0 + 1,500: still held 1 ms before, free at it.
    assert!(matches!(
        s.acquire("tk", LeaseTerm { owner: "n2", now_ms: T0 + 1_499, lease_ms: 1_000 }).await,
        Err(LeaseError::Held { .. })
    ));
    let t2 = s.acquire("tk", LeaseTerm { owner: "n2", now_ms: T0 + 1_500, lease_ms: 1_000 }).await.unwrap();
    assert_eq!(t2, t1 + 1, "every acquire increments the fencing token by one");

    let lost = |r: Result<(), LeaseError>| match r {
        Err(LeaseError::Lost { owner, fencing_token, expires_at_ms }) => (owner, fencing_token, expires_at_ms),
        other => panic!("the old owner must be refused, got {other:?}"),
    };
    let now = (Some("n2".to_owned()), t2, T0 + 2_500);
    assert_eq!(
        lost(
            s.renew(
                LeaseTerm { owner: "n1", now_ms: T0 + 1_600, lease_ms: 1_000 },
                Renewal { id: "tk", token: t1, last_seq: Some("50") }
            )
            .await
        ),
        now
    );
    assert_eq!(lost(s.release("tk", "n1", t1, Some("50")).await), now);
    // The right owner with a stale token is refused too.
    assert_eq!(
        lost(
            s.renew(
                LeaseTerm { owner: "n2", now_ms: T0 + 1_600, lease_ms: 1_000 },
                Renewal { id: "tk", token: t1, last_seq: None }
            )
            .await
        ),
        now
    );
    assert!(matches!(
        s.acquire("tk", LeaseTerm { owner: "n1", now_ms: T0 + 1_600, lease_ms: 1_000 }).await,
        Err(LeaseError::Held { .. })
    ));

    let f = s.get("tk").await.unwrap().unwrap();
    assert_eq!(f.lease.last_seq.as_deref(), Some("41"), "refused calls wrote nothing");
    assert_eq!((f.lease.fencing_token, f.lease.lease_expires_at_ms), (t2, T0 + 2_500));
    s.renew(
        LeaseTerm { owner: "n2", now_ms: T0 + 2_000, lease_ms: 1_000 },
        Renewal { id: "tk", token: t2, last_seq: Some("60") },
    )
    .await
    .unwrap();
    // A holder whose lease ran out cannot renew, even with nobody else in.
    assert_eq!(
        lost(
            s.renew(
                LeaseTerm { owner: "n2", now_ms: T0 + 3_000, lease_ms: 1_000 },
                Renewal { id: "tk", token: t2, last_seq: None }
            )
            .await
        ),
        (Some("n2".into()), t2, T0 + 3_000)
    );
    assert_eq!(s.get("tk").await.unwrap().unwrap().lease.last_seq.as_deref(), Some("60"));
}

pub async fn release_frees_at_once_and_notifies<S: LeaseStore>(s: Arc<S>) {
    let mut rx = s.released().await.unwrap();
    s.put(&def("rel")).await.unwrap();
    s.put(&def("other")).await.unwrap();
    let t1 = s.acquire("rel", LeaseTerm { owner: "n1", now_ms: T0, lease_ms: 20_000 }).await.unwrap();
    s.release("rel", "n1", t1, Some("99")).await.unwrap();
    let got = tokio::time::timeout(WAIT, rx.recv()).await.expect("a release notification within 5 s");
    assert_eq!(got.as_deref(), Some("rel"));

    let f = s.get("rel").await.unwrap().unwrap();
    assert_eq!(f.lease.lease_expires_at_ms, 0, "a release expires the lease at once");
    assert_eq!(f.lease.last_seq.as_deref(), Some("99"));
    // 1 ms later, 19,999 ms before the old expiry, another node takes it.
    let t2 = s.acquire("rel", LeaseTerm { owner: "n2", now_ms: T0 + 1, lease_ms: 20_000 }).await.unwrap();
    assert_eq!(t2, t1 + 1);
    assert_eq!(s.get("rel").await.unwrap().unwrap().lease.last_seq.as_deref(), Some("99"), "last_seq survives");

    // A refused release (stale token) must not notify: the next notification is the valid
    // release of another feed, not "rel" (notifications arrive in the order they were sent).
    assert!(matches!(s.release("rel", "n1", t1, None).await, Err(LeaseError::Lost { .. })));
    let t = s.acquire("other", LeaseTerm { owner: "n1", now_ms: T0, lease_ms: 20_000 }).await.unwrap();
    s.release("other", "n1", t, None).await.unwrap();
    let got = tokio::time::timeout(WAIT, rx.recv()).await.expect("a release notification within 5 s");
    assert_eq!(got.as_deref(), Some("other"));
    assert_eq!(s.get("other").await.unwrap().unwrap().lease.last_seq, None, "no last_seq given, none stored");
}

pub async fn put_replacing_keeps_the_lease<S: LeaseStore>(s: Arc<S>) {
    assert!(s.put(&def("rp")).await.unwrap(), "the first put creates");
    let t = s.acquire("rp", LeaseTerm { owner: "n1", now_ms: T0, lease_ms: 20_000 }).await.unwrap();
    s.renew(
        LeaseTerm { owner: "n1", now_ms: T0 + 5_000, lease_ms: 20_000 },
        Renewal { id: "rp", token: t, last_seq: Some("1234") },
    )
    .await
    .unwrap();
    let mut d = def("rp");
    d.url = "ws://127.0.0.1:9/other".into();
    d.channel = "moved".into();
    d.desired_state = DesiredState::Stopped;
    d.subscribe.clear();
    d.resume_query.clear();
    d.seq_pointer = "/meta/id".into();
    assert!(!s.put(&d).await.unwrap(), "a second put replaces");
    let f = s.get("rp").await.unwrap().unwrap();
    assert_eq!(f.def, d, "the definition is replaced, optional fields cleared");
    assert_eq!(f.lease.lease_owner.as_deref(), Some("n1"));
    assert_eq!((f.lease.fencing_token, f.lease.lease_expires_at_ms), (t, T0 + 25_000));
    assert_eq!(f.lease.last_seq.as_deref(), Some("1234"));
    s.renew(
        LeaseTerm { owner: "n1", now_ms: T0 + 6_000, lease_ms: 20_000 },
        Renewal { id: "rp", token: t, last_seq: None },
    )
    .await
    .expect("the holder keeps its lease across a replace");

    let mut bad = def("rp");
    bad.url = "http://x/".into();
    match s.put(&bad).await {
        Err(LeaseError::Invalid(e)) => assert_eq!(e.field, "url"),
        other => panic!("a bad url must be refused naming the field: {other:?}"),
    }
    assert_eq!(s.get("rp").await.unwrap().unwrap().def, d, "a refused put writes nothing");
}

pub async fn renew_many_follows_the_renew_rules<S: LeaseStore>(s: Arc<S>) {
    const N: usize = 600;
    const LEASE: u64 = 20_000;
    let (taken, deleted, expired) = (150, 420, 555);
    let ids: Vec<String> = (0..N).map(|i| format!("m{i:03}")).collect();
    let mut tokens = Vec::with_capacity(N);
    for (i, id) in ids.iter().enumerate() {
        s.put(&def(id)).await.unwrap();
        tokens.push(
            s.acquire(id, LeaseTerm { owner: "n1", now_ms: T0, lease_ms: if i == expired { 1_000 } else { LEASE } })
                .await
                .unwrap(),
        );
    }
    // `taken` is released and acquired by n2; `deleted` is gone; `expired` ran out at T0 + 1,000.
    s.release(&ids[taken], "n1", tokens[taken], None).await.unwrap();
    let t2 = s.acquire(&ids[taken], LeaseTerm { owner: "n2", now_ms: T0 + 1, lease_ms: LEASE }).await.unwrap();
    assert!(s.delete(&ids[deleted]).await.unwrap());

    let seqs: Vec<Option<String>> = (0..N).map(|i| (i % 2 == 0).then(|| format!("s{i}"))).collect();
    let leases: Vec<Renewal<'_>> =
        (0..N).map(|i| Renewal { id: &ids[i], token: tokens[i], last_seq: seqs[i].as_deref() }).collect();
    let now = T0 + 5_000;
    let before = s.requests().get(StoreOp::RenewMany);
    let got = s.renew_many(LeaseTerm { owner: "n1", now_ms: now, lease_ms: LEASE }, &leases).await.expect("renew_many");
    let requests = s.requests().get(StoreOp::RenewMany) - before;
    assert_eq!(got.len(), N, "one result per lease");
    for (i, r) in got.iter().enumerate() {
        let want = match i {
            _ if i == taken => {
                Err(LeaseError::Lost { owner: Some("n2".into()), fencing_token: t2, expires_at_ms: T0 + 1 + LEASE })
            }
            _ if i == deleted => Err(LeaseError::NotFound),
            _ if i == expired => {
                Err(LeaseError::Lost { owner: Some("n1".into()), fencing_token: tokens[i], expires_at_ms: T0 + 1_000 })
            }
            _ => Ok(()),
        };
        assert_eq!(*r, want, "lease {i} ({})", ids[i]);
    }
    assert!(requests <= 12, "600 leases in {requests} requests: renew_many must batch (at most one per 50)");

    let feeds = s.get_many(&ids).await.unwrap();
    for (i, f) in feeds.iter().enumerate() {
        if i == deleted {
            assert_eq!(*f, None, "a renew does not recreate a deleted feed");
            continue;
        }
        let l = &f.as_ref().expect("the feed exists").lease;
        let want = match i {
            _ if i == taken => (Some("n2"), t2, T0 + 1 + LEASE, None),
            _ if i == expired => (Some("n1"), tokens[i], T0 + 1_000, None),
            _ => (Some("n1"), tokens[i], now + LEASE, seqs[i].as_deref()),
        };
        assert_eq!(
            (l.lease_owner.as_deref(), l.fencing_token, l.lease_expires_at_ms, l.last_seq.as_deref()),
            want,
            "lease {i} ({}) after renew_many",
            ids[i]
        );
    }

    // Refused as a whole, naming the field, before anything is written.
    let field = |r: Result<Vec<Result<(), LeaseError>>, LeaseError>| match r {
        Err(LeaseError::Invalid(e)) => e.field,
        other => panic!("must be refused as a whole: {other:?}"),
    };
    let one = |i: usize, seq: Option<&'static str>| Renewal { id: &ids[i], token: tokens[i], last_seq: seq };
    let later = now + 1_000;
    assert_eq!(
        field(
            s.renew_many(LeaseTerm { owner: "n1", now_ms: later, lease_ms: LEASE }, &[one(1, Some("x")), one(1, None)])
                .await
        ),
        "id"
    );
    assert_eq!(
        field(
            s.renew_many(
                LeaseTerm { owner: "n1", now_ms: later, lease_ms: LEASE },
                &[one(1, Some("x")), one(3, Some(""))]
            )
            .await
        ),
        "last_seq"
    );
    assert_eq!(
        field(s.renew_many(LeaseTerm { owner: "n1", now_ms: later, lease_ms: 0 }, &[one(1, None)]).await),
        "lease_ms"
    );
    assert_eq!(
        field(s.renew_many(LeaseTerm { owner: "", now_ms: later, lease_ms: LEASE }, &[one(1, None)]).await),
        "lease_owner"
    );
    let bad_id = Renewal { id: "no way", token: 1, last_seq: None };
    assert_eq!(
        field(s.renew_many(LeaseTerm { owner: "n1", now_ms: later, lease_ms: LEASE }, &[one(1, None), bad_id]).await),
        "id"
    );
    let f1 = s.get(&ids[1]).await.unwrap().unwrap();
    assert_eq!((f1.lease.lease_expires_at_ms, f1.lease.last_seq), (now + LEASE, None), "refused calls wrote nothing");
    assert_eq!(
        s.renew_many(LeaseTerm { owner: "n1", now_ms: later, lease_ms: LEASE }, &[]).await,
        Ok(Vec::new()),
        "an empty batch is no error"
    );
}

pub async fn many_feeds<S: LeaseStore>(s: Arc<S>) {
    const N: usize = 1_000;
    let ids: Vec<String> = (0..N).map(|i| format!("f{i:04}")).collect();
    for id in &ids {
        s.put(&def(id)).await.unwrap();
    }
    let t = s.acquire("f0007", LeaseTerm { owner: "n1", now_ms: T0, lease_ms: 20_000 }).await.unwrap();
    let mut ask = ids.clone();
    ask.insert(500, "missing".into());
    ask.push("f0003".into()); // asked twice: answered twice
    let got = s.get_many(&ask).await.unwrap();
    assert_eq!(got.len(), N + 2);
    for (id, f) in ask.iter().zip(&got) {
        match f {
            None => assert_eq!(id, "missing"),
            Some(f) => assert_eq!((&f.def.id, &f.def.channel), (id, &format!("feed.{id}"))),
        }
    }
    assert_eq!(got[7].as_ref().unwrap().lease.fencing_token, t);
    assert_eq!(s.list().await.unwrap().len(), N);
    assert!(s.delete("f0007").await.unwrap());
    assert!(!s.delete("f0007").await.unwrap(), "a second delete finds nothing");
    assert_eq!(s.get("f0007").await.unwrap(), None);
    assert_eq!(
        s.renew(
            LeaseTerm { owner: "n1", now_ms: T0 + 1, lease_ms: 20_000 },
            Renewal { id: "f0007", token: t, last_seq: None }
        )
        .await,
        Err(LeaseError::NotFound)
    );
    assert_eq!(
        s.acquire("f0007", LeaseTerm { owner: "n1", now_ms: T0 + 1, lease_ms: 20_000 }).await,
        Err(LeaseError::NotFound)
    );
    assert_eq!(s.release("f0007", "n1", t, None).await, Err(LeaseError::NotFound));
    let mut listed: Vec<String> = s.list().await.unwrap().into_iter().map(|f| f.def.id).collect();
    listed.sort();
    assert_eq!(listed.len(), N - 1);
    assert!(!listed.contains(&"f0007".to_owned()));
    assert!(s.get_many(&[]).await.unwrap().is_empty());
}

pub async fn bad_arguments_name_the_field<S: LeaseStore>(s: Arc<S>) {
    s.put(&def("a")).await.unwrap();
    let field = |e: LeaseError| match e {
        LeaseError::Invalid(f) => f.field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field(s.acquire("a", LeaseTerm { owner: "", now_ms: T0, lease_ms: 1_000 }).await.unwrap_err()),
        "lease_owner"
    );
    assert_eq!(field(s.acquire("a", LeaseTerm { owner: "n", now_ms: T0, lease_ms: 0 }).await.unwrap_err()), "lease_ms");
    assert_eq!(field(s.acquire("a:b", LeaseTerm { owner: "n", now_ms: T0, lease_ms: 10 }).await.unwrap_err()), "id");
    assert_eq!(
        field(
            s.renew(
                LeaseTerm { owner: "n", now_ms: T0, lease_ms: 10 },
                Renewal { id: "a", token: 1, last_seq: Some("") }
            )
            .await
            .unwrap_err()
        ),
        "last_seq"
    );
    assert_eq!(field(s.release("a", "n b", 1, None).await.unwrap_err()), "lease_owner");
    assert_eq!(field(s.get("").await.unwrap_err()), "id");
    assert_eq!(field(s.get_many(&["ok".into(), "no way".into()]).await.unwrap_err()), "id");
    assert_eq!(field(s.delete("x/y").await.unwrap_err()), "id");
    assert_eq!(s.acquire("zz", LeaseTerm { owner: "n", now_ms: T0, lease_ms: 10 }).await, Err(LeaseError::NotFound));
    let f = s.get("a").await.unwrap().unwrap();
    assert_eq!(f.lease.fencing_token, 0, "refused calls wrote nothing");
}

/// Runs every contract body as one `#[tokio::test]` in a module named `$backend`.
///
/// `$start` names an async fn `() -> (G, Arc<S>)`: a fresh, empty store and a guard `G` that
/// keeps its server alive until the test ends. `$racers` names an async fn
/// `(&G, &Arc<S>) -> Vec<Arc<S>>` giving [`RACERS`] handles on the same store, each with its
/// own connection where the backend has connections, as separate nodes would have.
macro_rules! lease_contract_tests {
    ($backend:ident, $start:ident, $racers:ident) => {
        mod $backend {
            use crate::lease_contract as contract;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn one_of_many_concurrent_acquirers_wins() {
                let (guard, s) = super::$start().await;
                contract::one_of_many_concurrent_acquirers_wins(super::$racers(&guard, &s).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn racing_takeovers_increase_tokens() {
                let (guard, s) = super::$start().await;
                contract::racing_takeovers_increase_tokens(super::$racers(&guard, &s).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn takeover_after_expiry_fences_the_old_owner() {
                let (_guard, s) = super::$start().await;
                contract::takeover_after_expiry_fences_the_old_owner(s).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn release_frees_at_once_and_notifies() {
                let (_guard, s) = super::$start().await;
                contract::release_frees_at_once_and_notifies(s).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn put_replacing_keeps_the_lease() {
                let (_guard, s) = super::$start().await;
                contract::put_replacing_keeps_the_lease(s).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn renew_many_follows_the_renew_rules() {
                let (_guard, s) = super::$start().await;
                contract::renew_many_follows_the_renew_rules(s).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn many_feeds() {
                let (_guard, s) = super::$start().await;
                contract::many_feeds(s).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn bad_arguments_name_the_field() {
                let (_guard, s) = super::$start().await;
                contract::bad_arguments_name_the_field(s).await;
            }
        }
    };
}
