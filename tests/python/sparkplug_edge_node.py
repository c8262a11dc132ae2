"""A Sparkplug B edge node made of pysparkplug's own `EdgeNode` and MQTT client, for
test_sparkplug_edge_node.py. pysparkplug 0.6.1 pins paho-mqtt 1, which the other tests outgrew,
so this runs in a virtualenv of its own (`.venv-sparkplug`, `make py-deps`).

It births the metric `Temp` and then takes a value every PERIOD seconds, stamped with its own
time. While the primary host application HOST says it is online (`spBv1.0/STATE/HOST`, as
pysparkplug decodes it) each value goes out at once as NDATA; while it says it is offline the
values are kept (store and forward), and once it is online again they go out, oldest first, as
`is_historical` metrics in one NDATA before the next live value. One JSON line per event on
stdout: `{"state": bool, "at": unix s}`, `{"live": [v, t]}`, `{"historical": [[v, t], ...]}`.
After SECONDS it disconnects cleanly and says `{"done": true}`.

    python sparkplug_edge_node.py PORT GROUP NODE HOST SECONDS [PERIOD]
"""

import json
import sys
import threading
import time

import pysparkplug as spb


def say(**event) -> None:
    print(json.dumps(event), flush=True)


def metric(v: float, t: int, historical: bool = False) -> spb.Metric:
    return spb.Metric(timestamp=t, name="Temp", datatype=spb.DataType.DOUBLE, value=v, is_historical=historical)


def main() -> None:
    port, group, node, host, seconds = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
    period = float(sys.argv[6]) if len(sys.argv) > 6 else 0.1
    online = threading.Event()
    edge = spb.EdgeNode(group, node, [metric(0.0, spb.get_current_timestamp())])

    def on_state(_edge: spb.EdgeNode, message: spb.Message) -> None:
        up = bool(message.payload.online)
        say(state=up, at=time.time())
        if up:
            online.set()
        else:
            online.clear()

    state = spb.Topic(message_type=spb.MessageType.STATE, sparkplug_host_id=host)
    edge.subscribe(state, spb.QoS.AT_LEAST_ONCE, on_state)
    edge.connect("127.0.0.1", port=port, blocking=False)
    kept: list[tuple[float, int]] = []
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        i += 1
        v, t = float(i), spb.get_current_timestamp()
        if online.is_set():
            if kept:
                edge.update([metric(kv, kt, historical=True) for kv, kt in kept])
                say(historical=kept)
                kept = []
            edge.update([metric(v, t)])
            say(live=[v, t])
        else:
            kept.append((v, t))
        time.sleep(period)
    edge.disconnect()
    say(done=True, kept=len(kept))


if __name__ == "__main__":
    main()
