"""B7's prediction misses by cause: replays B7's trace through ``hybridkv proxy`` (``routing.py``,
``cost`` by default) and classifies every answered request whose predicted cached tokens were
not the engine's, from the proxy's ``GET /v1/routing/predictions``::

    over             predicted more than the engine hit: blocks evicted after the decision
    in_flight        under, and a request the proxy had sent there was computing this prefix
                     (expected > predicted): the engine reused blocks that landed after the
                     decision (an engine admission signal would make it exact)
    settle_timeout   under, and an index still lagged its engine's answers when predicted
    unannounced      under otherwise: blocks stored by a request not answered yet, whose
                     events had not reached the index

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/routing_misses.py --model granitemoehybrid-tiny
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import routing

CAUSES = ("over", "in_flight", "settle_timeout", "unannounced")


def cause(record: dict[str, Any]) -> str | None:
    """A prediction record's miss cause (None: exact)."""
    if record["result"] == "exact":
        return None
    if record["result"] == "over":
        return "over"
    if record["expected_cached_tokens"] > record["predicted_cached_tokens"]:
        return "in_flight"
    return "unannounced" if record.get("settled", True) else "settle_timeout"


def classify(records: list[dict[str, Any]]) -> dict[str, Any]:
    counts = Counter(c for c in map(cause, records) if c is not None)
    missed_tokens = Counter()
    for r in records:
        c = cause(r)
        if c is not None:
            missed_tokens[c] += abs(r["actual_cached_tokens"] - r["predicted_cached_tokens"])
    return {
        "observed": len(records),
        "exact": sum(r["result"] == "exact" for r in records),
        "misses": {c: counts.get(c, 0) for c in CAUSES},
        "missed_tokens": {c: missed_tokens.get(c, 0) for c in CAUSES},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--policies" not in argv:
        argv += ["--policies", "cost"]
    report = routing.main(argv)
    out = {p: r.get("misses") for p, r in report["results"].items()}
    print(json.dumps({"benchmark": "routing_misses", "misses": out}, indent=1))
    return out


if __name__ == "__main__":
    main()
