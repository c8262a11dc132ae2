#!/bin/bash
# One gateway node on each broker topology under the same stream load: U users each subscribed
# to the same K channels, the publisher sending all K at F Hz through POST /api/publish batches
# of 1,000. Reports the gateway's and every redis-server's CPU per publication (from /proc)
# beside the bench's delivery latency, one fresh server (and fresh Redis) per run.
#
#   scripts/bench-redis.sh [OUT] [TOPOLOGIES] [U] [K] [F] [DURATION]
#   TOPOLOGIES: comma list of memory, redis, shards3, cluster3 (default all four; cluster3 is a
#   Redis Cluster of three primaries without replicas, formed with redis-cli --cluster create)
#
# Each topology runs twice, for 1/4 of DURATION and for DURATION: the difference between the
# two runs' CPU over the difference of their publications is the cost of a publication in the
# steady state, without the subscribe phase (10 × 5,000 initial-value reads) that both share.
#
# SEARCH=MAX instead runs `bench streams --search --search-max MAX` once per topology (K is
# the first step, doubled until a run fails, then bisected) and reports the largest
# publications/s each sustained with every tick on time and p99 ≤ 100 ms.
set -u
cd "$(dirname "$0")/.."
BIN=${SWITCHBOARD_BIN:-target/release/switchboard}
OUT=${1:-bench-results/redis-$(date +%s)}
TOPOLOGIES=${2:-memory,redis,shards3,cluster3}
U=${3:-10}
K=${4:-5000}
F=${5:-2}
DURATION=${6:-20}
mkdir -p "$OUT"
TCK=$(getconf CLK_TCK)
. scripts/loopback.sh
# A port P with P + 10000 (the cluster bus) free too.
spare_bus() {
    python3 -c '
import random, socket
while True:
    p = random.randint(20000, 50000)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError:
        pass'
}
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }

run() {
    local name=$1 nshards=$2 DURATION=$3 cluster=${4:-}
    local rpids=() urls=() ports=()
    for _ in $(seq 1 "$nshards"); do
        local p extra=()
        if [ -n "$cluster" ]; then
            p=$(spare_bus)
            mkdir -p "$OUT/$name-node-$p"
            extra=(--cluster-enabled yes --cluster-config-file "$OUT/$name-node-$p/nodes.conf")
        else
            p=$(spare)
        fi
        redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no "${extra[@]}" > "$OUT/$name-redis-$p.log" 2>&1 &
        rpids+=($!)
        ports+=("$p")
        urls+=("redis://127.0.0.1:$p/0")
    done
    local broker=memory
    if [ "$nshards" -gt 0 ]; then
        broker=$(IFS=,; echo "${urls[*]}")
        sleep 0.5
    fi
    if [ -n "$cluster" ]; then
        redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-yes > "$OUT/$name-create.log" 2>&1
        for _ in $(seq 1 100); do
            redis-cli -p "${ports[0]}" cluster info 2> /dev/null | grep -q 'cluster_state:ok' && break
            sleep 0.2
        done
        broker="redis+cluster://127.0.0.1:${ports[0]}"
    fi
    "$BIN" serve --listen 127.0.0.1:0 --broker "$broker" > "$OUT/$name-node.out" 2> "$OUT/$name-node.log" &
    local spid=$!
    for _ in $(seq 1 100); do grep -q "listening on" "$OUT/$name-node.out" 2> /dev/null && break; sleep 0.1; done
    local port
    port=$(grep -o '[0-9]*$' "$OUT/$name-node.out" | head -1)
    declare -A c0
    for p in "${rpids[@]}"; do c0[$p]=$(cpu "$p"); done
    local search=()
    [ -n "${SEARCH:-}" ] && search=(--search --search-max "$SEARCH" --search-refine 2)
    "$BIN" bench streams --target "ws://127.0.0.1:$port/ws" --users "$U" --points "$K" --hz "$F" \
        --duration "$DURATION" --server-pid "$spid" --out "$OUT/$name" --quiet "${search[@]}"
    local rc=$?
    local pubs rcpu=()
    pubs=$(python3 -c "import json; print(json.load(open('$OUT/$name/result.json'))['messages']['sent'])")
    for p in "${rpids[@]}"; do rcpu+=("$(python3 -c "print(($(cpu "$p") - ${c0[$p]}) / $TCK)")"); done
    # name pubs gateway-cpu redis-cpu... ; latency and pass from the result
    python3 - "$OUT/$name/result.json" "$pubs" "$rc" "${rcpu[@]}" << 'PY' > "$OUT/$name.row"
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({"pubs": int(sys.argv[2]), "rc": int(sys.argv[3]), "gateway": r["server"]["cpu_s"] or 0,
                  "redis": [float(x) for x in sys.argv[4:]], "p50": r["latency_ms"]["p50"],
                  "p99": r["latency_ms"]["p99"], "pass": r["pass"]}))
PY
    for u in "${urls[@]}"; do p=${u#redis://127.0.0.1:}; redis-cli -p "${p%/0}" INFO commandstats > "$OUT/$name-commandstats-${p%/0}.txt" 2>&1; done
    kill "$spid" 2> /dev/null
    wait "$spid" 2> /dev/null
    for p in "${rpids[@]}"; do kill "$p" 2> /dev/null; wait "$p" 2> /dev/null; done
}

IFS=, read -ra LIST <<< "$TOPOLOGIES"
SHORT=$(python3 -c "print(max(2, $DURATION / 4))")
for t in "${LIST[@]}"; do
    case $t in
        memory) n=0 ;;
        redis) n=1 ;;
        shards3) n=3 ;;
        cluster3) n=3 ;;
        *) echo "unknown topology $t" >&2; exit 2 ;;
    esac
    c=""
    [ "$t" = cluster3 ] && c=yes
    if [ -n "${SEARCH:-}" ]; then
        run "$t" "$n" "$DURATION" "$c"
        python3 - "$OUT/$t/result.json" "$t" << 'PY' | tee -a "$OUT/summary.txt"
import json, sys
s = json.load(open(sys.argv[1]))["extra"]["search"]
steps = ", ".join(f"{x['publications_per_s']:.0f}/s {'pass' if x['pass'] else 'FAIL'} (p99 {x.get('p99_ms') or 0:.0f} ms, {x.get('ticks_late', '-')} late)" for x in s["steps"])
print(f"{sys.argv[2]}: largest sustained {s['largest_passing_publications_per_s']} publications/s; steps: {steps}")
PY
        continue
    fi
    run "$t-short" "$n" "$SHORT" "$c"
    run "$t" "$n" "$DURATION" "$c"
    python3 - "$OUT/$t-short.row" "$OUT/$t.row" "$t" << 'PY' | tee -a "$OUT/summary.txt"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
d = b["pubs"] - a["pubs"]
per = lambda x, y: f"{(y - x) / d * 1e6:.2f} µs" if d > 0 else "-"
shares = " / ".join(f"{(y - x) / (sum(b['redis']) - sum(a['redis'])) * 100:.0f}%"
                    for x, y in zip(a["redis"], b["redis"])) if b["redis"] else "-"
print(f"{sys.argv[3]}: per publication (steady state, {d} publications between the runs): "
      f"gateway {per(a['gateway'], b['gateway'])}, redis total {per(sum(a['redis']), sum(b['redis']))} "
      f"(split {shares}); long run p50 {b['p50']:.1f} ms p99 {b['p99']:.1f} ms, pass {b['pass']} (exit {b['rc']})")
PY
done
