"""A small byte-level BPE tokenizer trained offline on a built-in text, for tiny checkpoints.

Writes ``tokenizer.json``, ``tokenizer_config.json`` and a ChatML-like ``chat_template.jinja``.
The training text is generated from a fixed word list with a seeded RNG, so the tokenizer is
the same on every machine.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "or",
    "but",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "have",
    "has",
    "had",
    "do",
    "does",
    "did",
    "cache",
    "block",
    "page",
    "token",
    "layer",
    "model",
    "state",
    "window",
    "attention",
    "memory",
    "request",
    "prefix",
    "hash",
    "engine",
    "runner",
    "scheduler",
    "decode",
    "prefill",
    "chunk",
    "batch",
    "sample",
    "logits",
    "tensor",
    "shape",
    "kernel",
    "hello",
    "world",
    "question",
    "answer",
    "story",
    "river",
    "mountain",
    "forest",
    "city",
    "light",
    "dark",
    "morning",
    "night",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "time",
    "space",
    "number",
    "small",
    "large",
    "fast",
    "slow",
    "first",
    "last",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "hundred",
    "thousand",
    "zero",
    "data",
    "value",
    "read",
    "write",
    "copy",
    "move",
    "store",
    "load",
    "keep",
    "drop",
    "free",
    "full",
    "empty",
    "open",
    "close",
    "start",
    "stop",
    "end",
    "what",
    "why",
    "how",
    "when",
    "where",
    "who",
    "which",
    "that",
    "this",
    "these",
    "those",
    "there",
    "here",
    "then",
    "than",
    "with",
    "from",
    "into",
    "onto",
    "about",
    "above",
    "below",
    "under",
    "after",
    "before",
    "during",
    "while",
    "because",
    "since",
    "python",
    "torch",
    "vector",
    "matrix",
    "linear",
    "norm",
    "scale",
    "shift",
    "rotate",
    "position",
    "sequence",
    "length",
    "user",
    "assistant",
    "system",
    "message",
    "reply",
    "chat",
    "turn",
    "think",
    "plan",
    "check",
    "test",
    "pass",
    "fail",
    "error",
]


def training_text(num_sentences: int = 3000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(num_sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        punct = rng.choice(".!?,;:")
        number = str(rng.randint(0, 9999)) if rng.random() < 0.2 else ""
        lines.append(" ".join(words).capitalize() + punct + (" " + number if number else ""))
    return lines


def train_tokenizer(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text(), trainer=trainer)
    return tok


def write_tokenizer(out_dir: Path, vocab_size: int) -> int:
    """Write the tokenizer files into ``out_dir``; returns the tokenizer's vocab size."""
    tok = train_tokenizer(vocab_size)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": False,
        "model_max_length": 1 << 20,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return int(tok.get_vocab_size(with_added_tokens=True))


def special_token_ids() -> dict[str, int]:
    """Ids of the special tokens (they are added first, in this order)."""
    return {token: i for i, token in enumerate(SPECIAL_TOKENS)}
