"""Two processes share one disk directory: an engine already running when another process
stores a prefix gets disk hits for it (its lookups probe the files and adopt the units)."""

from __future__ import annotations

from pathlib import Path

from .helpers import OTHER, PROMPTS, assert_clean, counters, generate, make_llm, offload, reference
from .test_restart_and_integrity import serve_in_subprocess


def test_a_running_engine_gets_hits_for_units_another_process_stored(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    model = checkpoints["granitemoehybrid"]
    want = reference(model, [OTHER, *PROMPTS[:2]])
    b = make_llm(model, offload(disk=tmp_path))  # started before A stores anything
    assert generate(b, [OTHER])[0].token_ids == want[0]  # B is warm, with units of its own
    a = serve_in_subprocess(model, tmp_path)  # process A: serves PROMPTS[:2], stores, exits
    assert a["token_ids"] == want[1:] and a["cached"][0] == {"local": 0}
    outs = generate(b, PROMPTS[:2])
    assert [o.token_ids for o in outs] == want[1:]
    assert outs[0].cached_tokens == {"local": 0, "disk": 128}
    c = counters(b)
    assert c["adopted.disk"] == 4 and c["hits.disk"] >= 4
    assert "load_failures:missing" not in c
    assert_clean(b)
    b.engine.shutdown()
