"""Structured outputs on llguidance: grammars compiled once per distinct constraint, one matcher
per request, the batch's token bitmask filled in one call.

Why llguidance (``docs/sampling.md``): it installs with no dependencies (xgrammar's wheel
requires an unpinned torch and CUDA packages) and reads our ``tokenizer.json`` directly (the
Rust ``tokenizers`` format every checkpoint here ships), so no transformers tokenizer is needed.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import llguidance
import llguidance.numpy as llnp
import numpy as np

from hybridkv.sampling.structured import StructuredOutputsParams

MAX_CACHED_GRAMMARS = 256


class GrammarBackend:
    """Compiles constraints to llguidance grammars for one tokenizer. The tokenizer is built on
    first use (about a second for a large vocabulary); compiled matchers are kept per
    constraint (LRU) and deep-copied for each request. Thread-safe: the server compiles on its
    request threads, the runner copies on the engine thread."""

    def __init__(self, model_dir: str | Path, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self._tokenizer_json = Path(model_dir) / "tokenizer.json"
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._executor: llguidance.LLExecutor | None = None

    def use_tokenizer(self, tokenizer_dir: str | Path, eos_token_ids: tuple[int, ...]) -> None:
        """Compile for another tokenizer (``--tokenizer``); forgets what was compiled."""
        with self._lock:
            self._tokenizer_json = Path(tokenizer_dir) / "tokenizer.json"
            self._eos = list(eos_token_ids)
            self._tokenizer = None
            self._cache.clear()

    def compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        """A fresh matcher for ``params`` (ValueError naming the problem if it does not
        compile)."""
        key = params.key
        with self._lock:
            pristine = self._cache.get(key)
            if pristine is not None:
                self._cache.move_to_end(key)
                return pristine.deep_copy()
        pristine = self._build(params)
        with self._lock:
            self._cache[key] = pristine
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return pristine.deep_copy()

    def fill_bitmask(self, matchers: list[llguidance.LLMatcher]) -> np.ndarray:
        """``[len(matchers), ceil(V/32)]`` int32: each row the tokens its matcher allows."""
        bitmask = llnp.allocate_token_bitmask(len(matchers), self.vocab_size)
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        llnp.fill_next_token_bitmask_par(
            self._executor, [(m, i) for i, m in enumerate(matchers)], bitmask
        )
        return bitmask

    def _build(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        grammar = _grammar(params)
        tokenizer = self._llg_tokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise ValueError(
                f"invalid sampling parameter structured_outputs.{params.kind}: {error}"
            )
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(
                f"invalid sampling parameter structured_outputs.{params.kind}: "
                f"{matcher.get_error()}"
            )
        return matcher

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                text = self._tokenizer_json.read_text(encoding="utf-8")
                self._tokenizer = llguidance.LLTokenizer(
                    text, n_vocab=self.vocab_size, eos_token=self._eos or None
                )
            return self._tokenizer


def _grammar(params: StructuredOutputsParams) -> str:
    """The llguidance grammar of a constraint (vLLM's guidance backend's mapping)."""
    kind = params.kind
    options: dict[str, Any] = {"whitespace_flexible": not params.disable_any_whitespace}
    if params.whitespace_pattern is not None:
        options["whitespace_pattern"] = params.whitespace_pattern
    try:
        if kind in ("json", "json_object"):
            schema: Any = params.json if kind == "json" else {"type": "object"}
            if isinstance(schema, str):
                schema = json.loads(schema)
            if params.disable_additional_properties and isinstance(schema, dict):
                schema = {**schema, "additionalProperties": schema.get("additionalProperties",
                                                                         False)}  # fmt: skip
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)  # type: ignore[arg-type]
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(str(params.regex))
        if kind == "choice":
            return llguidance.grammar_from("choice", json.dumps(list(params.choice or ())))
        return llguidance.grammar_from("grammar", str(params.grammar))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"invalid sampling parameter structured_outputs.{kind}: {exc}") from None
