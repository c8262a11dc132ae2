"""A malformed query string on any HTTP API route gets the API's JSON error (`{"error": {"code":
400, "message"}}`, docs/api.md "Errors"), naming the field, like every other bad request —
not the HTTP library's plain text. urllib as the client."""

from __future__ import annotations

import pytest

from sb import api_publish, ch_path, http, uniq


@pytest.mark.parametrize("path, field", [
    ("/api/channels?limit=abc", "limit"),
    ("/api/channels?limit=-1", "limit"),
    ("/api/channels/{ch}/trend?window_s=abc", "window_s"),
    ("/api/channels/{ch}/trend?window_s=60&step_s=1.5", "step_s"),
    ("/api/channels/{ch}/history?since_offset=-1&epoch=x", "since_offset"),
    ("/api/channels/{ch}?limit=many", "limit"),
    ("/api/writes?limit=-5", "limit"),
])
def test_api_malformed_query_values_get_the_json_error(server, path, field):
    ch = uniq("pt:q-")
    api_publish(server, ch, {"v": 1})
    r = http("GET", server.http_url + path.format(ch=ch_path(ch)))
    assert r.status == 400, (r.status, r.body)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert err["code"] == 400 and field in err["message"], err
