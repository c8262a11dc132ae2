"""The Autobahn TestSuite (the fuzzingclient cases of RFC 6455) against the node's WebSocket
code, run by `kosoku`, a Python 3 runner of the Autobahn case files (nobody on the project wrote
it).

- `switchboard echo` is built from the node's handshake checks, frame reader, writer and closing,
  and echoes every message: every case of classes 1-7 and 10 must be OK, NON-STRICT or
  INFORMATIONAL.
- permessage-deflate (12.x: the default offer on five kinds of data; 13.x: offers with
  `server_no_context_takeover` and `server_max_window_bits` 9 and 15, and a list of offers),
  negotiated and echoed compressed by `switchboard echo` as on `/ws`: every case must pass,
  none UNIMPLEMENTED. Each case echoes 1,000 messages of one size, 16 B to 128 KiB, some
  fragmented; all 216 take 4.5 minutes of both cores (most of it the runner's own zlib), so
  `make test` runs every kind of data and every offer with the messages up to 16 KiB, whole and
  in 256-byte fragments, and 128 KiB messages with windows of 15 and 9 bits: 111 cases, about
  35 s. `AUTOBAHN_COMPRESSION=all` runs all 216 (docs/benchmarks.md, "WebSocket compression").
- A node's `/ws` answers text frames as commands, so the cases that expect an echoed message
  cannot pass there. Every case whose expectations hold no message at all (reserved bits and
  opcodes, bad control frames, pings, bad UTF-8, close codes and payloads) must pass there too.
  The selection comes from the cases' own expectations, as the echo run reports them.

Left out: 9.x (performance: run by hand, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import time
from collections import defaultdict

import pytest
from kosoku import FailureError, run_fuzzingclient

import sb

CLASSES = ["1", "2", "3", "4", "5", "6", "7", "10"]
# The compression cases: class → its categories (data sets, offers); each category's cases by
# message size, 1-10 whole messages of 16 B to 128 KiB, 11-18 fragmented.
COMPRESSION = {"12": 5, "13": 7}
ALL_COMPRESSION = os.environ.get("AUTOBAHN_COMPRESSION") == "all"
SMALL_SIZES = [1, 2, 3, 4, 5, 6, 7, 11, 12]  # up to 16 KiB whole, 8 and 16 KiB in 256-byte fragments
LARGE_CASES = ["12.1.10", "13.1.10", "13.3.10"]  # 128 KiB: the default offer, window 15, window 9
EXCLUDED = ["9.*"]
ACCEPTED = {"OK", "NON-STRICT", "INFORMATIONAL"}
# Cases run side by side: most of their time is spent waiting (a case's timeouts and delays).
CONCURRENCY = 16
# The compression cases keep both ends busy (the runner's zlib and the echo's); more side by
# side than the cores only adds memory.
COMPRESSION_CONCURRENCY = 4


def run_cases(url: str, cases: list[str], concurrency: int = CONCURRENCY) -> list:
    """Runs `cases` (ids or globs) against `url`; the results of every case, passed or not."""
    try:
        return asyncio.run(run_fuzzingclient(url, cases, EXCLUDED, concurrency=concurrency))
    except FailureError as failure:
        return failure.results


def case_class(result) -> str:
    return result.case_id.split(".")[0]


def acceptable(result) -> bool:
    return result.behavior.value in ACCEPTED and result.behavior_close.value in ACCEPTED


def expects_no_message(result) -> bool:
    """Whether no outcome the case accepts has a message in it (only pongs, or nothing)."""
    return all(event[0] != "message" for events in result.expected.values() for event in events)


def explain(results) -> str:
    lines = []
    for r in results:
        lines.append(
            f"{r.case_id} {r.behavior.value} / close {r.behavior_close.value}: "
            f"{' '.join(r.description.split())[:160]}\n"
            f"    expected {r.expected!r:.200}; {r.result} {r.result_close}\n"
            f"    got close {r.remote_close_code} {r.remote_close_reason!r}; received {r.received!r:.200}"
        )
    return "\n".join(lines)


def by_class(results) -> dict:
    grouped = defaultdict(list)
    for r in results:
        grouped[case_class(r)].append(r)
    return grouped


@pytest.fixture(scope="module")
def echo_url(switchboard_bin, tmp_path_factory):
    log = tmp_path_factory.mktemp("echo") / "echo.stderr.log"
    with open(log, "wb") as errf:
        proc = subprocess.Popen([switchboard_bin, "echo", "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                                stderr=errf, stdin=subprocess.DEVNULL, env=sb.server_env(),
                                preexec_fn=sb._die_with_parent)
    try:
        prefix = b"switchboard echo listening on "
        line = b""
        deadline = time.monotonic() + 10
        while not line.endswith(b"\n") and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.2)[0]:
                line += os.read(proc.stdout.fileno(), 1)
        assert line.startswith(prefix), (line, log.read_text(errors="replace")[-2000:])
        yield line[len(prefix):].decode().strip()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.fixture(scope="module")
def echo_results(echo_url) -> dict:
    return by_class(run_cases(echo_url, [f"{c}.*" for c in CLASSES]))


def compression_cases() -> list[str]:
    if ALL_COMPRESSION:
        return [f"{c}.*" for c in COMPRESSION]
    small = [f"{c}.{k}.{i}" for c, n in COMPRESSION.items() for k in range(1, n + 1) for i in SMALL_SIZES]
    return small + LARGE_CASES


def compression_count(cls: str) -> int:
    if ALL_COMPRESSION:
        return COMPRESSION[cls] * 18
    return COMPRESSION[cls] * len(SMALL_SIZES) + sum(c.startswith(cls + ".") for c in LARGE_CASES)


@pytest.fixture(scope="module")
def compression_results(echo_url) -> dict:
    return by_class(run_cases(echo_url, compression_cases(), COMPRESSION_CONCURRENCY))


@pytest.fixture(scope="module")
def ws_results(echo_results, switchboard_bin, tmp_path_factory) -> dict:
    selected = [r.case_id for results in echo_results.values() for r in results if expects_no_message(r)]
    node = sb.start_server(switchboard_bin, [], str(tmp_path_factory.mktemp("node") / "node.stderr.log"))
    try:
        results = by_class(run_cases(node.ws_url, selected))
        assert sum(map(len, results.values())) == len(selected), "a selected case did not run"
        return results
    finally:
        node.kill()


@pytest.mark.parametrize("cls", CLASSES)
def test_autobahn_echo_passes_every_case_of_the_class(echo_results, cls):
    results = echo_results.get(cls, [])
    assert results, f"no case of class {cls} ran"
    failing = [r for r in results if not acceptable(r)]
    assert not failing, f"{len(failing)} of {len(results)} cases of class {cls} fail:\n{explain(failing)}"


@pytest.mark.timeout(900 if ALL_COMPRESSION else 180)
@pytest.mark.parametrize("cls", sorted(COMPRESSION))
def test_autobahn_echo_passes_every_compression_case(compression_results, cls):
    results = compression_results.get(cls, [])
    assert len(results) == compression_count(cls), f"{len(results)} cases of class {cls} ran"
    failing = [r for r in results if not acceptable(r)]
    assert not failing, f"{len(failing)} of {len(results)} cases of class {cls} fail:\n{explain(failing)}"


@pytest.mark.parametrize("cls", ["2", "3", "4", "5", "6", "7"])
def test_autobahn_ws_passes_every_case_that_expects_no_echo(ws_results, cls):
    results = ws_results.get(cls, [])
    assert results, f"no case of class {cls} expects only a close or pongs"
    failing = [r for r in results if not acceptable(r)]
    assert not failing, f"{len(failing)} of {len(results)} cases of class {cls} fail on /ws:\n{explain(failing)}"
