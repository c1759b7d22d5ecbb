"""Issue 26, findings 1, 2 and 10 without engines: ``kv_transfer_params`` from a client are
parsed once into typed, bounded values (a bad one is a ValueError naming the field, never
another exception), a consumer loads only params its deployment's producer signed, for a
trusted host, unexpired, and the lease check is exact."""

from __future__ import annotations

import math
import random
from typing import Any, cast

import pytest

from hybridkv.connectors.base import KVConnectorRequest
from hybridkv.connectors.nixl.auth import AuthKey
from hybridkv.connectors.nixl.layout import GroupDesc
from hybridkv.connectors.nixl.leases import ENDED, lease_pending, lease_valid
from hybridkv.connectors.nixl.meta import ParamsPolicy, ParamsRefused, RemoteSource
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.scheduler import NixlScheduler
from hybridkv.sampling.params import SamplingParams
from hybridkv.sampling.transfer_params import TransferFields, parse_transfer_params
from tests.connectors.nixl.signing import TEST_KEY, policy, signed

PROMPT = list(range(100, 200))


def honest(rid: str = "victim", blocks: tuple[int, ...] = (3, 4, 5)) -> dict[str, Any]:
    return signed({
        "do_remote_prefill": True, "remote_engine_id": "p", "remote_host": "127.0.0.1",
        "remote_port": 5600, "remote_request_id": rid, "remote_block_ids": [list(blocks)],
        "remote_block_starts": [0], "remote_state": [], "remote_block_size": 16,
        "num_tokens": 16 * len(blocks), "remote_lease": [2, 9],
    }, prompt=PROMPT)  # fmt: skip


def parse(params: dict[str, Any], pol: ParamsPolicy | None = None) -> RemoteSource:
    """Typed at the API boundary (a ValueError there), then checked by the consumer."""
    return RemoteSource.parse(parse_transfer_params(params), PROMPT, (1, False), pol or policy())


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_tokens", math.inf), ("num_tokens", -1), ("num_tokens", 1.5), ("remote_port", 10**30),
     ("remote_port", 0), ("remote_port", "5600"), ("remote_block_ids", [[10**30]]),
     ("remote_block_ids", [[1]] * 100), ("remote_block_ids", [list(range(1 << 20 | 1))]),
     ("remote_lease", [0, 2**63]), ("remote_lease", [0]), ("remote_lease", [-1, 1]),
     ("remote_host", "a b"), ("remote_host", "x" * 300), ("remote_state", [math.nan]),
     ("do_remote_prefill", "yes"), ("remote_engine_id", ""), ("remote_signature", "zz"),
     ("remote_expires_ms", math.inf), ("remote_block_starts", [True])],
)  # fmt: skip
def test_a_hostile_field_is_a_value_error_naming_it(field: str, value: Any) -> None:
    params = {**honest(), field: value}
    with pytest.raises(ValueError, match=rf"kv_transfer_params\.{field}="):
        parse_transfer_params(params)
    with pytest.raises(ValueError, match=rf"kv_transfer_params\.{field}="):  # the API's 400
        SamplingParams(extra_args={"kv_transfer_params": params})


def test_the_producers_own_params_load() -> None:
    src = parse(honest())
    assert (src.host, src.port, src.block_ids, src.num_tokens) == ("127.0.0.1", 5600, ((3, 4, 5),), 48)  # fmt: skip
    assert src.lease is not None and (src.lease.slot, src.lease.gen) == (2, 9)


@pytest.mark.parametrize(
    "change",
    [{"remote_block_ids": [[7, 8, 9]]},  # another user's blocks
     {"remote_lease": [0, 2**62]},  # a lease that always validated before
     {"num_tokens": 32}, {"remote_port": 5601}, {"remote_request_id": "other"},
     {"remote_host": "localhost"}, {"remote_expires_ms": 2**52},
     {"remote_prompt_digest": "00" * 16}],
)  # fmt: skip
def test_a_changed_field_breaks_the_signature(change: dict[str, Any]) -> None:
    with pytest.raises(ParamsRefused) as refused:
        parse({**honest(), **change})
    assert refused.value.reason == "nixl_params_forged"


def test_unsigned_other_key_untrusted_host_and_expired_params_are_refused() -> None:
    unsigned = {k: v for k, v in honest().items() if k != "remote_signature"}
    other = signed(unsigned, AuthKey(b"another-deployment-key!!", "x"), prompt=PROMPT)
    far = signed({**unsigned, "remote_host": "10.9.8.7"}, prompt=PROMPT)
    old = signed(unsigned, ttl=-1.0, prompt=PROMPT)
    for params, reason in ((unsigned, "forged"), (other, "forged"), (far, "untrusted"),
                           (old, "expired")):  # fmt: skip
        with pytest.raises(ParamsRefused) as refused:
            parse(params)
        assert refused.value.reason == f"nixl_params_{reason}"
    trusting = ParamsPolicy(TEST_KEY, frozenset({"10.9.8.7"}))
    assert parse(far, trusting).host == "10.9.8.7"  # trusted_hosts admits it


def test_params_load_only_with_the_prompt_they_were_computed_for() -> None:
    """A client's own genuine params with another (popular) prompt would cache its KV under
    that prompt's hashes: refused."""
    params = honest()
    assert parse(params).num_tokens == 48
    fields = parse_transfer_params(params)
    for prompt in ([7] + PROMPT[1:], PROMPT[:47], PROMPT[:48] + [1] * 52):
        if prompt[:48] == PROMPT[:48]:
            assert RemoteSource.parse(fields, prompt, (1, False), policy()).num_tokens == 48
            continue  # only tokens [0, num_tokens) are bound: the rest is the consumer's
        with pytest.raises(ParamsRefused) as refused:
            RemoteSource.parse(fields, prompt, (1, False), policy())
        assert refused.value.reason == "nixl_params_forged"


def test_the_lease_check_is_exact() -> None:
    assert lease_valid(9, 9)
    for word in (0, 8, 8 | ENDED, 9 | ENDED, 10, 2**62):
        assert not lease_valid(word, 9)
    assert lease_pending(8, 9) and lease_pending(8 | ENDED, 9)  # not started yet: read again
    assert not lease_pending(10, 9) and not lease_pending(9 | ENDED, 9)


def _hostile_value(rng: random.Random) -> Any:
    pool: list[Any] = [math.inf, -math.inf, math.nan, 1e999, 10**30, -(10**30), 2**63, -1, 0,
                       1, True, None, "", "x" * 10_000, "127.0.0.1", [], [[]], [[1, 2]],
                       [[10**30]], [1.5], {"a": 1}, [0, 2**62], [2**31, 1], "🙂", b"x".hex()]  # fmt: skip
    return rng.choice(pool)


FIELDS = ["do_remote_prefill", "remote_engine_id", "remote_host", "remote_port",
          "remote_request_id", "remote_block_ids", "remote_block_starts", "remote_state",
          "remote_block_size", "num_tokens", "remote_lease", "remote_expires_ms",
          "remote_signature", "unknown"]  # fmt: skip


def test_fuzzed_params_only_ever_raise_a_named_refusal() -> None:
    """5,000 random mutations of honest params: parsing either raises ParamsRefused or loads
    params equal to what the producer signed, and the consumer's scheduler half answers every
    lookup (a refusal: nothing to load, counted by reason)."""
    rng = random.Random(26)
    sched = NixlScheduler(NixlOptions(), "d", (GroupDesc("full_attention", 0, 2, 64),), 16,
                          False, True, policy())  # fmt: skip
    refused = rejected = 0
    for i in range(5000):
        original = honest(f"r{i}")
        params = dict(original)
        for _ in range(rng.randint(1, 4)):
            params[rng.choice(FIELDS)] = _hostile_value(rng)
        try:
            fields = parse_transfer_params(params)
        except ValueError:
            rejected += 1  # the API's 400: never reaches a connector
            continue
        try:
            src = parse(params)
            assert src == parse(original)  # what survives is the producer's own
            want = (src.num_tokens, True) if params.get("do_remote_prefill") else (0, False)
        except ParamsRefused:
            refused += bool(params.get("do_remote_prefill"))
            want = (0, False)
        req = cast(KVConnectorRequest, _Req(f"q{i}", fields))
        assert sched.get_num_new_matched_tokens(req, 0) == want
    counted = sched.take_stats().failures
    assert refused > 100 and rejected > 1000 and sum(counted.values()) == refused
    assert set(counted) <= {"nixl_params_malformed", "nixl_params_forged",
                            "nixl_params_expired", "nixl_params_untrusted"}  # fmt: skip


class _Req:
    def __init__(self, rid: str, fields: TransferFields) -> None:
        self.request_id = rid
        self.transfer_fields = fields
        self.all_token_ids = PROMPT


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0, True, "120", 10**9])
def test_abort_timeout_seconds_must_be_finite_and_in_range(bad: Any) -> None:
    with pytest.raises(ValueError, match="abort_timeout_seconds=.* must be a positive number"):
        NixlOptions.parse({"abort_timeout_seconds": bad})
    for name in ("load_timeout_seconds", "handshake_timeout_seconds"):
        with pytest.raises(ValueError, match=name):
            NixlOptions.parse({name: bad})


def test_host_options_are_checked() -> None:
    with pytest.raises(ValueError, match="trusted_hosts"):
        NixlOptions.parse({"trusted_hosts": "10.0.0.1"})
    with pytest.raises(ValueError, match="host name or IP"):
        NixlOptions.parse({"trusted_hosts": ["a b"]})
    options = NixlOptions.parse({"trusted_hosts": ["10.0.0.1"]})
    assert "10.0.0.1" in options.trusted() and "127.0.0.1" in options.trusted()
    assert not options.single_host() and NixlOptions().single_host()
