#!/bin/bash
# The cost of server-side alarms (docs/benchmarks.md, "Alarms"): one user holding 10,000
# point channels at 1 Hz (10,000 publications/s through batch publishes), on a fresh
# memory-broker node per run: N without alarms; E with one alarm definition per channel whose
# limits the values never reach (the evaluation alone); T with limits the values cross
# (hi = 90 with a deadband of 1: each point is raised and returns every ~143 s, about 140
# transitions/s stored, published and journaled). Alternating rounds, so all see the same
# machine. Prints the server's CPU per publication and its ratio to N's in the same round.
#
#   scripts/bench-alarms.sh BIN OUT [DURATION] [ROUNDS]
set -u
cd "$(dirname "$0")/.."
BIN=${1:?switchboard binary}
OUT=${2:?out directory}
DURATION=${3:-20}
ROUNDS=${4:-2}
POINTS=10000
mkdir -p "$OUT"
. scripts/loopback.sh
defs() {
    python3 - "$1" "$POINTS" <<'PY'
import sys
hi, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    print(f'[[alarms]]\nid = "b{i}"\nchannel = "bench:streams.{i}"\nhi = {hi}\ndeadband = 1.0\n')
PY
}
defs 1000 > "$OUT/evaluate.toml"
defs 90 > "$OUT/transitions.toml"
for round in $(seq 1 "$ROUNDS"); do
    base=""
    for run in N E T; do
        config=()
        [ "$run" = E ] && config=(--config "$OUT/evaluate.toml")
        [ "$run" = T ] && config=(--config "$OUT/transitions.toml")
        port=$(spare)
        data="$OUT/data-$run-$round"
        env -u SWITCHBOARD_BIN "$BIN" serve "${config[@]}" --data-dir "$data" --listen "127.0.0.1:$port" > /dev/null 2>&1 &
        spid=$!
        wait_ready "$port"
        # A node with alarms stores and publishes each new alarm's first state at start: let
        # it settle, so that the run measures the steady state of every node alike.
        sleep 8
        dir="$OUT/$run-$round"
        "$BIN" bench streams --target "ws://127.0.0.1:$port/ws" --users 1 --points "$POINTS" --hz 1 \
            --duration "$DURATION" --server-pid "$spid" --out "$dir" --quiet > "$dir.log" 2>&1
        transitions=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^switchboard_alarm_transitions_total/ {n += $2} END {print n + 0}')
        kill "$spid"; wait "$spid" 2>/dev/null
        line=$(python3 - "$dir/result.json" "$run" "$transitions" "$base" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
us = r["server"]["cpu_s"] / r["messages"]["sent"] * 1e6
base = float(sys.argv[4]) if sys.argv[4] else us
print(f'{us:.3f} {sys.argv[2]} {us:6.2f} µs/publication  ×{us / base:4.2f}  transitions {sys.argv[3]}  p99 {r["latency_ms"]["p99"]:6.1f} ms  pass {r["pass"]}')
PY
)
        [ "$run" = N ] && base=${line%% *}
        echo "round $round ${line#* }"
    done
done | tee "$OUT/summary.txt"
