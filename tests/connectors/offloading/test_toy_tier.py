"""A tier added from outside ``src/``: a dict of unit bytes, registered from this file, used
end to end by an ``OffloadingConnector`` (stored, then loaded into other blocks exactly), its
own option key parsed, its KV events' medium its entry's; unregistered afterwards."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from hybridkv.connectors.config import OptionsContext
from hybridkv.connectors.offloading.config import OffloadingConfig
from hybridkv.connectors.offloading.policies import create_policy
from hybridkv.connectors.offloading.tier import TierIndex
from hybridkv.connectors.offloading.tier_base import Tier
from hybridkv.connectors.offloading.tier_registry import (
    TierBuild,
    TierEntry,
    TierOptions,
    register_tier,
    tier_entries,
    tier_medium,
    unregister_tier,
)
from hybridkv.connectors.part_error import MISSING, PartError
from hybridkv.connectors.registry import parse_kv_transfer_config
from hybridkv.connectors.tier_events import TierEvent
from hybridkv.kv.hashing import BlockHash
from tests.connectors.helpers import make_layout, make_request, table

from .helpers import DST, SRC, OffloadEngine, offload_config

TOY = "toy"


@dataclass(frozen=True, slots=True)
class ToyOptions(TierOptions):
    KEYS: ClassVar[tuple[str, ...]] = ("toy_units",)
    toy_units: int

    @classmethod
    def parse(cls, extra: Mapping[str, Any], ctx: OptionsContext) -> ToyOptions | None:
        units = extra.get("toy_units")
        if units is None:
            return None
        if isinstance(units, bool) or not isinstance(units, int) or units <= 0:
            raise ValueError(f"'toy_units': {units!r} must be a whole number > 0")
        return cls(units)


class ToyTier(Tier):
    """Each unit's parts as bytes in a dict; no I/O (``submit`` runs on the caller)."""

    name = TOY

    def __init__(self, options: ToyOptions, build: TierBuild) -> None:
        capacity = options.toy_units * build.unit_bytes
        self.index = TierIndex(TOY, capacity, create_policy(build.shared.eviction, capacity))
        self.geometry = build.geometry
        self.units: dict[tuple[BlockHash, int], bytes] = {}
        self.lock = threading.Lock()

    def write(self, unit_hash: BlockHash, end: int, parts: dict[int, Any]) -> int:
        blobs = {
            gid: t.contiguous().view(torch.uint8).numpy().tobytes() for gid, t in parts.items()
        }
        with self.lock:
            self.units.update({(unit_hash, gid): blob for gid, blob in blobs.items()})
        self.index.commit(unit_hash, dict.fromkeys(blobs, None))
        return sum(len(b) for b in blobs.values())

    def read(
        self, unit_hash: BlockHash, end: int, group_id: int, deadline: float | None = None
    ) -> torch.Tensor:
        with self.lock:
            blob = self.units.get((unit_hash, group_id))
        if blob is None:
            raise PartError(MISSING, f"toy unit {unit_hash.hex()}")
        return torch.frombuffer(bytearray(blob), dtype=torch.uint8)

    def evict(self, entries: list[Any]) -> None:
        with self.lock:
            for key in [k for k in self.units if k[0] in {e.unit_hash for e in entries}]:
                del self.units[key]


TOY_ENTRY: TierEntry[ToyOptions] = TierEntry(TOY, "TOY", ToyOptions, ToyTier, order=5)


@pytest.fixture
def toy() -> Iterator[TierEntry[ToyOptions]]:
    register_tier(TOY_ENTRY)
    try:
        yield TOY_ENTRY
    finally:
        unregister_tier(TOY)
    assert TOY not in [e.name for e in tier_entries()]


def test_a_registered_tier_stores_and_loads_exact_bytes(toy: TierEntry[ToyOptions]) -> None:
    layout = make_layout("hybrid")
    engine = OffloadEngine(offload_config(cpu=None, toy_units=8), layout, seed=3)
    tier = engine.sched.stack.fastest
    assert isinstance(tier, ToyTier) and [t.name for t in engine.sched.stack] == [TOY]
    req = make_request("a", 18)
    src = table(layout, {g: SRC[g] for g in layout.attention_group_ids}, {2: 0})
    engine.save_prompt(req, src, [8, 16, 18])
    assert len(tier.units) == 2 * len(layout.groups)  # units ending at 8 and 16, every group
    before = engine.blocks_bytes([1, 2, 3, 4, 8, 9]).clone(), engine.state_bytes(0).clone()
    clone = make_request("b", 18)  # the device cache holds nothing of it: loads from the tier
    num, _, _ = engine.load(clone, table(layout, DST, {2: 3}))
    out = engine.finish("b")
    assert num == 16 and not (out.failed_recving or out.invalid_block_ids or out.invalid_state)
    assert torch.equal(engine.blocks_bytes([11, 12, 13, 14, 16, 17]), before[0])
    assert torch.equal(engine.state_bytes(3), before[1])
    assert engine.scheduler.get_hit_sources(clone, 16) == {TOY: 16}
    counters = engine.counters()
    assert counters["stores.toy"] == 2 and counters["hits.toy"] == 2
    engine.assert_clean()


def test_its_keys_parse_beside_the_builtins_and_its_medium_is_its_own(
    toy: TierEntry[ToyOptions],
) -> None:
    config = parse_kv_transfer_config(offload_config(toy_units=4), 4).options_as(OffloadingConfig)
    assert config.tier_options(TOY, ToyOptions) == ToyOptions(4)
    assert list(config.tiers) == [TOY, "cpu"]  # fastest first
    assert config.cpu_bytes == 1 << 20  # a built-in's flat field
    with pytest.raises(ValueError, match="toy_units"):
        parse_kv_transfer_config(offload_config(toy_units=-1), 4)
    assert tier_medium(TOY) == "TOY"
    with pytest.raises(ValueError, match="clashes"):
        register_tier(TierEntry("toy2", "TOY", ToyOptions, ToyTier, order=6))

    @dataclass(frozen=True, slots=True)
    class Greedy(ToyOptions):
        KEYS: ClassVar[tuple[str, ...]] = ("chunk_tokens",)

    with pytest.raises(ValueError, match="keys of its own"):  # the connector's own key
        register_tier(TierEntry("greedy", "GREEDY", Greedy, ToyTier, order=7))
    event = TierEvent(True, TOY, b"\x01" * 32, 8, None, 8)
    assert event.tier == TOY


def test_unregistered_its_key_is_unknown_again() -> None:
    with pytest.raises(ValueError, match="'toy_units': unknown key"):
        parse_kv_transfer_config(offload_config(toy_units=4), 4)
