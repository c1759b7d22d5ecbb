"""A real engine busy with one long prefill step answers /health from its event loop while the
engine thread computes: a server whose step blocked the loop (a lock held across the step,
the GIL held by a long native call) could answer only between steps. The engine's answer
says whether a step runs and how many have finished, so "answered during the step" is read
from events, not from timings. The same run checks the prefill cost's counter pair."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.harness import SubprocessServer, scrape

PROMPT_LEN = 8000  # one step of the embedded tiny hybrid: ~1-2 s on two cores


@pytest.mark.slow
@pytest.mark.e2e
def test_health_answers_during_a_long_prefill_step(tmp_path: Path) -> None:
    args = ["--served-model-name", "m", "--max-num-batched-tokens", str(PROMPT_LEN),
            "--max-model-len", str(PROMPT_LEN + 8)]  # fmt: skip
    with SubprocessServer(args, tmp_path / "engine.log") as engine:
        before = httpx.get(engine.url + "/health", timeout=30).json()
        assert before["in_step"] is False
        answer: dict[str, Any] = {}

        def long_request() -> None:
            body = {"model": "m", "prompt": [5 + i % 1000 for i in range(PROMPT_LEN)],
                    "max_tokens": 1}  # fmt: skip
            answer["r"] = httpx.post(engine.url + "/v1/completions", json=body, timeout=300)

        sender = threading.Thread(target=long_request)
        sender.start()
        probes = []
        while sender.is_alive():  # one probe after another until the prefill is answered
            r = httpx.get(engine.url + "/health", timeout=60)
            assert r.status_code == 200
            probes.append(r.json())
        sender.join()
        assert answer["r"].status_code == 200
        # answered while the prefill step ran: inside a step, none finished since `before`
        during = [p for p in probes if p["in_step"] and p["num_steps"] == before["num_steps"]]
        assert len(during) >= 2, probes
        assert httpx.get(engine.url + "/health").json()["num_steps"] > before["num_steps"]
        values = scrape(engine.url)
        assert values["hybridkv:prompt_tokens_computed_total"] == PROMPT_LEN
        assert values["hybridkv:prompt_compute_seconds_total"] > 0
