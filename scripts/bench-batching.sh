#!/bin/bash
# Many updates per connection: 1,000 simulated points at 10 Hz, N subscribers of all of them.
set -u
N=${1:-20}
BIN=${SWITCHBOARD_BIN:-$(dirname "$0")/../target/release/switchboard}
$BIN serve --listen 127.0.0.1:0 --simulate 1000@10 > /tmp/bt.out 2>/dev/null & SPID=$!
sleep 0.5
PORT=$(grep -o '[0-9]*$' /tmp/bt.out)
CH=$(seq 0 999 | sed 's/^/pt:sim./' | tr '\n' ' ')
PIDS=""
for i in $(seq 1 $N); do $BIN sub $CH --url ws://127.0.0.1:$PORT/ws > /dev/null & PIDS="$PIDS $!"; done
sleep 3
cpu() { awk '{print $14+$15}' /proc/$SPID/stat; }
msgs() { curl -s localhost:$PORT/metrics | awk '/^switchboard_messages_out_total/{print $2}'; }
writes() { curl -s localhost:$PORT/metrics | awk '/^switchboard_socket_writes_total/{print $2}'; }
c0=$(cpu); m0=$(msgs); w0=$(writes); sleep 10; c1=$(cpu); m1=$(msgs); w1=$(writes)
TCK=$(getconf CLK_TCK)
python3 -c "
c=($c1-$c0)/$TCK; m=$m1-$m0; w=$w1-$w0
print(f'subscribers $N x 1000 points @10 Hz: deliveries/s {m/10:.0f}, writes/s {w/10:.0f}, msgs per write {m/max(w,1):.1f}, server cpu {c:.2f} s over 10 s, cpu per delivery {c*1e6/max(m,1):.3f} us')"
kill $PIDS $SPID
