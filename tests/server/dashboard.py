"""vLLM's example Grafana dashboard against a running server: which metric each query of
``data/vllm_dashboard_queries.txt`` reads, and whether /metrics has it with the right type and
a series for the served model."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

QUERIES = Path(__file__).parent / "data" / "vllm_dashboard_queries.txt"
SAMPLE_NAME = re.compile(r"vllm:[a-z0-9_:]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def dashboard_queries() -> list[str]:
    lines = QUERIES.read_text().splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def needed_samples(queries: list[str]) -> dict[str, tuple[str, str]]:
    """sample name a query reads -> (its family, the family's type): ``x_bucket`` / ``_sum`` /
    ``_count`` of a histogram ``x``, ``x_total`` of a counter ``x``, else a gauge."""
    needed: dict[str, tuple[str, str]] = {}
    for query in queries:
        for name in SAMPLE_NAME.findall(query):
            suffix = next((s for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
            if suffix is not None:
                needed[name] = (name.removesuffix(suffix), "histogram")
            elif name.endswith("_total"):
                needed[name] = (name.removesuffix("_total"), "counter")
            else:
                needed[name] = (name, "gauge")
    return needed


def dashboard_problems(metrics_text: str, model_name: str) -> list[str]:
    """What the dashboard would miss on this /metrics page (empty: every query resolves)."""
    families = {f.name: f for f in text_string_to_metric_families(metrics_text)}
    problems = []
    for sample, (family, kind) in sorted(needed_samples(dashboard_queries()).items()):
        found = families.get(family)
        if found is None:
            problems.append(f"{sample}: no family {family}")
        elif found.type != kind:
            problems.append(f"{sample}: {family} is a {found.type}, the query needs a {kind}")
        elif not any(
            s.name == sample and s.labels.get("model_name") == model_name for s in found.samples
        ):
            problems.append(f"{sample}: no series with model_name={model_name!r}")
    return problems
