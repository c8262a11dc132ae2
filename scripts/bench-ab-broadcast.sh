#!/bin/bash
# Two builds side by side under one broadcast (docs/benchmarks.md, "Fault isolation"): 8,000
# WebSocket subscribers of one channel, 20 bursts a second apart, a fresh memory-broker server
# per run, alternating A and B for three rounds. Prints the server's CPU (cpu_s over the run),
# the deliveries and p99 per run.
#
#   scripts/bench-ab-broadcast.sh A_BIN B_BIN OUT
set -u
cd "$(dirname "$0")/.."
A=${1:?first build}
B=${2:?second build}
OUT=${3:?out directory}
mkdir -p "$OUT"
. scripts/loopback.sh
for round in 1 2 3; do
  for build in A B; do
    bin=$A; [ "$build" = B ] && bin=$B
    port=$(spare)
    env -u SWITCHBOARD_BIN "$bin" serve --listen "127.0.0.1:$port" > /dev/null 2>&1 &
    spid=$!
    wait_ready "$port"
    dir="$OUT/$build-$round"
    "$B" bench broadcast --target "ws://127.0.0.1:$port/ws" --subs 8000 --period 1 --bursts 20 \
        --server-pid "$spid" --out "$dir" --quiet > "$dir.log" 2>&1
    kill "$spid"; wait "$spid" 2>/dev/null
    python3 - "$dir/result.json" "$build" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["messages"]
us = r["server"]["cpu_s"] / m["received"] * 1e6
print(f'{sys.argv[2]} {us:6.2f} µs/delivery  received {m["received"]}/{m["expected"]} lost {m["lost"]} '
      f'dup {m["duplicated"]}  p99 {r["latency_ms"]["p99"]:6.1f} ms  pass {r["pass"]}')
PY
  done
done
