//! The broker contract of `tests/broker_contract` (seq with no gap, order, dedup, fan-out
//! once, history resume, a stable epoch) against the embedded memory broker: a `tether serve`
//! with the default `[broker]` (`kind = "memory"`) and two cores, so channels have their home
//! on either core and subscribers sit on both. The Redis broker runs the same contract in
//! `tests/broker_contract_redis.rs`.

mod common;
mod nodes;
#[macro_use]
mod broker_contract;

use common::Server;

/// A two-core server with the memory broker (the default config); no guard to keep.
async fn memory_start() -> ((), Server) {
    ((), Server::start("", &["--cores", "2"]))
}

broker_contract_tests!(memory, memory_start);
