#!/bin/bash
# Three nodes on one Redis, SUBS subscribers spread evenly over them, one publisher (the HTTP API
# of the first node): deliveries/s and latency from `bench broadcast`, and the CPU seconds each
# node and redis-server spent during the run, from /proc.
#
#   scripts/bench-cluster.sh [OUT] [SUBS]        (default SUBS 18000: 6,000 per node)
set -u
cd "$(dirname "$0")/.."
BIN=${SWITCHBOARD_BIN:-target/release/switchboard}
OUT=${1:-bench-results/cluster-$(date +%s)}
SUBS=${2:-18000}
mkdir -p "$OUT"
RPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no > "$OUT/redis.log" 2>&1 &
RPID=$!
PIDS=()
cleanup() { kill "${PIDS[@]}" "$RPID" 2> /dev/null; wait 2> /dev/null; }
trap cleanup EXIT
sleep 0.5
TARGETS=()
for i in 1 2 3; do
    "$BIN" serve --listen 127.0.0.1:0 --broker "redis://127.0.0.1:$RPORT/0" --node-id "n$i" > "$OUT/node$i.out" 2> "$OUT/node$i.log" &
    PIDS+=($!)
done
for i in 1 2 3; do
    for _ in $(seq 1 100); do grep -q "listening on" "$OUT/node$i.out" 2> /dev/null && break; sleep 0.1; done
    TARGETS+=("ws://127.0.0.1:$(grep -o '[0-9]*$' "$OUT/node$i.out")/ws")
done
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
declare -A C0
for p in "${PIDS[@]}" "$RPID"; do C0[$p]=$(cpu "$p"); done
"$BIN" bench broadcast --subs "$SUBS" --procs 3 --period 1 --bursts 20 --target "${TARGETS[0]}" \
    --also-target "${TARGETS[1]}" --also-target "${TARGETS[2]}" --out "$OUT/broadcast" --quiet
TCK=$(getconf CLK_TCK)
for p in "${PIDS[@]}" "$RPID"; do
    name=$([ "$p" = "$RPID" ] && echo redis-server || echo "node pid $p")
    echo "$name: $(python3 -c "print(f'{($(cpu "$p") - ${C0[$p]}) / $TCK:.2f}')") CPU s during the run"
done | tee "$OUT/cpu.txt"
