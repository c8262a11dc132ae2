#!/bin/bash
# Subscribing on a node that already holds many channels (docs/benchmarks.md, "Subscribing on
# a node that holds many channels"): for each build, a fresh memory-broker server, then RUNS
# `bench streams` runs side by side, started half a second apart, each one user with one
# connection subscribing POINTS channels of its own prefix at HZ, so the node holds up to
# RUNS × POINTS channels while the later ones subscribe. Prints each run's subscribe time
# (connect to the last subscribe reply) and whether it passed.
#
#   scripts/bench-subscribe.sh A_BIN B_BIN OUT [RUNS] [POINTS] [HZ] [DURATION]
set -u
cd "$(dirname "$0")/.."
A=${1:?first build}
B=${2:?second build}
OUT=${3:?out directory}
RUNS=${4:-10}
POINTS=${5:-10000}
HZ=${6:-0.1}
DURATION=${7:-20}
mkdir -p "$OUT"
. scripts/loopback.sh
for build in A B; do
    bin=$A; [ "$build" = B ] && bin=$B
    port=$(spare)
    env -u SWITCHBOARD_BIN "$bin" serve --listen "127.0.0.1:$port" > /dev/null 2>&1 &
    spid=$!
    wait_ready "$port"
    runs=()
    for n in $(seq 1 "$RUNS"); do
        dir="$OUT/$build-$n"
        timeout 300 "$B" bench streams --target "ws://127.0.0.1:$port/ws" --users 1 --points "$POINTS" --hz "$HZ" \
            --mode set --duration "$DURATION" --prefix "bench:s$n." --server-pid "$spid" --out "$dir" --quiet \
            > "$dir.log" 2>&1 &
        runs+=($!)
        sleep 0.5
    done
    wait "${runs[@]}"
    kill "$spid"; wait "$spid" 2>/dev/null
    python3 - "$OUT" "$build" "$RUNS" <<'PY'
import json, os, sys
out, build, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
for n in range(1, runs + 1):
    path = os.path.join(out, f"{build}-{n}", "result.json")
    if not os.path.exists(path):
        print(f"{build} run {n:2}: no result (see {build}-{n}.log)")
        continue
    r = json.load(open(path))
    print(f'{build} run {n:2}: subscribe {r["extra"]["subscribe_ms_max"]:9.1f} ms  pass {r["pass"]}')
PY
done
