#!/usr/bin/env python3
"""Prints the figures of every result folder under a bench-seeds.sh output directory:
one block per experiment with the SPEC section 8 fields and the scenario's scalar extras."""
import json
import pathlib
import sys


def scalars(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            yield prefix + k, v
        elif isinstance(v, dict) and len(v) <= 12:
            yield from scalars(v, prefix + k + ".")


def main(root):
    for res in sorted(pathlib.Path(root).glob("*/result.json")):
        r = json.loads(res.read_text())
        c, m, lat, srv = r["connections"], r["messages"], r["latency_ms"], r.get("server") or {}
        print(f"## {res.parent.name}  ({r['scenario']}, pass={r['pass']}, {r['duration_s']:.1f} s)")
        print(f"   params {json.dumps(r['params'])}")
        print(f"   conns {c['established']}/{c['target']} failed {c['failed']}; msgs sent {m['sent']} "
              f"expected {m['expected']} received {m['received']} lost {m['lost']} dup {m['duplicated']}; "
              f"deliveries/s {r['throughput']['deliveries_per_s']:.0f}")
        print("   latency ms " + " ".join(f"{k} {lat[k]:.2f}" for k in ("p50", "p90", "p99", "p999", "max", "mean", "stdev")
                                           if lat.get(k) is not None))
        print(f"   server {json.dumps(srv)}")
        extra = dict(x for x in scalars(r.get("extra") or {}) if not x[0].startswith(("errors", "bursts")))
        print("   extra " + json.dumps(extra))
        if r["criteria"]:
            bad = [c for c in r["criteria"] if not c.get("ok", True)]
            if bad:
                print("   FAILED " + json.dumps(bad))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench-results")
