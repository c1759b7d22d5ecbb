"""The built-in tiers, one line each (``tier_registry`` loads this list on first use).

A tier is a folder under ``tiers/`` whose ``entry.py`` holds its ``TierEntry``: options (today's
flat keys as field names, which ``OffloadingConfig`` keeps as its own flat fields too) and a
factory that imports the tier (torch, native kernels, valkey) when called, so importing this
module stays torch-free.
"""

from __future__ import annotations

from typing import Any

from hybridkv.connectors.offloading.tier_registry import TierEntry
from hybridkv.connectors.offloading.tiers.cpu import entry as cpu
from hybridkv.connectors.offloading.tiers.disk import entry as disk
from hybridkv.connectors.offloading.tiers.remote import entry as remote

BUILTIN_TIERS: tuple[TierEntry[Any], ...] = (cpu.ENTRY, disk.ENTRY, remote.ENTRY)
