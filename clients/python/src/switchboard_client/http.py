"""The node's HTTP API for what has no WebSocket command of its own: a channel's trend
(`GET /api/channels/{ch}/trend`). Requests run on a worker thread with the standard library, so
the package depends on `websockets` alone.
"""

from __future__ import annotations

import asyncio
import json
import ssl as ssl_module
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .errors import ConnectError, reply_error
from .types import Bucket, Tier, Trend


def http_base(ws_url: str) -> str:
    """`ws://host:port/ws` → `http://host:port` (`wss` → `https`; a path prefix before `/ws`
    is kept, for nodes behind a proxy that mounts them under one)."""
    parts = urllib.parse.urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    if path.endswith("/ws"):
        path = path[: -len("/ws")]
    return urllib.parse.urlunsplit((scheme, parts.netloc, path, "", ""))


def get_json(url: str, headers: dict[str, str], timeout: float,
             ssl: ssl_module.SSLContext | None = None) -> Any:
    """GET `url`; the JSON body, or the typed error of an `{"error": {"code", "message"}}`
    body (or of the bare status)."""
    req = urllib.request.Request(url, headers={"Accept": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ssl) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            body = json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):
            body = {"code": e.code, "message": raw.decode("utf-8", "replace")[:300] or str(e.reason)}
        raise reply_error(body) from None
    except (urllib.error.URLError, OSError) as e:
        raise ConnectError(f"{url}: {e}") from None


async def fetch_trend(base: str, channel: str, window_s: int, step_s: int | None,
                      headers: dict[str, str], timeout: float,
                      ssl: ssl_module.SSLContext | None = None, until_ms: int | None = None) -> Trend:
    query: dict[str, int] = {"window_s": window_s}
    if step_s is not None:
        query["step_s"] = step_s
    if until_ms is not None:
        query["until_ms"] = int(until_ms)
    url = f"{base}/api/channels/{urllib.parse.quote(channel, safe='')}/trend?{urllib.parse.urlencode(query)}"
    body = await asyncio.to_thread(get_json, url, headers, timeout, ssl)
    return parse_trend(body)


def parse_trend(body: dict[str, Any]) -> Trend:
    """A trend reply `{"step_s", "buckets", "tiers"}`; a node that names no tiers gives none."""
    buckets = [Bucket(t=b["t"], min=b["min"], max=b["max"], last=b["last"], n=b["n"]) for b in body["buckets"]]
    tiers = [Tier(step_s=int(t["step_s"]), window_s=int(t["window_s"])) for t in body.get("tiers") or ()]
    return Trend(buckets, int(body["step_s"]), tiers)


def trend_frame(buckets: list[Bucket]) -> Any:
    """A pandas DataFrame of trend buckets: a UTC `t` index and columns min, max, last, n.
    Needs pandas (not a dependency of this package)."""
    try:
        import pandas as pd  # type: ignore[import-untyped,unused-ignore]
    except ImportError as e:
        raise ImportError("as_frame=True needs pandas: pip install pandas") from e
    frame = pd.DataFrame(
        {"min": [b.min for b in buckets], "max": [b.max for b in buckets],
         "last": [b.last for b in buckets], "n": [b.n for b in buckets]},
        index=pd.to_datetime([b.t for b in buckets], unit="ms", utc=True),
    )
    frame.index.name = "t"
    return frame
