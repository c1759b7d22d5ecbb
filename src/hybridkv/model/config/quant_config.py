"""A checkpoint's ``quantization_config`` (``config.json``), parsed once into a typed, checked
``HubQuant``; anything unsupported is a ``ModelLoadError`` naming the field. How the quantized
tensors are read under it: ``model/loading/hub_quant.py``."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridkv.model.config.errors import ModelLoadError

FIELD = "quantization_config"
MXFP4_ARCHITECTURES = frozenset({"GptOssForCausalLM"})
MAX_BLOCK = 1 << 16
_KEYS = {
    "mxfp4": {"quant_method", "modules_to_not_convert", "dequantize"},
    "fp8": {
        "quant_method",
        "modules_to_not_convert",
        "dequantize",
        "activation_scheme",
        "weight_block_size",
        "fmt",
    },
}


@dataclass(frozen=True, slots=True)
class HubQuant:
    """A checkpoint's ``quantization_config``: ``method`` ``mxfp4`` or ``fp8``; ``block`` the
    FP8 block (rows, columns), ``None`` for MXFP4 (always 32 values along a row)."""

    method: str
    block: tuple[int, int] | None
    not_converted: tuple[str, ...]

    def converts(self, module: str) -> bool:
        """Whether ``module`` (e.g. ``model.layers.0.mlp.experts``) is stored quantized: not
        named (nor under a name, ``*`` patterns allowed) in ``modules_to_not_convert``."""
        return not any(
            fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(module, p + ".*")
            for p in self.not_converted
        )


def parse_hub_quant(raw: Mapping[str, Any], architecture: str) -> HubQuant | None:
    """The ``quantization_config`` of ``config.json`` (``raw``), None if it has none."""
    spec = raw.get(FIELD)
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ModelLoadError(f"{FIELD} must be a JSON object, got {type(spec).__name__}")
    method = spec.get("quant_method")
    if method not in _KEYS:
        raise ModelLoadError(
            f"{FIELD}.quant_method {method!r} is not supported (supported: mxfp4, fp8)"
        )
    unknown = sorted(set(spec) - _KEYS[method])
    if unknown:
        raise ModelLoadError(f"{FIELD} has keys not supported for {method}: {unknown}")
    if spec.get("dequantize", False) is not False:
        raise ModelLoadError(f"{FIELD}.dequantize must be false (the weights are quantized)")
    if method == "mxfp4" and architecture not in MXFP4_ARCHITECTURES:
        raise ModelLoadError(f"{FIELD}.quant_method mxfp4 is supported for gpt-oss only")
    block = _fp8_block(spec) if method == "fp8" else None
    return HubQuant(method, block, _module_names(spec.get("modules_to_not_convert")))


def _module_names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModelLoadError(f"{FIELD}.modules_to_not_convert must be a list of strings")
    return tuple(value)


def _fp8_block(spec: Mapping[str, Any]) -> tuple[int, int]:
    if spec.get("activation_scheme", "dynamic") != "dynamic":
        raise ModelLoadError(
            f"{FIELD}.activation_scheme {spec['activation_scheme']!r} is not supported "
            "(dynamic only: no static activation scales)"
        )
    if spec.get("fmt", "e4m3") != "e4m3":
        raise ModelLoadError(f"{FIELD}.fmt {spec['fmt']!r} is not supported (e4m3 only)")
    block = spec.get("weight_block_size")
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(type(b) is int and 0 < b <= MAX_BLOCK for b in block)
    ):
        raise ModelLoadError(
            f"{FIELD}.weight_block_size must be two integers in [1, {MAX_BLOCK}], got {block!r}"
        )
    return block[0], block[1]
