# Helpers the examples' run.sh scripts source: a node on 127.0.0.1:$PORT that can be restarted,
# bounded waits, and cleanup of every process they started (by its PID) when the script exits.
#   SB     the switchboard binary (default: `switchboard` on PATH)
#   PORT   the node's port (default: 8700)
# Each run.sh exits 0 only when its subscriber printed what was published after the restart.
# KEEP=1 keeps $work (the node's log, the subscriber's output) for a look afterwards.

SB=${SB:-switchboard}
PORT=${PORT:-8700}
NODE_URL="http://127.0.0.1:$PORT"
work=$(mktemp -d)
node_pid=
pids=()

cleanup() {
    local rc=$? p f
    if [ "$rc" != 0 ]; then  # what the processes said, for whoever reads the failure
        for f in "$work"/*.out "$work"/*.err "$work"/node.log; do
            [ -f "$f" ] && { echo "--- ${f##*/} (tail)"; tail -n 20 "$f"; }
        done >&2
    fi
    for p in "${pids[@]}" $node_pid; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}" $node_pid; do wait "$p" 2>/dev/null || true; done
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# wait_for WHAT COMMAND...: runs COMMAND every 0.1 s until it succeeds; fails after 20 s.
wait_for() {
    local what=$1 i
    shift
    for ((i = 0; i < 200; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "timed out waiting for $what" >&2
    return 1
}

# Starts the node (in-memory broker, data directory under $work) and waits until it answers.
start_node() {
    "$SB" serve --listen "127.0.0.1:$PORT" --data-dir "$work/data" >>"$work/node.log" 2>&1 &
    node_pid=$!
    wait_for "the node on $NODE_URL" curl -sf -o /dev/null "$NODE_URL/readyz"
}

# Stops the node gracefully (its clients are told to reconnect: close code 4000).
stop_node() {
    kill "$node_pid"
    wait "$node_pid" || true
    node_pid=
}

restart_node() {
    stop_node
    start_node
}

# in_file FILE TEXT: whether FILE has a line containing TEXT.
in_file() {
    grep -qF -- "$2" "$1"
}
