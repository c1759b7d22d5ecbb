"""Tokenizer over ``tokenizers.Tokenizer`` (tokenizer.json) with the checkpoint's chat template.

Special-token behaviour follows transformers 5's AutoTokenizer for the same directory: the
tokenizer.json post-processor alone decides whether BOS/EOS are added (transformers drops
``add_bos_token`` / ``add_eos_token`` from tokenizer_config.json when tokenizer.json exists).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.chat_template import (
    checkpoint_template,
    compile_template,
    render,
    template_source,
)


class Tokenizer:
    def __init__(self, model_dir: str | Path, eos_token_ids: tuple[int, ...] = ()) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{str(model_dir)!r} has no tokenizer.json")
        self._tok = HFTokenizer.from_file(str(path))
        self._config = _read_json(model_dir / "tokenizer_config.json")
        source = checkpoint_template(model_dir, self._config)
        self._template = compile_template(source) if source is not None else None
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

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        """Each id's vocabulary entry (transformers' name; None for an unknown id)."""
        return [self._tok.id_to_token(i) for i in ids]

    @property
    def eos_token_id(self) -> int | None:
        """The first end-of-sequence id (transformers' attribute)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """transformers' call shape for one text: ``{"input_ids", "attention_mask"}``."""
        ids = self.encode(text, add_special_tokens=add_special_tokens)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def set_chat_template(self, value: str) -> None:
        """Use this template (``--chat-template``: a file path or the template text)."""
        self._template = compile_template(template_source(value))

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tokenize: bool = False,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """The prompt text (token ids with ``tokenize=True``), as transformers renders it;
        ``kwargs`` are extra template variables (``enable_thinking=False``...). Raises
        ``ChatTemplateError`` (a ValueError) naming the problem."""
        template = compile_template(chat_template) if chat_template else self._template
        if template is None:
            raise ModelLoadError(
                "this checkpoint has no chat template (neither tokenizer_config.json"
                " 'chat_template' nor chat_template.jinja): pass --chat-template"
            )
        specials = {
            name: _token_text(self._config.get(name)) or ""
            for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        variables = {**specials, "tools": tools, "documents": documents, **kwargs}
        text = render(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            variables=variables,
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

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
