#!/usr/bin/env bash
# The command line end to end: `switchboard serve`, `switchboard publish` and `switchboard sub`,
# through a node restart.
#
#   examples/cli/run.sh        (SB=target/release/switchboard PORT=8700 override the defaults)
#
# `sub` prints each publication of pt:boiler.temp and room:ops as a JSON line (and on stderr
# what it does about connections and gaps); `publish` feeds both over the HTTP API. Between two
# rounds the node restarts, losing its in-memory channels (a new epoch); `sub` reconnects by
# itself and prints the second round. Prints what `sub` printed; exits 0 once it saw the second
# round.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../node.sh"

start_node
"$SB" sub pt:boiler.temp room:ops --initial --url "$NODE_URL" >"$work/sub.out" 2>"$work/sub.err" &
pids+=($!)

# With --initial, `sub` prints each channel's latest value first: nothing is missed if these
# go out before it subscribed.
"$SB" publish pt:boiler.temp '{"v": 71.5, "q": "good"}' --url "$NODE_URL"
"$SB" publish room:ops '{"text": "first"}' --url "$NODE_URL"
wait_for "the first round" in_file "$work/sub.out" '"text":"first"'
wait_for "the first reading" in_file "$work/sub.out" '"v":71.5'

echo "restarting the node"
restart_node
"$SB" publish pt:boiler.temp '{"v": 72.25, "q": "good"}' --url "$NODE_URL"
"$SB" publish room:ops '{"text": "second"}' --url "$NODE_URL"
wait_for "the second round" in_file "$work/sub.out" '"text":"second"'
wait_for "the second reading" in_file "$work/sub.out" '"v":72.25'

echo "--- subscriber output:"
cat "$work/sub.out"
echo "--- subscriber stderr:"
cat "$work/sub.err"
