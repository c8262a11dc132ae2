# Sourced by the bench scripts: a spare loopback port, and the wait for a node on one.
#
#   cd "$(dirname "$0")/.."; . scripts/loopback.sh

# Prints a TCP port of 127.0.0.1 that nothing listens on now.
spare() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits up to 10 s for the node on 127.0.0.1:$1 to answer /readyz (the run goes on either way:
# a node that never became ready fails the bench that follows, which says so).
wait_ready() {
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$1/readyz" >/dev/null && return 0; sleep 0.1; done
    return 0
}
