"""Tier events: every unit that becomes READY or leaves a tier reaches the sink (also through
FaultInjection and MultiConnector), ``resident_units`` is the tiers' READY set, and
``reset_tiers`` drops it (a connector without tiers says so)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybridkv.connectors.config import TierName
from hybridkv.connectors.tier_events import NoTiersError, TierEvent
from tests.connectors.helpers import Engine, file_config, make_layout, make_request, table

from .helpers import C, offload_config

UNIT = 2048  # "full" layout: 1024-byte blocks, two blocks per unit


def store(engine: Engine, rid: str, first_token: int, first_block: int = 1) -> None:
    req = make_request(rid, 18, first_token=first_token)
    blocks = table(engine.layout, {0: list(range(first_block, first_block + 5))})
    engine.worker.save(engine.scheduler.build_connector_meta([(req, 0, req.num_tokens, blocks)]))
    assert engine.worker.wait_for_saves(5.0)


def residents(events: list[TierEvent]) -> set[tuple[TierName, bytes]]:
    held: set[tuple[TierName, bytes]] = set()
    for ev in events:
        (held.add if ev.stored else held.discard)((ev.tier, ev.unit_hash))
    return held


@pytest.mark.parametrize("wrap", ["bare", "faults", "multi"])
def test_the_sink_sees_stores_and_evictions(wrap: str, tmp_path: Path) -> None:
    config: dict[str, Any] = offload_config(cpu=3 * UNIT, disk=tmp_path / "d", disk_bytes=8 * UNIT)
    if wrap == "faults":
        config = {"kv_connector": "FaultInjection", "kv_connector_extra_config": {"inner": config}}
    elif wrap == "multi":
        config = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
            {**config, "name": "off"}, {**file_config(tmp_path / "f"), "name": "file"}]}}  # fmt: skip
    engine = Engine(config, make_layout("full"))
    events: list[TierEvent] = []
    tiers = engine.scheduler.capabilities().tiers
    assert tiers is not None
    tiers.set_tier_event_sink(events.append)
    for i in range(3):  # 6 units: the 3-unit CPU tier evicts, the disk keeps all
        store(engine, f"r{i}", 100 * (i + 1))
    resident = tiers.resident_units()
    assert residents(events) == {(ev.tier, ev.unit_hash) for ev in resident}
    assert {ev.tier for ev in resident} == {TierName.CPU, TierName.DISK}
    assert any(not ev.stored and ev.tier is TierName.CPU for ev in events)
    assert all(ev.num_tokens == C and ev.end % C == 0 for ev in events)
    chained = [ev for ev in resident if ev.end == 2 * C]
    assert chained and all(ev.parent is not None for ev in chained)
    assert tiers.reset_tiers() == len(resident)
    assert residents(events) == set() and tiers.resident_units() == []
    engine.worker.shutdown()


@pytest.mark.parametrize("wrap", ["bare", "faults"])
def test_a_connector_without_tiers_says_so(wrap: str, tmp_path: Path) -> None:
    config: dict[str, Any] = file_config(tmp_path)
    if wrap == "faults":
        config = {"kv_connector": "FaultInjection", "kv_connector_extra_config": {"inner": config}}
    engine = Engine(config, make_layout("full"))
    caps = engine.scheduler.capabilities()
    assert caps.tiers is None
    with pytest.raises(NoTiersError, match="FileConnectorScheduler keeps no storage tiers"):
        caps.require_tiers("FileConnectorScheduler")
