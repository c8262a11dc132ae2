#!/usr/bin/env bash
# The Python client end to end: a node, a publisher and a subscriber, through a node restart.
#
#   pip install ./clients/python && examples/python/run.sh
#   (SB=target/release/switchboard PORT=8700 PYTHON=python3 override the defaults)
#
# The subscriber (subscriber.py) prints each publication of pt:boiler.temp and room:ops; the
# publisher (publisher.py) feeds the point over the HTTP API and posts to the room as a client.
# Between two rounds the node restarts, losing its in-memory channels (a new epoch); the
# subscriber reconnects by itself and prints the second round, the point's value marked as
# following a gap. Prints what the subscriber printed; exits 0 once it saw the second round.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../node.sh"
PYTHON=${PYTHON:-python3}
node="127.0.0.1:$PORT"

start_node
"$PYTHON" "$here/subscriber.py" "$node" >"$work/sub.out" 2>"$work/sub.err" &
pids+=($!)
wait_for "the subscriber" in_file "$work/sub.out" "subscribed"

"$PYTHON" "$here/publisher.py" 71.5 first "$node"
wait_for "the first round" in_file "$work/sub.out" "{'text': 'first'}"
wait_for "the first reading" in_file "$work/sub.out" "'v': 71.5"

echo "restarting the node"
restart_node
"$PYTHON" "$here/publisher.py" 72.25 second "$node"
wait_for "the second round" in_file "$work/sub.out" "{'text': 'second'}"
wait_for "the second reading" in_file "$work/sub.out" "'v': 72.25"

echo "--- subscriber output:"
cat "$work/sub.out"
