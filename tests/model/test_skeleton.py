"""A model's skeleton is built on the meta device without running an initialiser, only in the
``with`` block and only on its thread, and an engine start never imports ``torch._dynamo``."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import torch
from torch import nn

from hybridkv.model.loading.skeleton import skeleton
from tests.support.checkpoints import SharedCheckpoints


def test_inside_parameters_are_meta_and_initialisers_do_nothing() -> None:
    marked = torch.full((3, 2), 7.0, device="cpu")
    with skeleton():
        emb, lin = nn.Embedding(5, 4), nn.Linear(4, 3)
        nn.init.normal_(marked)  # by position
        nn.init.uniform_(tensor=marked)  # by name
    assert emb.weight.is_meta and lin.weight.is_meta and lin.bias is not None and lin.bias.is_meta
    assert torch.equal(marked, torch.full((3, 2), 7.0))
    after = nn.Embedding(5, 4)  # outside: a real, drawn table again
    assert not after.weight.is_meta and after.weight.std() > 0


def test_another_thread_initialises_while_a_skeleton_is_built() -> None:
    inside, drawn = threading.Event(), threading.Event()
    seen: list[torch.Tensor] = []

    def other() -> None:
        inside.wait(30)
        seen.append(nn.Linear(8, 8).weight.detach())
        drawn.set()

    thread = threading.Thread(target=other)
    thread.start()
    with skeleton():
        inside.set()
        assert drawn.wait(30)
    thread.join()
    assert not seen[0].is_meta and seen[0].abs().sum() > 0


def test_an_engine_starts_without_torch_dynamo(shared_checkpoints: SharedCheckpoints) -> None:
    """Drawing an embedding on the meta device imported torch._dynamo and sympy (1.3 s of CPU
    at every start); a fresh interpreter builds an engine and never imports it."""
    model: Path = shared_checkpoints.get("granitemoehybrid")
    code = (
        "import sys\nfrom hybridkv import LLM\n"
        f"LLM({str(model)!r}, kv_cache_memory='64MiB')\n"
        "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["False", "False"]
