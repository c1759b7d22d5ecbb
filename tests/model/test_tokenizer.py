"""Tokenizer wrapper against transformers' AutoTokenizer on the same directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.tokenizer import Tokenizer

TEXTS = [
    "Hello world, the cache block is full.",
    "  two  spaces\nand a newline 1234",
    "émoji 🙂 ok",
]


def test_encode_decode_match_auto_tokenizer(hf_checkpoints: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    model_dir = hf_checkpoints["qwen3"]
    ours, ref = Tokenizer(model_dir), AutoTokenizer.from_pretrained(model_dir)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref(text)["input_ids"]
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True) == text


def test_bos_comes_from_the_post_processor_like_auto_tokenizer(
    hf_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import processors
    from transformers import AutoTokenizer

    model_dir = shutil.copytree(hf_checkpoints["qwen3"], tmp_path / "m")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.update(bos_token="<|endoftext|>", add_bos_token=True)  # ignored, as in transformers 5
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer(model_dir).encode(TEXTS[0])[0] != 0
    raw = RawTokenizer.from_file(str(model_dir / "tokenizer.json"))
    raw.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    raw.save(str(model_dir / "tokenizer.json"))
    ours, ref = Tokenizer(model_dir), AutoTokenizer.from_pretrained(model_dir)
    for text in TEXTS:
        assert ours.encode(text) == ref(text)["input_ids"]
    assert ours.encode(TEXTS[0])[0] == 0
    assert ours.encode(TEXTS[0], add_special_tokens=False)[0] != 0


def test_chat_template_and_eos(hf_checkpoints: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    model_dir = hf_checkpoints["qwen3"]
    messages = [{"role": "user", "content": "hi"}]
    ours = Tokenizer(model_dir, eos_token_ids=(2, 0))
    text = ours.apply_chat_template(messages)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ref = AutoTokenizer.from_pretrained(model_dir)
    assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.eos_token_ids == (2, 0)
    assert ours.decode(ours.encode(text)) == "user\nhi\nassistant\n"


def test_missing_template_and_tokenizer(hf_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model_dir = shutil.copytree(hf_checkpoints["qwen3"], tmp_path / "m")
    (model_dir / "chat_template.jinja").unlink()
    with pytest.raises(ModelLoadError, match="no chat template"):
        Tokenizer(model_dir).apply_chat_template([{"role": "user", "content": "x"}])
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        Tokenizer(model_dir)


def test_encode_lets_other_threads_run_and_bounds_token_length(
    hf_checkpoints: dict[str, Path],
) -> None:
    """The server tokenizes on a worker thread: that only helps if encoding releases the GIL
    (``tokenizers``' ``encode`` holds it, ``encode_batch`` does not). ``max_token_chars``
    bounds how much text one token covers (the server's early length check)."""
    import threading
    import time

    tok = Tokenizer(hf_checkpoints["qwen3"])
    text = "the cache block is full, " * 40_000  # 1 MB: about a second to encode
    done: list[list[int]] = []
    worker = threading.Thread(target=lambda: done.append(tok.encode(text)))
    ticks = 0
    worker.start()
    while worker.is_alive():
        time.sleep(0.001)
        ticks += 1
    assert ticks >= 20, ticks  # the main thread kept running while it encoded
    assert done[0] == tok.encode(text) and len(done[0]) > 0
    assert len(text) <= len(done[0]) * tok.max_token_chars
    with pytest.raises(ValueError, match="lone surrogate U\\+D800"):
        tok.encode("a\ud800")
