"""Tokenizer over ``tokenizers.Tokenizer`` (tokenizer.json) with the checkpoint's chat template.

Special-token behaviour follows transformers 5's AutoTokenizer for the same directory: the
tokenizer.json post-processor alone decides whether BOS/EOS are added (transformers drops
``add_bos_token`` / ``add_eos_token`` from tokenizer_config.json when tokenizer.json exists).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from hybridkv.model.errors import ModelLoadError


class Tokenizer:
    def __init__(self, model_dir: str | Path, eos_token_ids: tuple[int, ...] = ()) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{str(model_dir)!r} has no tokenizer.json")
        self._tok = HFTokenizer.from_file(str(path))
        self._config = _read_json(model_dir / "tokenizer_config.json")
        self._template = _read_template(model_dir, self._config)
        self.bos_token = _token_text(self._config.get("bos_token"))
        self.eos_token = _token_text(self._config.get("eos_token"))
        self.bos_token_id = self._id_of(self.bos_token)
        eos_id = self._id_of(self.eos_token)
        own = (eos_id,) if eos_id is not None else ()
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids + own))

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def max_token_chars(self) -> int:
        """An upper bound on the characters of text one token stands for (its vocabulary entry
        has one character per byte or more): a text longer than ``n * max_token_chars`` has
        more than ``n`` tokens."""
        return max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not text.isascii():
            _check_unicode(text)
        # NOTE: encode_batch releases the GIL (encode does not): a long text tokenized on a
        # worker thread then does not stop the server's event loop. Same ids.
        batch = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(batch[0].ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        if self._template is None:
            raise ModelLoadError(
                "this checkpoint has no chat template (neither tokenizer_config.json"
                " 'chat_template' nor chat_template.jinja)"
            )
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"the text is not valid Unicode: a lone surrogate U+{ord(text[exc.start]):04X} "
            f"at character {exc.start}"
        ) from None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_template(model_dir: Path, config: dict[str, Any]) -> jinja2.Template | None:
    source = config.get("chat_template")
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        source = jinja_file.read_text()
    if isinstance(source, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str):
        return None
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = _tojson  # like transformers: no HTML escaping
    return env.from_string(source)


def _tojson(value: object, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)
