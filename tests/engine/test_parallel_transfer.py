"""``n > 1`` with P/D: only the first copy carries ``kv_transfer_params`` (one transfer per
request), and the proxy asks its prefill engine for one copy (no model: plain data)."""

from __future__ import annotations

from hybridkv.engine.parallel import ParentRequest
from hybridkv.proxy.forward import prefill_body
from hybridkv.sampling.params import SamplingParams


def test_only_the_first_copy_carries_the_transfer() -> None:
    transfer = {"do_remote_decode": True}
    params = SamplingParams(n=3, seed=5, extra_args={"kv_transfer_params": transfer, "x": 1})
    parent = ParentRequest("r", params, None, [1, 2, 3])
    first, second, third = (parent.child_params(i) for i in range(3))
    assert first.kv_transfer_params == transfer and first.n == 1 and first.seed == 5
    assert second.kv_transfer_params is None and third.kv_transfer_params is None
    assert second.extra_args == {"x": 1} and third.seed == 7  # the rest is kept
    only = SamplingParams(n=2, extra_args={"kv_transfer_params": transfer})
    assert ParentRequest("s", only, None, [1]).child_params(1).extra_args is None


def test_the_prefill_engine_is_asked_for_one_copy() -> None:
    body = {"model": "m", "prompt": "hi", "n": 3, "best_of": 4, "max_tokens": 9, "stream": True}
    out = prefill_body(body)
    assert "n" not in out and "best_of" not in out
    assert (out["max_tokens"], out["stream"]) == (1, False)
    assert out["kv_transfer_params"] == {"do_remote_decode": True}
    assert body["n"] == 3  # the decode engine still gets the client's body
