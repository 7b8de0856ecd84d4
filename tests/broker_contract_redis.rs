//! The broker contract of `tests/broker_contract` (seq with no gap, order, dedup, fan-out
//! once, history resume, a stable epoch) against the Redis broker: a two-core `tether serve`
//! with `[broker] kind = "redis"` on a real `redis-server` started by each test (a Unix socket
//! in a temp dir, killed by PID when the test ends; `redis-server` must be installed). The
//! memory broker runs the same contract in `tests/broker_contract_memory.rs`.

mod common;
mod nodes;
#[macro_use]
mod broker_contract;

use common::redis::{redis_config, RedisProc};
use common::Server;

/// A Redis, and a two-core server whose broker it is. The server is returned second so it is
/// dropped (killed) before its Redis.
async fn redis_start() -> (RedisProc, Server) {
    let redis = RedisProc::start();
    let srv = Server::start(&redis_config(&redis.url(), ""), &["--cores", "2"]);
    (redis, srv)
}

broker_contract_tests!(redis, redis_start);
