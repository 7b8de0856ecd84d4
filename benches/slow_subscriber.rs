//! One slow subscriber must not slow the others (docs/operations.md, slow subscribers):
//! p50/p99/p999 publish-to-receive latency of N fast subscribers on one channel, WITHOUT and WITH
//! one non-reader on the same channel, in interleaved rounds of the same run, reported as medians
//! over the rounds and as the ratio of the medians against the no-non-reader baseline.
//!
//! `cargo bench --bench slow_subscriber`. Env: SLOW_ROUNDS (5), SLOW_SUBS (1000), SLOW_RATE
//! (messages/s, 200), SLOW_SIZE (bytes of `data`, 1024), SLOW_DURATION (seconds of publishing
//! per run, 7), SLOW_CORES (2), SLOW_NON_READERS (1), SLOW_DROP_OLDEST (1: also run the
//! non-reader case against a second server whose channels use `overflow = "drop-oldest"`;
//! 0: skip).
//!
//! The non-reader (`tether load fanout --non-readers`) sets `SO_RCVBUF` 4096 and announces an
//! MSS of 1460 before connect, subscribes, then never reads; with a 1 MiB queue
//! (`limits.queue_max_bytes = 1048576`, set here: the default is 2 MiB, which would fill only
//! after the run) it fills about 5 s into each run, so the `disconnect` server closes it with
//! 1013 within the run (the remaining seconds show the others after it is gone). The 1 MiB queue
//! needs `limits.max_publish_bytes` at most 1,044,287 (the largest publish must fit the queue);
//! 65536 is set, far above SLOW_SIZE. Both servers use these queue limits;
//! `limits.close_timeout_ms = 30000` only keeps the 1013 readable when the non-reader reads at
//! the end of the run (docs/protocol.md, close codes), so the report can say how it was closed.
//! The order of the cases alternates from round to round, so drift on the shared box hits every
//! case alike. Besides the ratio of the medians, the summary gives the median of the per-round
//! ratios (each case against the baseline of its own round), which pairs runs seconds apart.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// One measured case: which server, how many non-readers.
struct Case {
    name: &'static str,
    server: usize,
    non_readers: usize,
}

fn main() {
    if !should_run() {
        return;
    }
    let rounds: usize = env_or("SLOW_ROUNDS", 5).max(1);
    let subs: usize = env_or("SLOW_SUBS", 1000);
    let rate: f64 = env_or("SLOW_RATE", 200.0);
    let size: usize = env_or("SLOW_SIZE", 1024);
    let duration: f64 = env_or("SLOW_DURATION", 7.0);
    let cores: usize = env_or("SLOW_CORES", 2);
    let non_readers: usize = env_or("SLOW_NON_READERS", 1).max(1);
    let drop_oldest = env_or("SLOW_DROP_OLDEST", 1) != 0;

    pin_binary("slow_subscriber");
    let base = "[limits]\nclose_timeout_ms = 30000\nqueue_max_bytes = 1048576\nmax_publish_bytes = 65536\n";
    let mut servers = vec![serve("slow_subscriber", cores, base)];
    let mut cases = vec![
        Case { name: "baseline", server: 0, non_readers: 0 },
        Case { name: "non-reader (disconnect)", server: 0, non_readers },
    ];
    if drop_oldest {
        let cfg = format!("{base}\n[[channels]]\npattern = \"*\"\noverflow = \"drop-oldest\"\n");
        servers.push(serve("slow_subscriber_drop_oldest", cores, &cfg));
        cases.push(Case { name: "non-reader (drop-oldest)", server: 1, non_readers });
    }

    let mut runs: Vec<Value> = Vec::new();
    let mut rows = Vec::new();
    let mut commands = Vec::new();
    for round in 0..rounds {
        // Alternate the order so a trend in the box's load does not favour one case.
        let order: Vec<usize> =
            if round % 2 == 0 { (0..cases.len()).collect() } else { (0..cases.len()).rev().collect() };
        for &c in &order {
            let case = &cases[c];
            let server = &servers[case.server];
            let mut args = fanout_args(server.ws_url(), subs, rate, size, duration);
            if case.non_readers > 0 {
                args.extend(["--non-readers".into(), case.non_readers.to_string()]);
            }
            if round == 0 {
                commands.push(format!("tether load {}", args.join(" ")));
            }
            let overflow_before = server.metric_sync("tether_overflow_total", &[]).unwrap_or(0.0);
            let r = load(&args);
            let overflows = server.metric_sync("tether_overflow_total", &[]).unwrap_or(0.0) - overflow_before;
            let cell = |k: &str| common::cell(&r, k);
            rows.push(vec![
                round.to_string(),
                case.name.to_string(),
                cell("deliveries_per_s"),
                cell("p50_ms"),
                cell("p99_ms"),
                cell("p999_ms"),
                cell("max_ms"),
                cell("lost"),
                cell("errors"),
                format!("{overflows}"),
                if case.non_readers > 0 { cell("non_reader_close_kinds") } else { "-".into() },
                if case.non_readers > 0 { cell("non_reader_lost") } else { "-".into() },
            ]);
            runs.push(json!({"round": round, "case": case.name, "non_readers": case.non_readers,
                "server_overflows": overflows, "report": r}));
            // The next run starts on a server with no connection of this one left.
            wait_connections(server, 0, Duration::from_secs(40));
        }
    }
    for s in &mut servers {
        s.stop(STOP_GRACE);
    }

    let pick = |case: &str, key: &str| -> Vec<f64> {
        runs.iter()
            .filter(|r| r["case"] == case)
            .map(|r| r["report"].get(key).and_then(Value::as_f64).unwrap_or(f64::NAN))
            .collect()
    };
    let mut summary = Vec::new();
    let mut summary_rows = Vec::new();
    for case in &cases {
        let mut m = serde_json::Map::new();
        let mut row = vec![case.name.to_string()];
        for key in ["p50_ms", "p99_ms", "p999_ms"] {
            let (mine, base) = (pick(case.name, key), pick("baseline", key));
            let med = median(&mine);
            let ratio = med / median(&base);
            let paired: Vec<f64> = mine.iter().zip(&base).map(|(a, b)| a / b).collect();
            m.insert(format!("median_{key}"), json!(round3(med)));
            m.insert(format!("{key}_ratio_vs_baseline"), json!(round3(ratio)));
            m.insert(format!("{key}_median_paired_ratio"), json!(round3(median(&paired))));
            row.push(format!("{med:.3}"));
            row.push(format!("{ratio:.2}x"));
            if key == "p99_ms" {
                row.push(format!("{:.2}x", median(&paired)));
            }
        }
        let closed = pick(case.name, "non_readers_closed").iter().filter(|x| !x.is_nan()).sum::<f64>();
        m.insert("non_readers_closed_total".into(), json!(closed));
        row.push(if case.non_readers > 0 { format!("{closed}/{}", case.non_readers * rounds) } else { "-".into() });
        summary.push(json!({"case": case.name, "figures": m}));
        summary_rows.push(row);
    }

    table(
        &format!(
            "slow subscriber: {subs} subscribers, {rate} msg/s of {size} B for {duration} s, {cores} cores, {} allocator (every run)",
            allocator()
        ),
        &["round", "case", "deliveries/s", "p50 ms", "p99 ms", "p999 ms", "max ms", "lost", "errors", "overflows", "non-reader end", "nr lost"],
        &rows,
    );
    table(
        &format!("slow subscriber: medians over {rounds} rounds; ratio of medians against the baseline, and median of per-round ratios (paired)"),
        &["case", "p50 ms", "ratio", "p99 ms", "ratio", "paired", "p999 ms", "ratio", "non-readers closed"],
        &summary_rows,
    );
    write_json(
        "slow_subscriber",
        &json!({
            "allocator": allocator(),
            "cores": cores,
            "subs": subs,
            "rate": rate,
            "size": size,
            "duration_s": duration,
            "rounds": rounds,
            "non_readers": non_readers,
            "commands": commands,
            "summary": summary,
            "runs": runs,
        }),
    );
}

/// Rounds to 3 decimals (NaN stays NaN, which JSON writes as null).
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
