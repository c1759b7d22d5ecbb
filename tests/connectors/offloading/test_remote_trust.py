"""The remote tier trusts only its deployment key (issue 26, finding 6), on a real
``valkey-server``: a value written without the key (the issue's ``'FullFull...'`` with a
recomputed checksum) or moved from another part's name is a counted load failure and never
reaches a block; a 500 MiB header or payload value is refused before anything is allocated;
names are keyed, so an engine with another key finds nothing and a name cannot be derived."""

from __future__ import annotations

import re
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hybridkv.connectors.file import format as file_format
from hybridkv.connectors.offloading.tiers.disk.key import DirectoryKey
from hybridkv.connectors.offloading.tiers.remote import format as remote_format
from hybridkv.connectors.offloading.tiers.remote.key import ENV_KEY
from hybridkv.connectors.offloading.tiers.remote.tier import RemoteTier
from hybridkv.connectors.offloading.units import part_key
from hybridkv.kv.hashing import BlockHash
from tests.connectors.helpers import make_layout, make_request, table
from tests.support.valkey_server import ValkeyProcess, running_valkey

from .helpers import SRC, OffloadEngine, offload_config
from .test_remote_tier import engine, load, remote, settle, store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

FORGED_BYTE = b"FullFull"
BIG = 500 << 20


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ValkeyProcess]:
    monkeypatch.setenv(ENV_KEY, "the deployment key of these tests")
    with running_valkey(tmp_path / "valkey") as proc:
        yield proc


def forge(tier: RemoteTier, server: ValkeyProcess, unit_hash: BlockHash, how: str) -> None:
    """Overwrite every value of a stored unit with ``FullFull...`` payloads whose header is
    what an attacker without the key can make: the disk format with a recomputed xxh3
    (``plain``, the issue's attack) or this format signed with another key (``other_key``)."""
    client, end = server.client(), 16
    for group in tier.geometry.layout.groups:
        gid = group.group_id
        nbytes, span = tier.geometry.part_nbytes(gid, end), tier.geometry.part_span(gid, end)
        payload = memoryview((FORGED_BYTE * (nbytes // 8 + 1))[:nbytes])
        key = part_key(unit_hash, gid)
        if how == "plain":
            head = file_format.encode_header(tier.fingerprint, key, span, payload, "xxh3")
        else:
            attacker = DirectoryKey(b"an attacker's own key, 32 bytes!")
            head = remote_format.encode_header(attacker, tier.fingerprint, key, span, payload)
        names = tier.part_keys(unit_hash, gid, end)
        client.set(names[0], head)
        client.set(names[1], payload.tobytes())
        for name in names[2:]:
            client.set(name, b"")


def loaded_bytes(b: OffloadEngine) -> bytes:
    return b.blocks_bytes([11, 12, 13, 14, 16, 17]).numpy().tobytes() + bytes(
        b.state_bytes(3).numpy().tobytes()
    )


@pytest.mark.parametrize("how", ["plain", "other_key"])
def test_a_forged_value_is_a_counted_failure_never_served(server: ValkeyProcess, how: str) -> None:
    a, b = engine(server, seed=1), engine(server, seed=2)
    req = store(a)
    assert settle(b, req) == (16, True)
    forge(remote(b), server, req.block_hashes[3], how)
    counters = load(b, req, 16)
    reason = "forged" if how == "other_key" else "corrupt"  # plain: not even our header's size
    assert counters[f"load_failures:{reason}"] >= 1 and counters["invalid"] >= 1
    assert FORGED_BYTE not in loaded_bytes(b)
    assert counters["removed.remote"] == 1  # the forged unit is deleted, the head stays
    b.assert_clean()


def test_an_authentic_value_moved_to_another_name_is_forged(server: ValkeyProcess) -> None:
    """The MAC binds the part it stands for: the head unit's full-attention part (same size)
    copied over the tail's is refused, not loaded as the tail's KV."""
    a, b = engine(server, seed=1), engine(server, seed=2)
    req = store(a)
    tier, client = remote(b), server.client()
    head_names = tier.part_keys(req.block_hashes[1], 0, 8)
    tail_names = tier.part_keys(req.block_hashes[3], 0, 16)
    for src, dst in zip(head_names, tail_names, strict=True):
        client.copy(src, dst, replace=True)
    assert settle(b, req) == (16, True)
    counters = load(b, req, 16)
    assert counters["load_failures:forged"] == 1 and counters["invalid"] >= 1
    b.assert_clean()


@pytest.mark.parametrize("value", [0, 1], ids=["header", "payload"])
def test_a_huge_value_is_refused_before_allocation(server: ValkeyProcess, value: int) -> None:
    a = engine(server, seed=1)
    # the server copies the value into its reply before the first byte: time for it
    config = offload_config(cpu=None, remote=server.url, remote_timeout_seconds=20)
    b = OffloadEngine(config, make_layout("hybrid"), seed=2)
    req = store(a)
    name = remote(b).part_keys(req.block_hashes[3], 0, 16)[value]
    # a 500 MiB value on the server (allocating it takes seconds on a loaded host)
    server.client(timeout_seconds=60).setrange(name, BIG - 1, b"\0")
    assert settle(b, req) == (16, True)
    tracemalloc.start()
    try:
        counters = load(b, req, 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB allocated to refuse the value"
    assert counters["load_failures:corrupt"] == 1 and counters["invalid"] >= 1
    assert "remote_errors" not in counters  # the server is not marked down for it
    req2 = make_request("a2", 18, first_token=100)
    a.save_prompt(req2, table(a.layout, SRC, {2: 0}), [8, 16, 18])
    assert settle(b, req2) == (16, True)
    assert load(b, req2, 16)["invalid"] == 0  # the dropped connection was replaced
    b.assert_clean()


def test_names_are_keyed_another_key_finds_nothing(server: ValkeyProcess, tmp_path: Path) -> None:
    a = engine(server, seed=1)
    req = store(a)
    other_key = tmp_path / "other.key"
    other_key.write_text("another deployment, another key\n")
    other_key.chmod(0o600)
    c = engine(server, seed=3, remote_auth_key_file=str(other_key))
    assert settle(c, req) == (0, False)  # a miss: nothing under its names
    ours, theirs = remote(a), remote(c)
    for unit_hash, end in ((req.block_hashes[1], 8), (req.block_hashes[3], 16)):
        mine, other = ours.unit_keys(unit_hash, end), theirs.unit_keys(unit_hash, end)
        assert not set(mine) & set(other)
        assert server.client().exists(*other) == 0
    stored = {k.decode() for k in server.client().keys("*")}
    assert all(re.fullmatch(r"hybridkv:[0-9a-f]{40}:[0-9]+", k) for k in stored)
    # what someone without the key could compute from the unit hash is not a name there
    for guess in (part_key(req.block_hashes[3], 0), req.block_hashes[3].hex()):
        assert not any(guess in k for k in stored)
    c.assert_clean()


def test_an_engine_with_the_same_key_in_a_file_shares_values(
    server: ValkeyProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "deploy.key"
    key_file.write_text("the deployment key of these tests\n")  # the env var's, as a file
    key_file.chmod(0o600)
    a = engine(server, seed=1)
    req = store(a)
    monkeypatch.delenv(ENV_KEY)
    b = engine(server, seed=2, remote_auth_key_file=str(key_file))
    assert settle(b, req) == (16, True)
    assert load(b, req, 16)["invalid"] == 0
    assert torch.equal(b.blocks_bytes([11, 12, 13, 14]), a.blocks_bytes([1, 2, 3, 4]))
    b.assert_clean()
