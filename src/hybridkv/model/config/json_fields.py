"""Reading a checkpoint's JSON files, and typed access to their fields.

Every reader here raises ``ModelLoadError`` naming the file or the key when the input is
missing or of the wrong type; none of them fills a default for a required key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hybridkv.model.config.errors import ModelLoadError

_MEDIA_TOKEN_KEYS = ("image_token_index", "image_token_id", "video_token_id")


def read_config_json(model_dir: Path) -> dict[str, Any]:
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory {str(model_dir)!r} does not exist")
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(
            f"{str(model_dir)!r} has no config.json (not a Hugging Face checkpoint?)"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    if isinstance(raw.get("text_config"), dict):  # multimodal wrapper: read the text part
        media = [raw[k] for k in _MEDIA_TOKEN_KEYS if isinstance(raw.get(k), int)]
        raw = {**raw["text_config"], "architectures": raw.get("architectures")}
        raw["media_token_ids"] = media  # placeholders only the vision tower could fill
    return raw


def read_generation_eos(model_dir: Path) -> tuple[int, ...]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        return parse_eos_ids(json.loads(path.read_text()).get("eos_token_id"))
    except (json.JSONDecodeError, AttributeError):
        raise ModelLoadError(f"{path} is not a valid generation config") from None


def parse_eos_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    raise ModelLoadError(f"eos_token_id must be an int or a list of ints, got {value!r}")


def json_int(raw: Mapping[str, Any], key: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelLoadError(f"config.json: {key!r} must be an integer, got {value!r}")
    return value


def json_float(value: object) -> float:
    """A float, also in transformers 5's encoding of non-finite values ``{"__float__": "Infinity"}``."""
    if isinstance(value, dict):
        value = value.get("__float__")
    if isinstance(value, int | float | str):
        return float(value)
    raise ModelLoadError(f"config.json: expected a number, got {value!r}")
