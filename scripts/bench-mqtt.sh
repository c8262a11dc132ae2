#!/bin/bash
# MQTT ingest against the HTTP batch path (docs/benchmarks.md, "MQTT ingest"): K topics at HZ
# published to a real mosquitto, ingested by the node's MQTT source, delivered to D WebSocket
# dashboards; then the same points as HTTP batch publishes. Prints latency (publish → dashboard)
# and the node's CPU per ingested point for each. Bounded: DURATION s per mode.
#
#   scripts/bench-mqtt.sh [TOPICS] [HZ] [DASHBOARDS] [DURATION]
set -eu
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/bench_mqtt.py --bin target/release/switchboard \
    --topics "${1:-10000}" --hz "${2:-1}" --dashboards "${3:-100}" --duration "${4:-20}"
