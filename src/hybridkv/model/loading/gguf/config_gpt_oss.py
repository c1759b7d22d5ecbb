"""``config.json`` of gpt-oss from GGUF (``gpt-oss``). llama.cpp hard-codes what the converter
does not write: every even layer slides (``sliding_window``), the odd ones attend fully; the
clamped SwiGLU's ``alpha`` 1.702 and ``limit`` 7.0; YaRN without truncated correction dims (the
released checkpoints' ``truncate: false``). Experts stored as ggml MXFP4 make the config say
``quantization_config: mxfp4`` so the model holds them as ``Mxfp4Experts`` (``sources_gpt_oss``
repacks the blocks)."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.gguf.file import GgufFile
from hybridkv.model.loading.gguf.hparams import common_config
from hybridkv.model.loading.gguf.rewrites import GGML_MXFP4


def gpt_oss(file: GgufFile) -> dict[str, Any]:
    config, a = common_config(file), file.architecture
    layers = config["num_hidden_layers"]
    experts = file.get_int(f"{a}.expert_count", low=1, high=1 << 16)
    config.update(
        architectures=["GptOssForCausalLM"],
        model_type="gpt_oss",
        intermediate_size=file.get_int(f"{a}.expert_feed_forward_length", low=1),
        num_local_experts=experts,
        num_experts_per_tok=file.get_int(f"{a}.expert_used_count", low=1, high=experts),
        sliding_window=file.get_int(f"{a}.attention.sliding_window", low=1),
        layer_types=[
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
        ],
        attention_bias=True,
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
        rope_parameters=_rope(file, config["rope_theta"]),
    )
    if _experts_in_mxfp4(file):
        config["quantization_config"] = {"quant_method": "mxfp4"}
    return config


def _rope(file: GgufFile, theta: float) -> dict[str, Any]:
    a = file.architecture
    kind = file.get_str(f"{a}.rope.scaling.type", "none")
    if kind == "none":
        return {"rope_type": "default", "rope_theta": theta}
    if kind != "yarn":
        raise ModelLoadError(f"{file.path}: gpt-oss RoPE scaling {kind!r} is not supported")
    return {
        "rope_type": "yarn",
        "rope_theta": theta,
        "factor": file.get_float(f"{a}.rope.scaling.factor"),
        "original_max_position_embeddings": file.get_int(
            f"{a}.rope.scaling.original_context_length", low=1
        ),
        "beta_fast": file.get_float(f"{a}.rope.scaling.yarn_beta_fast", 32.0),
        "beta_slow": file.get_float(f"{a}.rope.scaling.yarn_beta_slow", 1.0),
        "truncate": False,
    }


def _experts_in_mxfp4(file: GgufFile) -> bool:
    """Every layer's three expert stacks MXFP4 (the model holds one kind for all); a file
    that mixes MXFP4 experts with others is refused rather than half read."""
    kinds = {
        t.ggml_type == GGML_MXFP4
        for name, t in file.tensors.items()
        if name.endswith("_exps.weight")
    }
    if len(kinds) > 1:
        raise ModelLoadError(
            f"{file.path}: some expert stacks are MXFP4 and some are not (llama-quantize "
            "falls back per tensor when a width is not a multiple of 32): not supported"
        )
    return kinds == {True}
