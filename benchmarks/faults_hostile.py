"""B5's hostile-directory rows: the offloading disk tier serving prompts from a directory whose
parts were replaced by FIFOs, symlinks, forged, foreign, truncated, huge and half-written files
(``tests/support/hostile_dir.py``, planted again before every run, since each run recomputes
and re-stores what it could not use).

    disk clean     every prompt an external hit loaded from the disk tier (device cache reset)
    hostile dir    the same, every stored part damaged one way or another before the run

All clean runs come first (a run after a hostile one would meet the damage it left), so the
two rows are not interleaved like B5's other rows.

Tokens are compared with the cold run's; ``startup_s`` is a new engine's start-up (its scan
of the hostile directory included)."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _config(store: Path) -> dict[str, Any]:
    extra = {"disk_path": str(store), "disk_bytes": "1GiB", "chunk_tokens": 32}
    return {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}


def bench_hostile(
    model: Path, prompts: list[list[int]], output_len: int, rounds: int, llm_kw: dict[str, Any]
) -> dict[str, Any]:
    """Rows ``disk clean`` and ``hostile dir`` in B5's row format, plus ``startup_s``."""
    from hybridkv import LLM, SamplingParams

    sys.path.insert(0, str(ROOT))
    from tests.support.hostile_dir import make_hostile

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    with tempfile.TemporaryDirectory(prefix="hybridkv-b5-hostile-") as tmp:
        store, outside = Path(tmp) / "kv", Path(tmp) / "outside" / "file"
        outside.parent.mkdir()
        outside.write_bytes(b"outside")
        llm = LLM(str(model), kv_transfer_config=_config(store), **llm_kw)
        reference = [list(o.token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        # NOTE: all clean runs first: a run after a hostile one meets the damage it left
        runs: dict[str, list[dict[str, Any]]] = {"disk clean": [], "hostile dir": []}
        for name in runs:
            for _ in range(1 + rounds):  # the first run of each warms up and is not kept
                if name == "hostile dir":
                    make_hostile(store, outside)
                runs[name].append(_run(llm, prompts, params, reference))
        llm.engine.shutdown()
        began = time.perf_counter()
        again = LLM(str(model), kv_transfer_config=_config(store), **llm_kw)
        startup_s = time.perf_counter() - began
        again.engine.shutdown()
        assert outside.read_bytes() == b"outside"
    rows = {
        name: _row(rs[1:], runs["disk clean"][1:], len(prompts) * output_len)
        for name, rs in runs.items()
    }
    return {"rows": rows, "startup_s": startup_s}


def _connector_load_failures(engine: Any) -> int:
    """Load failures the connector counted since start (its children folded in)."""
    connector = engine.stats().transfer.connector
    return sum(connector.flatten().load_failures.values()) if connector is not None else 0


def _run(
    llm: Any, prompts: list[list[int]], params: Any, reference: list[list[int]]
) -> dict[str, Any]:
    engine = llm.engine
    assert engine.kv.reset_prefix_cache(), "the engine must be idle between runs"
    stats = engine.scheduler.transfer.stats
    before_failures = _connector_load_failures(engine)
    before_recomputed = stats.recomputed_tokens
    began = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - began
    failures = _connector_load_failures(engine)
    ttfts = [o.metrics["ttft_s"] for o in outs if "ttft_s" in o.metrics]
    return {
        "wall_s": wall,
        "ttft_s": statistics.median(ttfts) if ttfts else float("nan"),
        "wrong": sum(
            sum(a != b for a, b in zip(list(o.token_ids), want, strict=False))
            + abs(len(o.token_ids) - len(want))
            for o, want in zip(outs, reference, strict=True)
        ),
        "errored": sum(o.finish_reason == "error" for o in outs),
        "disk_tokens": sum(o.cached_tokens.get("disk", 0) for o in outs),
        "failures": failures - before_failures,
        "recomputed_tokens": stats.recomputed_tokens - before_recomputed,
    }


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _row(rs: list[dict[str, Any]], base: list[dict[str, Any]], out_tokens: int) -> dict[str, Any]:
    return {
        "faults": {},
        "runs": len(rs),
        "output_tok_s": _summary([out_tokens / r["wall_s"] for r in rs]),
        "ttft_ms": _summary([1000 * r["ttft_s"] for r in rs]),
        "time_vs_0pct": _summary(
            [r["wall_s"] / b["wall_s"] for r, b in zip(rs, base, strict=True)]
        ),
        "recomputed_tokens_per_run": statistics.mean(r["recomputed_tokens"] for r in rs),
        "failures_per_run": statistics.mean(r["failures"] for r in rs),
        "failed_requests_per_run": 0.0,
        "disk_tokens_per_run": statistics.mean(r["disk_tokens"] for r in rs),
        "wrong_tokens": sum(r["wrong"] for r in rs),
        "errored_requests": sum(r["errored"] for r in rs),
    }
