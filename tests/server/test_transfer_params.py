"""``kv_transfer_params`` at the HTTP boundary of the real app (over the fake engine): a
malformed one is a 400 naming the field, and it is parsed once, there, into the typed
``TransferFields`` the engine and its connector read (the raw dict goes no further)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hybridkv.sampling.params import SamplingParams
from hybridkv.sampling.transfer_params import TransferFields
from tests.server.fake_engine import FakeEngine
from tests.server.harness import ThreadedServer
from tests.server.test_fake_server import MODEL, make_app


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ThreadedServer, FakeEngine]]:
    app, fake = make_app(step_delay=0.002)
    with ThreadedServer(app) as server:
        yield server, fake


def post(served: tuple[ThreadedServer, FakeEngine], path: str, body: dict[str, Any]) -> httpx.Response:  # fmt: skip
    prompt = {"prompt": "abc"} if "chat" not in path else {"messages": [{"role": "user", "content": "abc"}]}  # fmt: skip
    return httpx.post(served[0].url + path, json={"model": MODEL, "max_tokens": 2, **prompt, **body}, timeout=30)  # fmt: skip


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("field", "value"),
    [("remote_port", "5600"), ("remote_port", 10**30), ("num_tokens", -1),
     ("remote_block_ids", [[1.5]]), ("remote_lease", [0]), ("remote_host", "a b"),
     ("do_remote_prefill", "yes"), ("remote_signature", "zz"), ("remote_expires_ms", 1e300)],
)  # fmt: skip
def test_a_malformed_field_is_a_400_naming_it(
    served: tuple[ThreadedServer, FakeEngine], path: str, field: str, value: Any
) -> None:
    fake = served[1]
    before = fake.num_queries
    r = post(served, path, {"kv_transfer_params": {"do_remote_prefill": True, field: value}})
    assert r.status_code == 400, r.text
    assert f"kv_transfer_params.{field}" in r.json()["error"]["message"]
    assert fake.num_queries == before  # never reached the engine


@pytest.mark.parametrize("value", [[1, 2], "x", 7, {str(i): i for i in range(65)}])
def test_params_that_are_not_a_bounded_object_are_a_400(
    served: tuple[ThreadedServer, FakeEngine], value: Any
) -> None:
    r = post(served, "/v1/completions", {"kv_transfer_params": value})
    assert r.status_code == 400, r.text
    assert "kv_transfer_params" in r.json()["error"]["message"]


def test_the_engine_gets_the_typed_value(
    served: tuple[ThreadedServer, FakeEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = served[1]
    seen: list[TransferFields | None] = []
    add = fake.add_request

    def recording(ids: list[int], params: SamplingParams, *args: Any, **kw: Any) -> Any:
        seen.append(params.transfer_fields)
        return add(ids, params, *args, **kw)

    monkeypatch.setattr(fake, "add_request", recording)
    sent = {"do_remote_prefill": True, "remote_port": 5600, "remote_block_ids": [[3, 4]]}
    r = post(served, "/v1/completions", {"kv_transfer_params": sent})
    assert r.status_code == 200, r.text
    assert seen == [TransferFields(do_remote_prefill=True, port=5600, block_ids=((3, 4),))]


def test_a_refused_request_releases_its_producer_with_the_typed_value(
    served: tuple[ThreadedServer, FakeEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused for another field (top_p 5): the producer its params name is told
    to free its KV, through the typed value; malformed params name no producer."""
    released: list[object] = []
    monkeypatch.setattr(served[1], "release_transfer", released.append, raising=False)
    sent = {"do_remote_prefill": True, "remote_port": 5600}
    r = post(served, "/v1/completions", {"kv_transfer_params": sent, "top_p": 5.0})
    assert r.status_code == 400, r.text
    assert released == [TransferFields(do_remote_prefill=True, port=5600)]
    bad = {**sent, "remote_port": "x"}
    r = post(served, "/v1/completions", {"kv_transfer_params": bad, "top_p": 5.0})
    assert r.status_code == 400 and released == [TransferFields(do_remote_prefill=True, port=5600)]
