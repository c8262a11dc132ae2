"""History reads over HTTP are bounded like the WebSocket `history` command (docs/api.md,
`GET /api/channels/{ch}/history`; docs/protocol.md, "Reply bound"): a page of large
publications ends at the budget of one reply (half of `limits.max_pending_bytes`, 512 KiB) with
`"more": true`, paging on from the last offset reads every publication once and in order, and
clients that ask for thousands of them and never read hold no more of the node's memory than
that bound. Clients: httpx, sb.WS and raw sockets (sb.UnreadGets)."""

from __future__ import annotations

import httpx

from sb import WS, UnreadGets, api_batch, ch_path, uniq

BUDGET = 512 * 1024  # half of the default limits.max_pending_bytes
SIZE = 60_000  # bytes of each publication's data, within the 64 KiB a publication may take
COUNT = 30

CONFIG = """
[namespaces.big]
history_size = 400
"""


def publish_large(srv, ch: str, count: int) -> str:
    """Publishes `count` publications of SIZE bytes (each names its index) in batches; returns
    the channel's epoch."""
    results = []
    for start in range(0, count, 25):
        items = [{"channel": ch, "data": f"{i:06d}" + "x" * (SIZE - 6)} for i in range(start, min(count, start + 25))]
        results += api_batch(srv, items)
    assert all("offset" in r for r in results), results[:3]
    return results[0]["epoch"]


def test_history_http_pages_within_the_budget_and_paging_reads_each_once_in_order(server):
    ch = uniq("hist.")
    epoch = publish_large(server, ch, COUNT)
    c = httpx.Client(base_url=server.http_url, timeout=30, trust_env=False)
    path = f"/api/channels/{ch_path(ch)}/history"

    first = c.get(path, params={"since_offset": 0, "epoch": epoch, "limit": 1000})
    assert first.status_code == 200, first.text[:300]
    body = first.json()
    n = len(body["publications"])
    # Eight publications of 60 KB fit in 512 KiB, a ninth does not.
    assert n == BUDGET // (SIZE + 60), n
    assert body["more"] is True and body["complete"] is True, {k: v for k, v in body.items() if k != "publications"}
    assert len(first.content) <= BUDGET, len(first.content)
    # The WebSocket command pages the same way.
    with WS(server.ws_url) as ws:
        got = ws.ok("history", {"channel": ch, "since": {"epoch": epoch, "offset": 0}, "limit": 1000}, timeout=30)
        assert [p["off"] for p in got["publications"]] == [p["offset"] for p in body["publications"]]
        assert got["more"] is True

    # Paging on from the last offset of each page reads every publication once, in order.
    seen, pages, since = [], 0, 0
    while pages < COUNT:
        r = c.get(path, params={"since_offset": since, "epoch": epoch, "limit": 1000})
        assert r.status_code == 200 and len(r.content) <= BUDGET, (r.status_code, len(r.content))
        page = r.json()
        pages += 1
        seen += [(p["offset"], p["data"][:6]) for p in page["publications"]]
        since = page["publications"][-1]["offset"]
        if not page["more"]:
            break
    assert seen == [(i + 1, f"{i:06d}") for i in range(COUNT)]
    assert pages == -(-COUNT // n), pages

    # Without `since`: the newest `limit`, from the first of them, still within the budget.
    newest = c.get(path, params={"limit": 20}).json()
    assert [p["offset"] for p in newest["publications"]] == list(range(COUNT - 19, COUNT - 19 + n))
    assert newest["more"] is True
    # A page that holds everything asked for says there is no more.
    small = c.get(path, params={"since_offset": COUNT - 2, "epoch": epoch}).json()
    assert [p["offset"] for p in small["publications"]] == [COUNT - 1, COUNT]
    assert small["more"] is False


def test_history_http_clients_that_never_read_hold_at_most_the_bound(start_server, tmp_path):
    config = tmp_path / "big.toml"
    config.write_text(CONFIG)
    srv = start_server("--config", str(config))
    ch = uniq("big:h.")
    kept = 400
    publish_large(srv, ch, kept)
    clients = 20
    # What whole replies of every kept publication would take.
    whole = clients * kept * SIZE
    assert whole > 400 * 1024 * 1024, whole
    path = f"/api/channels/{ch_path(ch)}/history?limit=10000"
    c = httpx.Client(base_url=srv.http_url, timeout=30, trust_env=False)
    # One read first, so the node's allocator has seen the size of such a read once.
    once = c.get(path)
    assert once.status_code == 200 and once.json()["more"] is True and len(once.content) <= BUDGET
    before = srv.rss_bytes()
    with UnreadGets(srv, path, clients) as unread:
        grown = srv.rss_bytes() - before
        assert grown < whole / 16, (grown, whole)
        head = unread.head()
        assert head.startswith(b"HTTP/1.1 200"), head[:100]
