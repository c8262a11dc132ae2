#!/bin/bash
# Reproduces the seed experiments of docs/benchmarks.md on this machine, one after the other,
# each against a freshly started release server (memory broker) so its CPU and memory figures
# are its own. Results land in OUT/<experiment>/ and a side-by-side page in OUT/report.html;
# scripts/bench-summary.py OUT prints the figures the document quotes.
#
#   scripts/bench-seeds.sh [OUT] [EXPERIMENT...]     (default: all experiments)
#
# Experiments: limit broadcast search echo rooms streams dashboard connect sessions transports
set -u
cd "$(dirname "$0")/.."
BIN=${SWITCHBOARD_BIN:-target/release/switchboard}
OUT=${1:-bench-results/seeds-$(date +%s)}
shift || true
WANT=${*:-limit broadcast search echo rooms streams dashboard connect sessions transports}
mkdir -p "$OUT"
SPID=""

start_server() {
    "$BIN" serve --listen 127.0.0.1:0 "$@" > "$OUT/server.out" 2> "$OUT/server.log" &
    SPID=$!
    for _ in $(seq 1 100); do
        grep -q "listening on" "$OUT/server.out" 2> /dev/null && break
        sleep 0.1
    done
    PORT=$(grep -o '[0-9]*$' "$OUT/server.out")
    TARGET="ws://127.0.0.1:$PORT/ws"
}

stop_server() {
    [ -n "$SPID" ] && kill "$SPID" 2> /dev/null && wait "$SPID" 2> /dev/null
    SPID=""
}
trap stop_server EXIT

# run NAME SCENARIO ARGS...: one bench run against a fresh server.
run() {
    local name=$1
    shift
    echo "== $name: switchboard bench $*"
    start_server
    "$BIN" bench "$@" --target "$TARGET" --server-pid "$SPID" --out "$OUT/$name" --quiet
    echo "   exit $?"
    stop_server
}

want() { [[ " $WANT " == *" $1 "* ]]; }

if want limit; then
    echo "== limit-10k: switchboard bench limit --subs 10000 --size 64 --messages 20"
    "$BIN" bench limit --subs 10000 --size 64 --messages 20 --out "$OUT/limit-10k" --quiet
fi
want broadcast && run broadcast-10k broadcast --subs 10000 --period 1 --bursts 20
# The server is one process under the 20,000 open-file limit: 19,000 is the largest step.
want search && run broadcast-search broadcast --subs 4750 --period 1 --bursts 100 --search --search-max 19000
if want echo; then
    for n in 1000 5000 10000; do
        run "echo-$n" echo --conns "$n" --rate 1 --ramp 1000 --duration 20 --protocol switchboard
    done
fi
if want rooms; then
    # The published table (rooms x members @ pause); iterations bounded to keep each run near 2 min.
    run rooms-100x5-1s rooms --rooms 100 --members 5 --pause 1 --iterations 100
    run rooms-500x3-15s rooms --rooms 500 --members 3 --pause 15 --iterations 8
    run rooms-1000x2-5s rooms --rooms 1000 --members 2 --pause 5 --iterations 20
    run rooms-2000x2-15s rooms --rooms 2000 --members 2 --pause 15 --iterations 8
fi
if want streams; then
    run streams-set-200x1000 streams --users 200 --points 1000 --hz 1 --mode set --duration 20
    run streams-channels-2600 streams --users 1 --points 2600 --hz 1 --mode channels --duration 20
    run streams-channels-10000 streams --users 1 --points 10000 --hz 1 --mode channels --duration 20
fi
if want dashboard; then
    run dashboard-1000-1hz dashboard --widgets 1000 --hz 1 --duration 20
    run dashboard-1000-10hz dashboard --widgets 1000 --hz 10 --duration 20
fi
want connect && run connect-10000 connect --conns 10000 --rate 2000
if want sessions; then
    echo "== sessions: switchboard bench sessions --sessions 1,10,100,1000 --workers 1,2 --procs 2"
    "$BIN" bench sessions --sessions 1,10,100,1000 --workers 1,2 --procs 2 --duration 3 --out "$OUT/sessions" --quiet
fi

if want transports; then
    # Long-polling broadcast capacity (Silverlight), and SSE beside WebSocket. An HTTP-transport
    # client here is a poll session with two connections, so 9,000 clients are 18,000 of the
    # server's 20,000 open files.
    run poll-search broadcast --transport poll --subs 2250 --period 1 --bursts 20 --search --search-max 9000
    run sse-9000 broadcast --transport sse --subs 9000 --period 1 --bursts 10
    run ws-9000 broadcast --transport ws --subs 9000 --period 1 --bursts 10
fi

"$BIN" bench report "$OUT"/*/ --out "$OUT/report.html" > /dev/null && echo "report: $OUT/report.html"
