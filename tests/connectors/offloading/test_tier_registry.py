"""Every tier has a registry entry: a name, a medium its KV events carry, option keys that
parse (and are nobody else's); every ``Tier`` subclass and every ``TierName`` is one of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybridkv.connectors.config import OptionsContext, TierName
from hybridkv.connectors.offloading.config import OffloadingConfig
from hybridkv.connectors.offloading.tier_base import Tier
from hybridkv.connectors.offloading.tier_registry import SHARED_KEYS, tier_entries
from hybridkv.connectors.offloading.tiers.cpu import tier as cpu_tier
from hybridkv.connectors.offloading.tiers.disk import tier as disk_tier
from hybridkv.connectors.offloading.tiers.remote import tier as remote_tier
from hybridkv.connectors.registry import parse_kv_transfer_config
from hybridkv.connectors.tier_events import TierEvent
from hybridkv.kv_events.collector import KVEventCollector
from tests.kv.builders import make_layout
from tests.kv_events.test_collector import Capture

# one working option set per tier: a new tier adds its own here (the test below asks for it)
EXAMPLES: dict[str, dict[str, Any]] = {
    "cpu": {"cpu_bytes": "1MiB", "cpu_prealloc": False},
    "disk": {"disk_path": "kv", "disk_bytes": "4MiB"},
    "remote": {"remote_url": "valkey://127.0.0.1:6379/0", "remote_ttl_seconds": 60},
}
CTX = OptionsContext(block_size=4)


def parse(extra: dict[str, Any]) -> OffloadingConfig:
    config = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}
    return parse_kv_transfer_config(config, 4).options_as(OffloadingConfig)


def test_every_tier_has_an_entry_a_medium_and_options_that_parse() -> None:
    entries = tier_entries()
    assert [e.name for e in entries] == ["cpu", "disk", "remote"]  # fastest first
    assert len({e.medium for e in entries}) == len(entries) and all(e.medium for e in entries)
    keys = [k for e in entries for k in e.options.KEYS]
    assert len(keys) == len(set(keys)) and not set(keys) & set(SHARED_KEYS)
    for entry in entries:
        example = EXAMPLES[entry.name]
        assert set(example) <= set(entry.options.KEYS)
        assert entry.options.parse({}, CTX) is None  # not given: not configured
        own = entry.options.parse(example, CTX)
        assert isinstance(own, entry.options)
        config = parse({**example, "chunk_tokens": 8})
        assert list(config.tiers) == [entry.name] and config.tiers[entry.name] == own
        assert config.tier_options(entry.name, entry.options) == own


def test_the_builtin_flat_keys_are_the_typed_options_fields() -> None:
    config = parse({k: v for ex in EXAMPLES.values() for k, v in ex.items()})
    assert (config.cpu_bytes, config.disk_path, config.disk_bytes) == (1 << 20, "kv", 4 << 20)
    assert (config.remote_url, config.remote_ttl_seconds) == (EXAMPLES["remote"]["remote_url"], 60)
    assert list(config.tiers) == ["cpu", "disk", "remote"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"cpu_bytes": "1MiB", "cpu_byts": 1}, "'cpu_byts': unknown key"),
        ({"cpu_prealloc": True}, "give cpu_bytes, disk_path, remote_url"),
        ({"cpu_bytes": "1MiB", "disk_bytes": "1MiB"}, "'disk_path': is required with disk_bytes"),
        ({"disk_path": "kv"}, "'disk_bytes': is required with disk_path"),
        ({"cpu_bytes": "1MiB", "cpu_prealloc": "yes"}, "'cpu_prealloc': 'yes' must be true"),
        ({"cpu_bytes": "1MiB", "remote_username": "u"}, "'remote_username': is only used"),
        ({"cpu_bytes": 1 << 62}, "'cpu_bytes': .* more than this machine's"),
    ],
)
def test_bad_options_name_the_key(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(extra)


def test_every_tier_class_and_tier_name_is_registered() -> None:
    names = {e.name for e in tier_entries()}
    classes = (cpu_tier.CpuTier, disk_tier.DiskTier, remote_tier.RemoteTier)
    assert set(Tier.__subclasses__()) >= set(classes)
    assert {c.name for c in classes} == names == {str(n) for n in TierName}


def test_each_tier_event_goes_out_with_its_entry_medium(tmp_path: Path) -> None:
    """A tier with no medium was a ``KeyError`` on the engine thread once KV events were on."""
    capture = Capture()
    collector = KVEventCollector(make_layout("full"), capture)
    entries = tier_entries()
    units = [TierEvent(True, e.name, bytes([i]) * 32, 8, None, 8) for i, e in enumerate(entries)]
    collector.publish_units(units)
    media = [ev.medium for batch in capture.batches for ev in batch.events]
    assert media == [e.medium for e in entries] == ["CPU", "DISK", "REMOTE"]
