"""Load a checkpoint: config.json + safetensors (single file or sharded index) -> our model;
or a GGUF file's view directory (``gguf.view``: config.json + a ``model.gguf`` link), whose
tensors ``gguf.weights`` maps, block-quantized projections kept quantized.

The model is built on the ``meta`` device and each parameter is replaced by the checkpoint's
tensor (shape-checked, cast to the requested dtype), so nothing is initialised twice.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.config.json_fields import read_config_json, read_generation_eos
from hybridkv.model.config.model_config import ModelConfig, build_model_config
from hybridkv.model.config.quant_config import parse_hub_quant
from hybridkv.model.families.registry import check_architecture, get_family_of
from hybridkv.model.loading.gguf.file import GgufFile
from hybridkv.model.loading.gguf.view import GGUF_FILE
from hybridkv.model.loading.gguf.weights import fill_from_gguf
from hybridkv.model.loading.hub_quant import as_parameter, dequantizing_index
from hybridkv.model.loading.matmul import matmul_dtype, upcast_matmuls
from hybridkv.model.loading.skeleton import skeleton
from hybridkv.model.models.common import CausalLM

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_dtype(dtype: str) -> torch.dtype:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(
            f"unsupported model dtype {dtype!r}; expected one of {sorted(DTYPES)}"
        ) from None


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read and validate ``config.json`` (+ ``generation_config.json``) of a checkpoint dir."""
    model_dir = Path(model_dir)
    raw = read_config_json(model_dir)
    arch = check_architecture(raw.get("architectures"))
    return build_model_config(arch, raw, read_generation_eos(model_dir))


def get_model_class(architecture: str) -> type[CausalLM]:
    """Our class for a supported config.json architecture (its model file imported now)."""
    module, name = get_family_of(check_architecture([architecture])).get_class_path(architecture)
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, CausalLM)):
        raise ModelLoadError(f"{module}:{name} (for {architecture}) is not a CausalLM class")
    return cls


def load_model(
    model_dir: str | Path, dtype: str = "float32", bf16_matmul: str = "auto"
) -> tuple[CausalLM, ModelConfig]:
    """Build the architecture named in config.json and fill it from the safetensors files;
    ``bf16_matmul`` says where a bfloat16 model multiplies (``hybridkv.model.loading.matmul``)."""
    target = torch_dtype(dtype)
    compute = matmul_dtype(target, bf16_matmul)  # checks the option before the slow part
    model_dir = Path(model_dir)
    cfg = load_model_config(model_dir)
    with skeleton():
        model = get_model_class(cfg.architecture)(cfg)
    if (model_dir / GGUF_FILE).exists():  # a GGUF file's view (``gguf.view``)
        tied = frozenset({"lm_head.weight"} if cfg.tie_word_embeddings else ())
        gguf = GgufFile(model_dir / GGUF_FILE)
        fill_from_gguf(gguf, model, list(_parameters(model)), cfg.num_hidden_layers, target, tied)
    else:
        _fill_from_safetensors(model, cfg, model_dir, target)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embedding().weight
        model.lm_head.quant = getattr(model.embedding(), "quant", None)  # GGUF blocks
    if compute != target:
        upcast_matmuls(model, compute)
    return model.eval(), cfg


def _fill_from_safetensors(
    model: CausalLM, cfg: ModelConfig, model_dir: Path, target: torch.dtype
) -> None:
    renames = get_family_of(cfg.architecture).renames
    quant = parse_hub_quant(cfg.raw, cfg.architecture)  # the Hub's MXFP4 / FP8 checkpoints
    with ExitStack() as stack:
        index = dequantizing_index(_tensor_index(model_dir, stack), quant)
        for name, module, attr in _parameters(model):
            if cfg.tie_word_embeddings and name == "lm_head.weight":
                continue
            declared = getattr(module, attr)
            names = _spellings(name, renames, model.checkpoint_prefixes)
            tensor = _read(index, names, tuple(declared.shape))
            param = as_parameter(name, tensor, target, declared.dtype)
            module._parameters[attr] = nn.Parameter(param, requires_grad=False)
        _log_ignored(index, model.ignored_prefixes, cfg.architecture)


def _parameters(model: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
    for module_name, module in model.named_modules():
        for attr, param in list(module._parameters.items()):
            if param is None:  # e.g. a Linear without bias
                continue
            yield (f"{module_name}.{attr}" if module_name else attr), module, attr


def _tensor_index(model_dir: Path, stack: ExitStack) -> dict[str, Any]:
    """Tensor name -> open safetensors handle that holds it."""
    single = model_dir / "model.safetensors"
    index_path = model_dir / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index_path.is_file():
        files = _shard_files(model_dir, index_path)
    else:
        raise ModelLoadError(
            f"{str(model_dir)!r} has no model.safetensors nor model.safetensors.index.json"
        )
    index: dict[str, Any] = {}
    for path in files:
        try:
            handle = stack.enter_context(safe_open(str(path), framework="pt"))
        except Exception as exc:  # safetensors raises its own error types
            raise ModelLoadError(f"cannot read weights file {path}: {exc}") from None
        index.update(dict.fromkeys(handle.keys(), handle))
    return index


def _shard_files(model_dir: Path, index_path: Path) -> list[Path]:
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ModelLoadError(f"{index_path} has no valid 'weight_map'") from None
    files = [model_dir / name for name in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelLoadError(f"{index_path.name} names shard files that do not exist: {missing}")
    return files


def _log_ignored(index: dict[str, Any], prefixes: tuple[str, ...], arch: str) -> None:
    if not prefixes:
        return
    skipped = [k for k in index if k.startswith(prefixes)]
    if skipped:
        log.warning("%s: skipped %d vision-tower weights (text model only)", arch, len(skipped))


def _read(index: dict[str, Any], names: list[str], shape: tuple[int, ...]) -> torch.Tensor:
    for candidate in names:
        tensor = _lookup(index, candidate)
        if tensor is None:
            continue
        if tuple(tensor.shape) != shape:
            raise ModelLoadError(
                f"weight {candidate!r} has shape {tuple(tensor.shape)}, expected {shape}"
            )
        return tensor
    raise ModelLoadError(f"weight {names[0]!r} is missing from the checkpoint")


def _lookup(index: dict[str, Any], name: str) -> torch.Tensor | None:
    """``name`` itself, or an ``[E, ...]`` stack of per-expert tensors: ``a.experts.w`` from
    ``a.experts.{e}.w.weight`` (the layout Nemotron-H and older MoE checkpoints use)."""
    if name in index:
        tensor: torch.Tensor = index[name].get_tensor(name)
        return tensor
    head, sep, leaf = name.rpartition(".experts.")
    if not sep or "." in leaf:
        return None
    parts: list[torch.Tensor] = []
    while (key := f"{head}.experts.{len(parts)}.{leaf}.weight") in index:
        parts.append(index[key].get_tensor(key))
    return torch.stack(parts) if parts else None


def _spellings(
    name: str, renames: Mapping[str, tuple[str, ...]], prefixes: tuple[tuple[str, str], ...]
) -> list[str]:
    """``name``, the family's other spellings of its suffix, each under the class's prefixes."""
    names = [name]
    for ours, others in renames.items():
        if name.endswith(ours):
            names += [name[: -len(ours)] + other for other in others]
    for ours_prefix, theirs in prefixes:
        names += [theirs + n[len(ours_prefix) :] for n in names if n.startswith(ours_prefix)]
    return names
