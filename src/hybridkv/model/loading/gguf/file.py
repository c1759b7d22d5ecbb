"""A GGUF file, opened once and read through typed, bounded accessors.

The ``gguf`` package parses the header and memory-maps the file (``numpy.memmap``, read
only): a tensor's ``data`` is a view of the mapped bytes, nothing is read until touched. A file
is outside input: any parse failure (truncated, forged counts or offsets, an unknown tensor
type) is a ``ModelLoadError`` naming the file, and every metadata value is checked for its
type and range where it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybridkv.model.config.errors import ModelLoadError

MAX_DIM = 1 << 24  # any size read from metadata: layers, heads, widths, lengths


@dataclass(frozen=True, slots=True)
class GgufTensor:
    """One tensor: its GGUF type number, its numpy-order shape (``[rows, cols]`` for a
    weight), and its mapped data (float / int arrays as typed, block formats as uint8
    ``[rows, row_bytes]``)."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    data: np.ndarray[Any, Any]


class GgufFile:
    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        self.path = path
        try:
            reader = GGUFReader(path, "r")
            fields = {name: field.contents() for name, field in reader.fields.items()}
            self.tensors = {t.name: _tensor(t) for t in reader.tensors}
        except (ValueError, OSError, KeyError, IndexError, TypeError) as exc:
            raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from None
        self._fields: dict[str, Any] = fields
        self.architecture = self.get_str("general.architecture")

    def has(self, key: str) -> bool:
        return key in self._fields

    def get(self, key: str, default: Any = None) -> Any:
        return self._fields.get(key, default)

    def get_str(self, key: str, default: str | None = None) -> str:
        value = self._fields.get(key, default)
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        return value

    def get_int(
        self, key: str, default: int | None = None, low: int = 0, high: int = MAX_DIM
    ) -> int:
        value = self._fields.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._bad(key, f"an integer in [{low}, {high}]", value)
        return value

    def get_float(self, key: str, default: float | None = None) -> float:
        value = self._fields.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise self._bad(key, "a finite number", value)
        # GGUF stores float32: its shortest decimal (1e-06, not 9.99999997e-07), as config.json
        return float(str(np.float32(value)))

    def get_strs(self, key: str) -> list[str]:
        value = self._fields.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, "a list of strings", value)
        return value

    def get_ints(self, key: str, length: int) -> list[int]:
        value = self._fields.get(key)
        if (
            not isinstance(value, list)
            or len(value) != length
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            raise self._bad(key, f"a list of {length} integers", value)
        return value

    def _bad(self, key: str, expected: str, value: Any) -> ModelLoadError:
        shown = repr(value)[:80] if value is not None else "missing"
        return ModelLoadError(f"{self.path}: metadata {key!r} must be {expected}, got {shown}")


def _tensor(t: Any) -> GgufTensor:
    ne = [int(d) for d in t.shape]  # GGUF order: innermost first
    return GgufTensor(str(t.name), int(t.tensor_type), tuple(reversed(ne)), t.data)
