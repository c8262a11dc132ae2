#!/bin/bash
# The soak of docs/benchmarks.md: one fresh gateway node (memory broker, or one fresh
# redis-server) under `switchboard bench soak` with its default load — 2,000 held subscribers
# of a 1,000-point feed at 1 Hz, 1,000 new room channels a second published once and abandoned,
# 50 connections a second opened and closed — sampling RSS and channel counts every 10 s.
# Room channels are kept ROOM_TTL seconds (default 90) and point trends reach back TREND_S
# seconds (default 120) so that a steady state is reached within the warm-up; everything else
# is the node's default configuration. The redis-server runs with `hz 50` (Redis's own setting
# for how often it reclaims expired keys; DBSIZE counts expired keys until reclaimed).
#
#   scripts/bench-soak.sh OUT memory|redis [DURATION] [WARMUP]
set -u
cd "$(dirname "$0")/.."
BIN=${SWITCHBOARD_BIN:-target/release/switchboard}
OUT=${1:?out directory}
BROKER=${2:-memory}
DURATION=${3:-30m}
WARMUP=${4:-5m}
ROOM_TTL=${ROOM_TTL:-90}
TREND_S=${TREND_S:-120}
mkdir -p "$OUT"
cat > "$OUT/switchboard.toml" <<TOML
[namespaces.pt]
history_size = 0
conflate = true
channel_ttl_s = 0
trend_window_s = $TREND_S

[namespaces.room]
client_publish = true
presence = true
channel_ttl_s = $ROOM_TTL
TOML
. scripts/loopback.sh
redis_args=()
RPID=
if [ "$BROKER" = redis ]; then
    RPORT=$(spare)
    redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --hz 50 > "$OUT/redis.log" 2>&1 &
    RPID=$!
    for _ in $(seq 1 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
    BROKER_URL="redis://127.0.0.1:$RPORT/0"
    redis_args=(--redis "$BROKER_URL")
else
    BROKER_URL=memory
fi
PORT=$(spare)
env -u SWITCHBOARD_BIN "$BIN" serve --config "$OUT/switchboard.toml" --listen "127.0.0.1:$PORT" \
    --broker "$BROKER_URL" > "$OUT/server.out" 2> "$OUT/server.log" &
SPID=$!
wait_ready "$PORT"
"$BIN" bench soak --target "ws://127.0.0.1:$PORT/ws" --duration "$DURATION" --warmup "$WARMUP" \
    --server-pid "$SPID" "${redis_args[@]}" --out "$OUT" --quiet
status=$?
kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null
[ -n "$RPID" ] && { kill "$RPID" 2>/dev/null; wait "$RPID" 2>/dev/null; }
exit $status
