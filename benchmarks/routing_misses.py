"""B7's prediction misses by cause: replays B7's trace through ``hybridkv proxy`` (``routing.py``,
``cost`` by default) and classifies every answered request whose predicted cached tokens were
not the engine's, from the proxy's ``GET /v1/routing/predictions``::

    over             predicted more than the engine hit: blocks evicted after the decision,
                     or (dispatched) a landed hit the engine did not wait for
    wait_timeout     under, the prefill wait ran out (the first-byte timeout) before the
                     source landed
    waited           under after a prefill wait that saw the source land
    dispatched       under, sent at once with the landed hit predicted (attention-only)
    settle_timeout   under, and an index still lagged its engine's answers when predicted
    unannounced      under otherwise: blocks stored by a request not answered yet, whose
                     events had not reached the index

Each miss's record names the decision it followed (``source``: the one that was computing
its prefix on that engine) and how long it waited; the report's ``missed`` lists every
miss with its cause and its source's record.

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/routing_misses.py --model granitemoehybrid-tiny
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import routing

CAUSES = ("over", "wait_timeout", "waited", "dispatched", "settle_timeout", "unannounced")
WAIT_CAUSES = {"timeout": "wait_timeout", "landed": "waited", "dispatched": "dispatched"}


def cause(record: dict[str, Any]) -> str | None:
    """A prediction record's miss cause (None: exact)."""
    if record["result"] == "exact":
        return None
    if record["result"] == "over":
        return "over"
    wait = WAIT_CAUSES.get(record.get("prefill_wait", ""))
    if wait is not None:
        return wait
    return "unannounced" if record.get("settled", True) else "settle_timeout"


def classify(records: list[dict[str, Any]]) -> dict[str, Any]:
    counts = Counter(c for c in map(cause, records) if c is not None)
    missed_tokens = Counter()
    for r in records:
        c = cause(r)
        if c is not None:
            missed_tokens[c] += abs(r["actual_cached_tokens"] - r["predicted_cached_tokens"])
    by_id = {r.get("id"): r for r in records}
    return {
        "observed": len(records),
        "missed": [_missed(r, by_id) for r in records if cause(r) is not None],
        "exact": sum(r["result"] == "exact" for r in records),
        "misses": {c: counts.get(c, 0) for c in CAUSES},
        "missed_tokens": {c: missed_tokens.get(c, 0) for c in CAUSES},
    }


def _missed(record: dict[str, Any], by_id: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """A miss with its cause and the record of the decision it followed (if answered)."""
    out = {"cause": cause(record), **record}
    source = by_id.get(record.get("source")) if record.get("source") is not None else None
    if source is not None:
        out["source_record"] = {
            k: source.get(k) for k in ("id", "engine", "result", "prefill_wait")
        }
    return out


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
