"""Sampling defaults from a checkpoint's ``generation_config.json`` (vLLM's
``--generation-config auto|vllm|PATH``).

``auto`` reads the model directory's file, ``vllm`` reads none (the library defaults), and a
path names another directory holding one. Only the keys vLLM takes are used, under vLLM's
names (``max_new_tokens`` becomes ``max_tokens``: a limit on every request's output). A
request's own values always win.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

GENERATION_CONFIG_CHOICES = ("auto", "vllm")  # or a directory path
# generation_config.json key -> SamplingParams name
SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def sampling_defaults(source: str, model_dir: str | Path) -> dict[str, Any]:
    """The sampling defaults ``source`` gives (empty for ``vllm`` or a model without the
    file); a path that is not a directory, or a file that is not JSON, is an error."""
    if source == "vllm":
        return {}
    if source == "auto":
        directory = Path(model_dir)
    else:
        directory = Path(source).expanduser()
        if not directory.is_dir():
            raise ValueError(
                f"--generation-config {source!r}: expected 'auto', 'vllm' or a directory "
                "holding generation_config.json"
            )
    path = directory / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    defaults = {name: data[key] for key, name in SAMPLING_KEYS.items() if data.get(key) is not None}
    if defaults:
        logger.info(
            "sampling defaults from %s (requests may override them; --generation-config vllm "
            "ignores the file): %s",
            path,
            defaults,
        )
    return defaults
