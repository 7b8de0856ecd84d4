#!/usr/bin/env bash
# Autobahn|Testsuite performance set (cases 9.*: 64 KiB .. 16 MiB messages and frames)
# against a release `tether serve --echo` with max_message_bytes raised to 16 MiB.
# Prints the suite's summary and the slowest cases (ms). Usage: benches/autobahn_perf.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
tmp=$(mktemp -d)
printf 'listen = "127.0.0.1:0"\n[limits]\nmax_message_bytes = 16777216\n' > "$tmp/tether.toml"
target/release/tether serve --config "$tmp/tether.toml" --echo > "$tmp/out" 2> "$tmp/err" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 50); do grep -q listening "$tmp/out" && break; sleep 0.1; done
addr=$(awk '/listening/ {print $NF}' "$tmp/out")
bash scripts/autobahn.sh --cases '9.*' --exclude '' --out "$tmp/report" "ws://$addr/echo"
python3 - "$tmp/report/index.json" <<'PY'
import json, sys
cases = next(iter(json.load(open(sys.argv[1])).values()))
rows = sorted(((v["duration"], k, v["behavior"]) for k, v in cases.items()), reverse=True)
print("slowest 9.* cases (ms):")
for d, k, b in rows[:8]:
    print(f"  {k:8} {d:6} {b}")
print(f"total {sum(r[0] for r in rows)} ms over {len(rows)} cases")
PY
