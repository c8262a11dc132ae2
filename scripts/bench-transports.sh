#!/bin/bash
# Two builds' HTTP transports against WebSocket (docs/benchmarks.md, "SSE and long-polling"):
# for each build, a fresh memory-broker server per run, `bench broadcast --transport X
# --reference ws` and `--transport ws --reference X` for long-poll and session SSE, the builds
# alternating for ROUNDS rounds. The bench client is B's for every run. Prints each run's
# same-run cost ratio (median of periods) and, per build and transport, X ÷ WebSocket both
# ways (the geometric mean of `X vs ws` and 1 / `ws vs X`, which cancels a lane bias).
#
#   scripts/bench-transports.sh A_BIN B_BIN OUT [ROUNDS] [SUBS] [BURSTS]
set -u
cd "$(dirname "$0")/.."
A=${1:?first build}
B=${2:?second build}
OUT=${3:?out directory}
ROUNDS=${4:-2}
SUBS=${5:-3000}
BURSTS=${6:-30}
mkdir -p "$OUT"
. scripts/loopback.sh
for round in $(seq 1 "$ROUNDS"); do
  for build in A B; do
    bin=$A; [ "$build" = B ] && bin=$B
    for pair in "poll ws" "ws poll" "sse ws" "ws sse"; do
      set -- $pair
      port=$(spare)
      env -u SWITCHBOARD_BIN "$bin" serve --listen "127.0.0.1:$port" > /dev/null 2>&1 &
      spid=$!
      wait_ready "$port"
      dir="$OUT/$build-$1-$2-$round"
      timeout 600 "$B" bench broadcast --target "ws://127.0.0.1:$port/ws" --transport "$1" --reference "$2" \
          --subs "$SUBS" --period 1 --bursts "$BURSTS" --server-pid "$spid" --out "$dir" --quiet > "$dir.log" 2>&1
      kill "$spid"; wait "$spid" 2>/dev/null
      python3 - "$dir/result.json" "$build" "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ref = r["extra"]["reference"]
print(f'{sys.argv[2]} {sys.argv[3]:>4} vs {sys.argv[4]:<4} {ref["cost_ratio_median_of_periods"]:.3f}  '
      f'lost {r["messages"]["lost"]} pass {r["pass"]}', flush=True)
PY
    done
  done
done
python3 - "$OUT" <<'PY'
import glob, json, math, os, statistics, sys
out = sys.argv[1]
def ratios(build, x, ref):
    got = []
    for f in sorted(glob.glob(os.path.join(out, f"{build}-{x}-{ref}-*", "result.json"))):
        got.append(json.load(open(f))["extra"]["reference"]["cost_ratio_median_of_periods"])
    return got
for build in "AB":
    for x in ("poll", "sse"):
        there, back = ratios(build, x, "ws"), ratios(build, "ws", x)
        if there and back:
            both = math.sqrt(statistics.median(there) / statistics.median(back))
            print(f"{build} {x} ÷ ws: {both:.2f}  ({x} vs ws {statistics.median(there):.3f}, ws vs {x} {statistics.median(back):.3f})")
PY
