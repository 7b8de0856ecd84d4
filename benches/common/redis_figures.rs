//! What the Redis broker's benches read off their redis-server (the tests' [`RedisProc`]):
//! `INFO` figures, a reset between measured runs; and [`redis_alone`], the ceiling Redis itself
//! sets for tether's publish script.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::redis::RedisProc;

/// A bench's view of its [`RedisProc`], through `redis-cli` (what the tests use too).
pub trait RedisFigures {
    /// `INFO section` as Redis prints it (`server`, `memory`, `commandstats`, …).
    fn info(&self, section: &str) -> String;

    /// Empties Redis and zeroes its command statistics, so that each measured run starts from
    /// the same keyspace: dedup keys live for `dedup.window_ms` (5 minutes by default), and a
    /// keyspace grown by earlier runs makes every later one pay for lookups in a bigger table
    /// and for its incremental rehashing.
    fn reset(&self);

    /// `used_memory` from `INFO memory`, in bytes (NaN when absent).
    fn used_memory(&self) -> f64;

    /// `INFO commandstats` as `{command: {"calls", "usec"}}` (commands run by scripts count too).
    fn commandstats(&self) -> Value;
}

impl RedisFigures for RedisProc {
    fn info(&self, section: &str) -> String {
        self.cli(&["INFO", section])
    }

    fn reset(&self) {
        self.cli(&["FLUSHALL", "SYNC"]);
        self.cli(&["CONFIG", "RESETSTAT"]);
    }

    fn used_memory(&self) -> f64 {
        let info = self.info("memory");
        info.lines().find_map(|l| l.strip_prefix("used_memory:")?.trim().parse().ok()).unwrap_or(f64::NAN)
    }

    fn commandstats(&self) -> Value {
        let info = self.info("commandstats");
        let mut out = serde_json::Map::new();
        for line in info.lines() {
            let Some((name, stats)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else { continue };
            let field = |k: &str| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=')?.trim().parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            out.insert(name.to_string(), json!({"calls": field("calls"), "usec": field("usec")}));
        }
        Value::Object(out)
    }
}

/// Connections of the Redis-alone run.
pub const ALONE_CLIENTS: usize = 2;
/// Script calls per pipeline of the Redis-alone run.
pub const ALONE_DEPTH: usize = 2;
/// Publishes per script call of the Redis-alone run (the broker thread's largest batch).
pub const ALONE_BATCH: usize = 512;

/// Redis alone, no tether: [`ALONE_CLIENTS`] threads, each with its own connection, send the
/// publish script tether uses (`keys::PUBLISH_LUA`, with the arguments the broker thread
/// builds: [`ALONE_BATCH`] publishes per call, over `channels` channels, an id on every
/// publish) in pipelines of [`ALONE_DEPTH`] calls for `secs`: the ceiling Redis itself sets
/// on this box, and its CPU per publish.
pub fn redis_alone(redis: &RedisProc, secs: f64, channels: usize, size: usize) -> Value {
    use tether::server::broker::redis::keys::{Keys, PublishCall, PublishParams, PUBLISH_LUA};
    let client = ::redis::Client::open(redis.url().as_str()).expect("redis URL");
    let loaded = client
        .get_connection()
        .and_then(|mut c| ::redis::cmd("SCRIPT").arg("LOAD").arg(PUBLISH_LUA).query::<String>(&mut c));
    let sha = match loaded {
        Ok(sha) => sha,
        Err(e) => return json!({"error": e.to_string()}),
    };
    let cfg = tether::config::Config::default();
    let (history, window_ms) = (cfg.channel_rule("load.alone").history, cfg.dedup.window_ms);
    let run = format!("{:08x}", rand::random::<u32>());
    redis.reset();
    let stat = PathBuf::from(format!("/proc/{}/stat", redis.pid()));
    let sched = PathBuf::from(format!("/proc/{}/schedstat", redis.pid()));
    let (cpu0, wait0) =
        (super::proc_seconds(&stat).unwrap_or(f64::NAN), super::proc_seconds(&sched).unwrap_or(f64::NAN));
    let start = Instant::now();
    let stop_at = start + Duration::from_secs_f64(secs);
    let results: Vec<Result<u64, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..ALONE_CLIENTS)
            .map(|c| {
                let (client, sha, run) = (client.clone(), sha.clone(), run.clone());
                scope.spawn(move || -> Result<u64, String> {
                    let mut conn = client.get_connection().map_err(|e| e.to_string())?;
                    let keys = Keys::new("tether:");
                    // No deadline: this measures Redis's cost, not a broker's timeouts.
                    let params = PublishParams {
                        ttl_ms: 600_000,
                        dedup_window_ms: window_ms,
                        epoch: &run,
                        command: "PUBLISH",
                        deadline_ms: u64::MAX,
                    };
                    let mut n = 0u64;
                    while Instant::now() < stop_at {
                        let mut pipe = ::redis::pipe();
                        for _ in 0..ALONE_DEPTH {
                            let pubs: Vec<(String, String, Vec<u8>)> = (0..ALONE_BATCH)
                                .map(|_| {
                                    n += 1;
                                    let ch = format!("load.alone.{run}.{}", n as usize % channels.max(1));
                                    (ch, format!("{run}-{c}-{n}"), tether_load::publish::stamp(n, size).into_bytes())
                                })
                                .collect();
                            let mut call = PublishCall::default();
                            for (ch, id, data) in &pubs {
                                call.push(ch, Some(id), data, None, || history);
                            }
                            let cmd = pipe.cmd("EVALSHA").arg(&sha);
                            call.args(&keys, &params, |a| {
                                cmd.arg(a);
                            });
                        }
                        pipe.query::<Vec<::redis::Value>>(&mut conn).map_err(|e| e.to_string())?;
                    }
                    Ok(n)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("client thread panicked".into()))).collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let (cpu1, wait1) =
        (super::proc_seconds(&stat).unwrap_or(f64::NAN), super::proc_seconds(&sched).unwrap_or(f64::NAN));
    let publishes: u64 = results.iter().filter_map(|r| r.as_ref().ok()).sum();
    let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let evalsha = &redis.commandstats()["evalsha"];
    json!({
        "clients": ALONE_CLIENTS, "depth": ALONE_DEPTH, "batch": ALONE_BATCH, "wall_s": wall, "publishes": publishes,
        "publishes_per_s": publishes as f64 / wall,
        "redis_cpu_pct": (cpu1 - cpu0) / wall * 100.0, "redis_wait_pct": (wait1 - wait0) / wall * 100.0,
        "redis_cpu_us_per_publish": (cpu1 - cpu0) / publishes as f64 * 1e6,
        "redis_usec_per_evalsha": super::num(evalsha, "usec") / super::num(evalsha, "calls"),
        "redis_usec_per_publish": super::num(evalsha, "usec") / publishes as f64,
        "redis_bytes_per_publish": redis.used_memory() / publishes as f64,
        "errors": errors,
    })
}
