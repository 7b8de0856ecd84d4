#!/usr/bin/env python3
"""bench-peers' run_bench.py with one more server: the uWebSockets peer of benches/peers.rs.

run_bench.py keeps its servers in a module-level table (PEERS) and lives in a read-only
directory, so this wrapper imports it, adds "uwebsockets" (the binary named by $UWS_BIN, started
as `UWS_BIN PORT` like the other peers) and "tether-base" (another tether build, $TETHER_BASE_BIN,
started as run_bench.py starts tether) and hands over to its main() with the same arguments:
these runs get exactly the same quiet gate, wsbench arguments, pinning and retries as the
others. Usage: BENCH_PEERS_DIR=... [UWS_BIN=...] [TETHER_BASE_BIN=...] run_peers.py ARGS...
"""
import os
import sys

sys.path.insert(0, os.environ["BENCH_PEERS_DIR"])
import run_bench  # noqa: E402  (found through BENCH_PEERS_DIR)

if os.environ.get("UWS_BIN"):
    run_bench.PEERS["uwebsockets"] = [os.environ["UWS_BIN"]]
if os.environ.get("TETHER_BASE_BIN"):
    tether = run_bench.PEERS["tether"]
    run_bench.PEERS["tether-base"] = [c.replace("TETHER_BIN", "TETHER_BASE_BIN") for c in tether]

if __name__ == "__main__":
    run_bench.main()
