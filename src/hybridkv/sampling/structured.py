"""``StructuredOutputsParams``: the constraint a request's output must satisfy (vLLM's names).

Exactly one of ``json`` (a JSON schema, as a dict or its text), ``regex``, ``choice`` (the
output is one of the strings), ``grammar`` (EBNF, or Lark as llguidance reads it) or
``json_object`` (any JSON object) is set. The grammar engine (``grammar.py``) compiles
it once per distinct constraint and masks the tokens that cannot continue a valid output.
"""

from __future__ import annotations

import json as jsonlib
from dataclasses import dataclass
from typing import Any

from hybridkv.sampling.checks import check

MAX_CONSTRAINT_CHARS = 1 << 20  # a schema or grammar is compiled: bound its text
_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        check(
            len(given) == 1,
            "structured_outputs",
            given,
            f"exactly one of {', '.join(_KINDS)} (got {len(given)})",
        )
        self._check_values()

    def _check_values(self) -> None:
        if self.structural_tag is not None:
            raise ValueError(
                "invalid sampling parameter structured_outputs.structural_tag: not supported "
                "(use json, regex, choice, grammar or json_object)"
            )
        if isinstance(self.json, str):
            try:
                jsonlib.loads(self.json)
            except ValueError as exc:
                check(False, "structured_outputs.json", self.json, f"a JSON schema ({exc})")
        check(
            self.json is None or isinstance(self.json, str | dict),
            "structured_outputs.json",
            self.json,
            "a JSON schema (a dict or its JSON text)",
        )
        for name in ("regex", "grammar", "whitespace_pattern"):
            value = getattr(self, name)
            check(value is None or isinstance(value, str), f"structured_outputs.{name}", value,
                  "a string")  # fmt: skip
        if self.choice is not None:
            ok = bool(self.choice) and all(isinstance(c, str) for c in self.choice)
            check(ok, "structured_outputs.choice", self.choice, "a non-empty list of strings")
        check(
            len(self.key) <= MAX_CONSTRAINT_CHARS,
            "structured_outputs",
            f"<{len(self.key)} characters>",
            f"at most {MAX_CONSTRAINT_CHARS} characters",
        )

    @property
    def kind(self) -> str:
        """Which constraint is set: ``json``, ``regex``, ``choice``, ``grammar``, ``json_object``."""
        return next(k for k in _KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> str:
        """The constraint as text, identical for identical constraints (the compile cache key)."""
        value: object = getattr(self, self.kind)
        if isinstance(value, dict):
            value = jsonlib.dumps(value, sort_keys=True)
        elif isinstance(value, tuple):
            value = jsonlib.dumps(list(value))
        extra = (self.disable_any_whitespace, self.disable_additional_properties,
                 self.whitespace_pattern)  # fmt: skip
        return f"{self.kind}:{extra}:{value}"
