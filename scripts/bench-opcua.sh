#!/bin/bash
# OPC UA ingest through a node (docs/sources.md, "OPC UA source", "Measured"): N variables changing at HZ on
# S asyncua servers, ingested by the node's OPC UA sources, delivered to D WebSocket dashboards.
# Prints values written, ingested and delivered per second, latency (source timestamp →
# dashboard) and the node's CPU per ingested value. Bounded: DURATION s plus a warm-up.
#
#   scripts/bench-opcua.sh [POINTS] [HZ] [SERVERS] [DASHBOARDS] [DURATION]
set -eu
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/bench_opcua.py --bin target/release/switchboard \
    --points "${1:-1000}" --hz "${2:-10}" --servers "${3:-2}" --dashboards "${4:-10}" --duration "${5:-30}"
