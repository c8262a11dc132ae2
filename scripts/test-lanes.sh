#!/usr/bin/env bash
# The suites of `make test`, once the binaries they start are built (the Makefile builds them
# first). The suites mostly wait on sockets and child processes, so they run in two lanes side
# by side on the machine's two cores:
#   lane 1: the Python, Node and SDK suites, printed as they run;
#   lane 2: the Rust tests' build, then the Rust tests with the fuzz targets' build beside
#           them, then the browser suite; printed when the lane ends. Its builds run niced, so
#           that the suites of lane 1 keep the cores whenever they need them.
# The two take about as long (6.5 and 7.5 minutes on a 2-core machine).
# Both lanes always run to their end; the script fails if either failed, naming it.
set -uo pipefail
cd "$(dirname "$0")/.."

MAKE=${MAKE:-make}
logs=target/test-lanes
mkdir -p "$logs"

lane2() {
    nice -n 19 "$MAKE" --no-print-directory rust-build || return 1
    nice -n 19 "$MAKE" --no-print-directory fuzz-build >"$logs/fuzz.log" 2>&1 &
    local fuzz=$! rc=0
    "$MAKE" --no-print-directory rust-run || rc=1
    wait "$fuzz" || { echo "fuzz build failed:"; rc=1; }
    cat "$logs/fuzz.log"
    "$MAKE" --no-print-directory browser-run || rc=1
    return $rc
}

minutes() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# Lane 2 in its own process group, so that an interrupted run stops all of it.
set -m
started=$SECONDS
(lane2; echo $? >"$logs/rust.rc"; echo $((SECONDS - started)) >"$logs/rust.s") >"$logs/rust.log" 2>&1 &
lane2_pid=$!
set +m
trap 'kill -- -"$lane2_pid" 2>/dev/null' INT TERM

"$MAKE" --no-print-directory python-run node-run web-run
lane1=$?
lane1_s=$((SECONDS - started))

wait "$lane2_pid"
trap - INT TERM
echo "---- lane 2: Rust tests, fuzz build, browser ----"
cat "$logs/rust.log"
lane2=$(cat "$logs/rust.rc" 2>/dev/null || echo 1)
echo "lane 1 (Python, Node, SDK): $(minutes $lane1_s), $([ $lane1 = 0 ] && echo passed || echo FAILED)"
echo "lane 2 (Rust tests, fuzz build, browser): $(minutes "$(cat "$logs/rust.s" 2>/dev/null || echo 0)"), $([ "$lane2" = 0 ] && echo passed || echo FAILED)"
[ "$lane1" = 0 ] && [ "$lane2" = 0 ]
