#!/usr/bin/env bash
# The TypeScript SDK end to end: a node, a subscriber on the SDK, and publications over the
# HTTP API, through a node restart.
#
#   make web-build && examples/typescript/run.sh
#   (SB=target/release/switchboard PORT=8700 NODE=node override the defaults)
#
# The subscriber (subscriber.mjs, Node 20 or later, with the SDK from web/sdk/dist and `ws`
# from web/node_modules) prints each publication of pt:boiler.temp and room:ops; this script
# publishes to both with `POST /api/publish`. Between two rounds the node restarts, losing its
# in-memory channels (a new epoch); the subscriber reconnects by itself, reports the gaps and
# prints the second round. Prints what the subscriber printed; exits 0 once it saw the second
# round.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../node.sh"
NODE=${NODE:-node}
repo=$(cd "$here/../.." && pwd)
for f in web/sdk/dist/index.js web/node_modules/ws/package.json; do
    [ -f "$repo/$f" ] || { echo "$f is missing: run \`make web-build\` first" >&2; exit 1; }
done

# publish CHANNEL JSON: one publication over the HTTP API (as a server-side publisher would:
# clients may not publish to point channels).
publish() {
    curl -sf -H 'Content-Type: application/json' -d "{\"channel\": \"$1\", \"data\": $2}" \
        "$NODE_URL/api/publish"
    echo
}

start_node
"$NODE" "$here/subscriber.mjs" "127.0.0.1:$PORT" >"$work/sub.out" 2>"$work/sub.err" &
pids+=($!)
wait_for "the subscriber" in_file "$work/sub.out" "subscribed"

publish pt:boiler.temp '{"v": 71.5, "q": "good"}'
publish room:ops '{"text": "first"}'
wait_for "the first round" in_file "$work/sub.out" '{"text":"first"}'
wait_for "the first reading" in_file "$work/sub.out" '"v":71.5'

echo "restarting the node"
restart_node
publish pt:boiler.temp '{"v": 72.25, "q": "good"}'
publish room:ops '{"text": "second"}'
wait_for "the second round" in_file "$work/sub.out" '{"text":"second"}'
wait_for "the second reading" in_file "$work/sub.out" '"v":72.25'

echo "--- subscriber output:"
cat "$work/sub.out"
echo "--- subscriber stderr:"
cat "$work/sub.err"
