#!/bin/bash
# Two builds side by side under the same stream load (docs/benchmarks.md, "Sampling and
# trends"): 10 users × 5,000 channels at 2 Hz through batch publishes, on a fresh memory-broker
# server per run: A, B, and B again with a trend kept for every channel (`trend_window_s` in the
# default namespace: the cost of a point channel's trend), alternating so all see the same
# machine. Prints the server's CPU per publication (cpu_s / publications) and p99 per run.
#
#   scripts/bench-ab.sh A_BIN B_BIN OUT [DURATION] [ROUNDS]
set -u
cd "$(dirname "$0")/.."
A=${1:?first build}
B=${2:?second build}
OUT=${3:?out directory}
DURATION=${4:-20}
ROUNDS=${5:-2}
mkdir -p "$OUT"
. scripts/loopback.sh
for round in $(seq 1 "$ROUNDS"); do
    for build in A B T; do
            bin=$A; [ "$build" != A ] && bin=$B
            config=()
            if [ "$build" = T ]; then
                printf '[namespaces.""]\nhistory_size = 100\nhistory_ttl_s = 300\ntrend_window_s = 3600\n' > "$OUT/trend.toml"
                config=(--config "$OUT/trend.toml")
            fi
            port=$(spare)
            env -u SWITCHBOARD_BIN "$bin" serve "${config[@]}" --listen "127.0.0.1:$port" > /dev/null 2>&1 &
            spid=$!
            wait_ready "$port"
            dir="$OUT/$build-$round"
            "$B" bench streams --target "ws://127.0.0.1:$port/ws" --users 10 --points 5000 --hz 2 \
                --duration "$DURATION" --server-pid "$spid" --out "$dir" --quiet > "$dir.log" 2>&1
            kill "$spid"; wait "$spid" 2>/dev/null
            python3 - "$dir/result.json" "$build" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
us = r["server"]["cpu_s"] / r["messages"]["sent"] * 1e6
print(f'{sys.argv[2]} {us:6.2f} µs/publication  p99 {r["latency_ms"]["p99"]:6.1f} ms  pass {r["pass"]}')
PY
    done
done | tee "$OUT/summary.txt"
