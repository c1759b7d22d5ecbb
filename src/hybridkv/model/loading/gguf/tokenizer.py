"""The tokenizer of a GGUF file rebuilt with the ``tokenizers`` library: ``tokenizer.json``,
``tokenizer_config.json`` and the chat template, as a Hugging Face checkpoint has them.

GGUF keeps a byte-level BPE tokenizer (``tokenizer.ggml.model = "gpt2"``: Qwen, Granite, GPT
style) as its vocabulary (``tokens``, id order), ``merges`` (``"a b"``, rank order), each
token's type (3 = control: special; 4 = user-defined: added, not special) and the name of its
pre-tokenizer split rule (``tokenizer.ggml.pre``). SentencePiece vocabularies
(``"llama"``: Gemma, Llama 2) are not rebuilt yet: ``--tokenizer`` names a directory with the
model's own ``tokenizer.json`` instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.gguf.file import GgufFile

CONTROL, USER_DEFINED = 3, 4
# the split rules of llama.cpp's pre-tokenizer names, as those models' tokenizer.json spell them
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {"qwen2": _QWEN2_SPLIT}
_GPT2_NAMES = ("default", "gpt-2", "gpt2")  # ByteLevel's own GPT-2 rule


def write_gguf_tokenizer(file: GgufFile, out_dir: Path) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and (if the file has one)
    ``chat_template.jinja`` into ``out_dir``."""
    kind = file.get_str("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(
            f"{file.path}: tokenizer model {kind!r} is not rebuilt from GGUF yet (byte-level "
            f"BPE 'gpt2' is); pass --tokenizer with a directory holding its tokenizer.json"
        )
    tokens = file.get_strs("tokenizer.ggml.tokens")
    types = file.get_ints("tokenizer.ggml.token_type", len(tokens))
    tok = Tokenizer(models.BPE(vocab=_vocab(file, tokens), merges=_merges(file)))
    tok.pre_tokenizer = _pre_tokenizer(file, file.get_str("tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == USER_DEFINED
        ]
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True) for t, k in zip(tokens, types, strict=True) if k == CONTROL]
    )
    config = _tokenizer_config(file, tokens)
    if config.get("add_bos_token") and config.get("bos_token"):
        bos = config["bos_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokens.index(bos))]
        )
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    if file.has("tokenizer.chat_template"):
        (out_dir / "chat_template.jinja").write_text(file.get_str("tokenizer.chat_template"))


def _vocab(file: GgufFile, tokens: list[str]) -> dict[str, int]:
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelLoadError(f"{file.path}: tokenizer.ggml.tokens has duplicate tokens")
    return vocab


def _merges(file: GgufFile) -> list[tuple[str, str]]:
    merges = []
    for line in file.get_strs("tokenizer.ggml.merges"):
        left, sep, right = line.partition(" ")
        if not sep or not left or not right:
            raise ModelLoadError(f"{file.path}: merge {line[:40]!r} is not two tokens")
        merges.append((left, right))
    return merges


def _pre_tokenizer(file: GgufFile, name: str) -> Any:
    if name in _GPT2_NAMES:
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    rule = _SPLITS.get(name)
    if rule is None:
        known = ", ".join([*_GPT2_NAMES, *_SPLITS])
        raise ModelLoadError(f"{file.path}: pre-tokenizer {name!r} is not known ({known})")
    split = pre_tokenizers.Split(Regex(rule), behavior="isolated")
    return pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def _tokenizer_config(file: GgufFile, tokens: list[str]) -> dict[str, Any]:
    def token(name: str) -> str | None:
        key = f"tokenizer.ggml.{name}_token_id"
        return tokens[file.get_int(key, high=len(tokens) - 1)] if file.has(key) else None

    add_bos = file.get("tokenizer.ggml.add_bos_token", False)
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "add_bos_token": add_bos is True,
    }
