"""What a router needs to know of an engine besides its events: where they are published and
how the engine hashes its blocks. Served as ``GET /kv_events`` (``server/kv_info.py``)::

    {"kv_events": {"enabled": true, "endpoint": "tcp://127.0.0.1:5557",
                   "replay_endpoint": null, "topic": ""},
     "caching": true, "block_size": 16, "hash_algo": "sha256",
     "groups": [{"kind": "full_attention", "sliding_window": null}, {"kind": "mamba", ...}]}

``groups`` are the layout's groups in ``group_idx`` order, kinds named as the events name them.
"""

from __future__ import annotations

from typing import Any

from hybridkv.kv.spec import KVCacheLayout, SlidingWindowSpec
from hybridkv.kv_events.config import KVEventsConfig
from hybridkv.kv_events.schema import SPEC_KIND

INFO_PATH = "/kv_events"


def describe_engine(
    events: KVEventsConfig | None, layout: KVCacheLayout, hash_algo: str, caching: bool
) -> dict[str, Any]:
    enabled = events is not None and events.enabled and events.publisher == "zmq"
    groups = [
        {
            "kind": SPEC_KIND[g.kind],
            "sliding_window": g.spec.sliding_window
            if isinstance(g.spec, SlidingWindowSpec)
            else None,
        }
        for g in layout.groups
    ]
    return {
        "kv_events": {
            "enabled": enabled,
            "endpoint": events.pub_endpoint if enabled and events is not None else None,
            "replay_endpoint": events.replay_endpoint if enabled and events is not None else None,
            "topic": events.topic if events is not None else "",
        },
        "caching": caching,
        "block_size": layout.block_size,
        "hash_algo": hash_algo,
        "groups": groups,
    }
