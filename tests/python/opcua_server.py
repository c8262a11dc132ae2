"""A real OPC UA server for the OPC UA source's tests, built on the third-party `asyncua` package.

    .venv/bin/python tests/python/opcua_server.py --port 4840 [--host 127.0.0.1]
        [--cert server.der --key server.pem] [--points 1000 --hz 10] [--blob] [--mute] [--history]

Address space (namespace `urn:switchboard:test`, its index is printed at start):

    Objects/Plant/Line1/Temp      Double, 20 + 5·sin(t), written every 100 ms (source timestamp)
    Objects/Plant/Line1/Running   Boolean, toggles every 2 s
    Objects/Plant/Line1/Mode      String "auto"
    Objects/Plant/Line1/Level     Double 42.5 with status UncertainLastUsableValue
    Objects/Plant/Line1/Setpoint  Float 50.0, writable
    Objects/Plant/Line1/Count     Int32 7, writable
    Objects/Plant/Line1/Serial    String "SN-0001", read-only
    Objects/Plant/Bench/P0000...  (--points N) Double, all written at --hz
    Objects/Plant/Line1/BlobSize  (--blob) Int32 16, writable: writing N sets Blob and BlobBytes
    Objects/Plant/Line1/Blob      (--blob) String of BlobSize bytes ("x" repeated)
    Objects/Plant/Line1/BlobBytes (--blob) ByteString of BlobSize bytes
    Objects/Plant/Line1/Flow      (--history) Double, 10 + tick % 10, written every 100 ms, no history

With --history the server keeps the history of Temp (the last 10 minutes, in memory) and
answers HistoryRead for it; the other variables, Flow among them, keep none.

With --mute the server accepts sessions, subscriptions and monitored items but never sends a
data change (keep-alives only): a server that goes away before its first notification.

Node ids are strings named after the path below Plant: `ns=<idx>;s=Line1.Temp`. The server listens
on --host (a loopback address: a test proxy may then listen on 127.0.0.1 at the same port, so
the endpoint the server advertises, with its host replaced by the client's, leads through it). With --cert and
--key the server offers Basic256Sha256 SignAndEncrypt beside None. It prints one line
`ready <port> <namespace index>` on stdout once it listens, and runs until killed; with
--points, `wrote <values> in <seconds>` every 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import time
from datetime import datetime, timedelta, timezone

from asyncua import Server, ua

NAMESPACE = "urn:switchboard:test"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ap.add_argument("--cert", help="server certificate (DER) for Basic256Sha256")
    ap.add_argument("--key", help="server private key (PEM) for Basic256Sha256")
    ap.add_argument("--points", type=int, default=0, help="extra Double variables under Plant/Bench")
    ap.add_argument("--hz", type=float, default=10.0, help="update rate of the --points variables")
    ap.add_argument("--blob", action="store_true", help="add Blob, BlobBytes and BlobSize to Line1")
    ap.add_argument("--mute", action="store_true", help="never send data changes")
    ap.add_argument("--history", action="store_true", help="keep the history of Temp")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.mute:
        from asyncua.server.internal_subscription import InternalSubscription

        def drop_datachanges(self, result) -> None:
            # Queued data changes are discarded instead of going into the publish response.
            self._triggered_datachanges = {}

        InternalSubscription._pop_triggered_datachanges = drop_datachanges

    server = Server()
    await server.init()
    server.set_endpoint(f"opc.tcp://{args.host}:{args.port}/switchboard/")
    server.set_server_name("Switchboard test server")
    await server.set_application_uri("urn:switchboard:test-server")
    if args.cert:
        await server.load_certificate(args.cert)
        await server.load_private_key(args.key)
        server.set_security_policy([
            ua.SecurityPolicyType.NoSecurity,
            ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
        ])
    else:
        server.set_security_policy([ua.SecurityPolicyType.NoSecurity])

    idx = await server.register_namespace(NAMESPACE)
    plant = await server.nodes.objects.add_object(ua.NodeId("Plant", idx), ua.QualifiedName("Plant", idx))
    line = await plant.add_object(ua.NodeId("Line1", idx), ua.QualifiedName("Line1", idx))

    async def var(name: str, value, vtype: ua.VariantType):
        return await line.add_variable(ua.NodeId(f"Line1.{name}", idx), ua.QualifiedName(name, idx),
                                       ua.Variant(value, vtype))

    temp = await var("Temp", 20.0, ua.VariantType.Double)
    running = await var("Running", True, ua.VariantType.Boolean)
    await var("Mode", "auto", ua.VariantType.String)
    level = await var("Level", 42.5, ua.VariantType.Double)
    setpoint = await var("Setpoint", 50.0, ua.VariantType.Float)
    count = await var("Count", 7, ua.VariantType.Int32)
    await var("Serial", "SN-0001", ua.VariantType.String)
    await setpoint.set_writable()
    await count.set_writable()
    flow = await var("Flow", 10.0, ua.VariantType.Double) if args.history else None
    blob = blob_bytes = blob_size = None
    blob_len = 16
    if args.blob:
        blob_size = await var("BlobSize", blob_len, ua.VariantType.Int32)
        blob = await var("Blob", "x" * blob_len, ua.VariantType.String)
        blob_bytes = await var("BlobBytes", b"x" * blob_len, ua.VariantType.ByteString)
        await blob_size.set_writable()

    bench = []
    if args.points:
        folder = await plant.add_object(ua.NodeId("Bench", idx), ua.QualifiedName("Bench", idx))
        for i in range(args.points):
            name = f"P{i:04d}"
            bench.append(await folder.add_variable(ua.NodeId(f"Bench.{name}", idx),
                                                   ua.QualifiedName(name, idx),
                                                   ua.Variant(0.0, ua.VariantType.Double)))

    def dv(value, vtype, status=ua.StatusCodes.Good) -> ua.DataValue:
        now = datetime.now(timezone.utc)
        return ua.DataValue(ua.Variant(value, vtype), StatusCode=ua.StatusCode(status),
                            SourceTimestamp=now, ServerTimestamp=now)

    async def bench_loop() -> None:
        # Every --points variable once per 1/--hz s, on a schedule; when a round takes longer
        # than the period the next starts at once (the offered rate is then what it managed).
        # Every 5 s a line `wrote <values> in <seconds>` goes to stdout.
        period = 1.0 / args.hz if args.hz > 0 else 1.0
        next_round = time.monotonic()
        window_start, written, rounds = time.monotonic(), 0, 0
        while True:
            rounds += 1
            for i, node in enumerate(bench):
                # Server-side writes straight into the address space.
                await server.write_attribute_value(node.nodeid, dv(float(rounds + i), ua.VariantType.Double))
            written += len(bench)
            now = time.monotonic()
            if now - window_start >= 5.0:
                print(f"wrote {written} in {now - window_start:.2f}", flush=True)
                window_start, written = now, 0
            next_round += period
            if next_round > now:
                await asyncio.sleep(next_round - now)
            else:
                next_round = now
                await asyncio.sleep(0)

    async with server:
        if args.history:
            await server.historize_node_data_change(temp, period=timedelta(minutes=10))
        await level.write_value(dv(42.5, ua.VariantType.Double, ua.StatusCodes.UncertainLastUsableValue))
        print(f"ready {args.port} {idx}", flush=True)
        # Held in a variable: the event loop keeps only a weak reference to tasks.
        bench_task = asyncio.create_task(bench_loop()) if bench else None
        tick = 0
        while True:
            await asyncio.sleep(0.1)
            tick += 1
            await temp.write_value(dv(20.0 + 5.0 * math.sin(tick / 10.0), ua.VariantType.Double))
            if flow is not None:
                await flow.write_value(dv(10.0 + tick % 10, ua.VariantType.Double))
            if tick % 20 == 0:
                await running.write_value(dv(tick % 40 == 0, ua.VariantType.Boolean))
            if blob_size is not None:
                wanted = await blob_size.read_value()
                if wanted != blob_len and 0 <= wanted <= 64 << 20:
                    blob_len = wanted
                    await blob.write_value(dv("x" * blob_len, ua.VariantType.String))
                    await blob_bytes.write_value(dv(b"x" * blob_len, ua.VariantType.ByteString))
            if bench_task is not None and bench_task.done():
                bench_task.result()  # raise what stopped it


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
