"""The decode program runner (``runner.c``): a model's decode step as a flat array of op
records, each a call of an existing kernel with pre-bound arguments, run in one ctypes call.

``runner.c`` documents each op kind's arguments; ``hybridkv.model.compiled`` plans the ops
of a model and owns their buffers. The kernels are reached through their own libraries
(the same ``.so`` files the Python step calls, by address): the same code and numbers.
``load_runner()`` returns None where a library cannot be built or ``HYBRIDKV_NATIVE=0``.
"""

from __future__ import annotations

import ctypes
import functools
from enum import IntEnum
from pathlib import Path

from hybridkv.native import attention, gemm, load_library, quant, rownorm, ssm

SOURCE = Path(__file__).with_name("runner.c")
_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class OpKind(IntEnum):
    """``runner.c``'s op kinds."""

    NORM = 1
    NORM_ROPE = 2
    ROPE = 3
    GEMM = 4
    ATTN = 5
    ACT_MUL = 6
    MAMBA = 7
    COPY = 8
    EMBED = 9
    DIV = 10
    ARGMAX = 11


class Op(ctypes.Structure):
    """``hk_op``: a kind and its pointer, integer and float arguments (``runner.c``)."""

    _fields_ = [("kind", _I64), ("n", _I64 * 14), ("p", _P * 12), ("f", _F32 * 4)]


class AttnGroup(ctypes.Structure):
    """``hk_attn_group``: one attention group's ``KernelTable`` in this step."""

    _fields_ = [("table", _P), ("table_stride", _I64), ("window", _I64)]
    _fields_ += [("rows", _P), ("positions", _P)]


class StateGroup(ctypes.Structure):
    """``hk_state_group``: one state group's decode rows in this step."""

    _fields_ = [("slots", _P), ("tokens", _P), ("rows", _I64)]


class Step(ctypes.Structure):
    """``hk_step``: the values of one step."""

    _fields_ = [("num_tokens", _I64), ("threads", _I64), ("positions", _P)]
    _fields_ += [("attn", ctypes.POINTER(AttnGroup)), ("states", ctypes.POINTER(StateGroup))]
    _fields_ += [("ids", _P)]


# ``hk_kernels``' fields, in order, and the entry point each is
_ENTRIES = {
    "norm": "hk_rms_norm", "norm_rope": "hk_rms_norm_rope", "rope": "hk_rope",
    "act_mul": "hk_act_mul", "gemm": "hk_skinny_gemm", "qgemm": "hk_quant_gemm",
    "qgemm_i8": "hk_quant_gemm_i8", "attn": "hk_attn", "mamba": "hk_mamba_step",
    "dequant": "hk_quant_dequantize",
}  # fmt: skip


class _Kernels(ctypes.Structure):
    """``hk_kernels``: the kernels' entry points, by address."""

    _fields_ = [(name, _P) for name in _ENTRIES]


class ProgramRunner:
    """``hk_run`` with the kernels' addresses bound."""

    def __init__(self, lib: ctypes.CDLL, kernels: _Kernels) -> None:
        self._run = lib.hk_run
        self._run.argtypes = [ctypes.POINTER(_Kernels), ctypes.POINTER(Op), _I64]
        self._run.argtypes += [ctypes.POINTER(Step)]
        self._run.restype = _I64
        self._kernels = kernels

    def run(self, ops: ctypes.Array[Op], num_ops: int, step: Step) -> int:
        """Run ``ops[:num_ops]``: 0, or 1 + the index of the op that failed."""
        if num_ops > len(ops):
            raise ValueError(f"{num_ops} ops in an array of {len(ops)}")
        return int(self._run(ctypes.byref(self._kernels), ops, num_ops, ctypes.byref(step)))


def _address(lib: ctypes.CDLL, name: str) -> int:
    address = ctypes.cast(getattr(lib, name), _P).value
    assert address is not None
    return address


@functools.cache
def load_runner(isa: str | None = None) -> ProgramRunner | None:
    """The runner and every kernel it calls, built on first use; None if any cannot be."""
    names = {
        rownorm.SOURCE: ("hk_rms_norm", "hk_rms_norm_rope", "hk_rope", "hk_act_mul"),
        gemm.SOURCE: ("hk_skinny_gemm",),
        quant.SOURCE: ("hk_quant_gemm", "hk_quant_gemm_i8", "hk_quant_dequantize"),
        attention.SOURCE: ("hk_attn",),
        ssm.SOURCE: ("hk_mamba_step",),
    }
    addresses: dict[str, int] = {}
    for source, entries in names.items():
        lib = load_library(source, source.stem, "decoding in Python", isa)
        if lib is None:
            return None
        addresses.update((name, _address(lib, name)) for name in entries)
    runner = load_library(SOURCE, "decode program runner", "decoding in Python", isa)
    kernels = _Kernels(*(addresses[name] for name in _ENTRIES.values()))
    return None if runner is None else ProgramRunner(runner, kernels)
