"""vLLM's extra routes on the fake-engine server: ``/version``, ``/ping``, and a clear refusal
in OpenAI's error shape (naming what is served) for the APIs hybridkv does not serve."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from hybridkv import __version__
from hybridkv.server.compat import UNSERVED
from tests.server.harness import ThreadedServer
from tests.server.test_fake_server import MODEL, make_app


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    app, _ = make_app(api_key="k")
    with ThreadedServer(app) as srv:
        yield srv


def test_version_and_ping_are_open(server: ThreadedServer) -> None:
    """Like /health and /metrics, no API key needed (probes); /ping answers GET and POST."""
    r = httpx.get(server.url + "/version")
    assert r.status_code == 200 and r.json()["version"] == __version__
    assert httpx.get(server.url + "/ping").status_code == 200
    assert httpx.post(server.url + "/ping").status_code == 200


@pytest.mark.parametrize("path", sorted(p.split("/{")[0] for p in UNSERVED))
def test_unserved_apis_are_refused_clearly(server: ThreadedServer, path: str) -> None:
    headers = {"Authorization": "Bearer k"}
    r = httpx.post(server.url + path, json={"model": MODEL, "input": "hi"}, headers=headers)
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "unsupported_endpoint" and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{path} is not supported")
    assert "/v1/chat/completions" in error["message"]  # names what is served


def test_the_openai_client_gets_the_message(server: ThreadedServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="embeddings"):
        client.embeddings.create(model=MODEL, input="hi")
    with pytest.raises(openai.NotFoundError, match="Responses API"):
        client.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.NotFoundError, match="Responses API"):
        client.responses.retrieve("resp_1")


def test_unserved_v1_routes_still_need_the_key(server: ThreadedServer) -> None:
    assert httpx.post(server.url + "/v1/embeddings", json={}).status_code == 401
