"""The Mamba2 prefill in native code (``ssm_prefill.c``): the causal conv + SiLU over each
request's tokens and the SSM recurrence token by token, both on the state slots in place,
with the mid-chunk checkpoints (taps) written on the way.

Rows are the step's prefill requests; row r's tokens are the flat tokens ``starts[r] ..
starts[r] + lens[r] - 1`` (the step builder lays each request's tokens out contiguously).
``load_ssm_prefill()`` builds the C source like the other kernels (``hybridkv.native``) and
returns None where that is impossible or ``HYBRIDKV_NATIVE=0``; the mixer then runs the torch
path (``short_conv.conv_chunk_`` + ``ssd.ssd_chunk_scan``), which is also the test reference.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from hybridkv.native import load_library

SOURCE = Path(__file__).with_name("ssm_prefill.c")
MAX_HEAD_SPAN = 8
MAX_CONV_KERNEL = 9  # the C side keeps k - 1 <= 8 saved inputs on its stack


@dataclass(frozen=True, slots=True)
class PrefillRows:
    """The step's prefill rows: flat token start, token count and live state slot, each
    ``[R]`` int64; taps ``(rows, lens, slots)`` (``[K]`` each) or None."""

    starts: torch.Tensor
    lens: torch.Tensor
    slots: torch.Tensor
    taps: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def tap_arrays(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Taps sorted by (row, lens) as C wants them: rows, lens, slots, and per-row offsets
        ``[R + 1]`` into them."""
        rows = self.lens.shape[0]
        if self.taps is None:
            empty = torch.zeros(0, dtype=torch.int64)
            return empty, empty, empty, torch.zeros(rows + 1, dtype=torch.int64)
        t_rows, t_lens, t_slots = self.taps
        order = torch.argsort(t_rows * (int(self.lens.max()) + 1) + t_lens)
        t_rows, t_lens, t_slots = (t[order].contiguous() for t in (t_rows, t_lens, t_slots))
        ptr = torch.zeros(rows + 1, dtype=torch.int64)
        ptr[1:] = torch.cumsum(torch.bincount(t_rows, minlength=rows), 0)
        return t_rows, t_lens, t_slots, ptr


class SsmPrefillKernels:
    """The C kernels with the checks that keep them inside their buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self._conv = lib.hk_conv_chunk
        self._conv.argtypes = [ptr, ptr, ptr, ptr, i64, ptr, i64, ptr, ptr, ptr, i64, i64, i64]
        self._conv.argtypes += [ptr, ptr, ptr, i64]
        self._conv.restype = None
        self._scan = lib.hk_ssd_scan
        self._scan.argtypes = [ptr, ptr, ptr, ptr, i64, ptr, i64, i64, i64, ptr, ptr, ptr]
        self._scan.argtypes += [ptr, i64, i64, i64, i64, i64, ptr, ptr, ptr, i64]
        self._scan.restype = ctypes.c_int
        self._norm = lib.hk_gated_rms_norm
        self._norm.argtypes = [ptr, i64, ptr, i64, ptr, ptr, i64, i64, i64, ctypes.c_float]
        self._norm.argtypes += [ctypes.c_int]
        self._norm.restype = None

    def gated_rms_norm(
        self,
        y: torch.Tensor,
        gate: torch.Tensor,
        weight: torch.Tensor,
        groups: int,
        eps: float,
        gate_first: bool,
        in_place: bool = False,
    ) -> torch.Tensor:
        """``GatedRMSNorm`` of y and gate ``[T, dim]`` (rows contiguous) with weight ``[dim]``
        and ``groups`` norm groups -> ``[T, dim]`` (``y`` itself with ``in_place``: no new
        buffer to fault in); float32."""
        tokens, dim = y.shape
        _check(weight, "weight", (dim,))
        for name, t in (("y", y), ("gate", gate)):
            if t.dtype != torch.float32 or t.shape != (tokens, dim) or t.stride(1) != 1:
                raise ValueError(f"{name} must be float32 [{tokens}, {dim}] with contiguous rows")
        if groups < 1 or dim % groups:
            raise ValueError(f"{dim} channels over {groups} norm groups")
        if in_place and not y.is_contiguous():
            raise ValueError("an in-place norm needs a contiguous y")
        out = y if in_place else torch.empty(tokens, dim, dtype=torch.float32)
        self._norm(
            y.data_ptr(),
            y.stride(0),
            gate.data_ptr(),
            gate.stride(0),
            weight.data_ptr(),
            out.data_ptr(),
            tokens,
            dim,
            groups,
            eps,
            int(gate_first),
        )
        return out

    def conv_chunk_(
        self,
        states: torch.Tensor,
        rows: PrefillRows,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        in_place: bool = False,
    ) -> torch.Tensor:
        """``states`` ``[S, C, k - 1]`` (updated in place, taps written), x ``[T, C]`` (rows
        contiguous), weight ``[C, k]``, bias ``[C]`` -> ``silu(conv)`` ``[T, C]`` (rows of
        the prefill tokens set, the others uninitialised; with ``in_place`` x itself, its
        prefill rows overwritten); float32."""
        channels, k = weight.shape
        if not 2 <= k <= MAX_CONV_KERNEL:
            raise ValueError(f"conv kernel size {k} outside [2, {MAX_CONV_KERNEL}]")
        _check(states, "states", (states.shape[0], channels, k - 1))
        _check(weight, "weight", (channels, k))
        if bias is not None:
            _check(bias, "bias", (channels,))
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != channels or x.stride(1) != 1:
            raise ValueError(f"x must be float32 [T, {channels}] with contiguous rows")
        _check_rows(rows, x.shape[0], states.shape[0])
        t_rows, t_lens, t_slots, _ = rows.tap_arrays()
        out = x if in_place else torch.empty(x.shape[0], channels, dtype=torch.float32)
        wt = weight.t().contiguous()  # [k, C]: the C loop runs over channels
        self._conv(
            states.data_ptr(),
            rows.slots.data_ptr(),
            rows.starts.data_ptr(),
            rows.lens.data_ptr(),
            rows.lens.shape[0],
            x.data_ptr(),
            x.stride(0),
            wt.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            channels,
            k,
            t_rows.data_ptr(),
            t_lens.data_ptr(),
            t_slots.data_ptr(),
            t_rows.shape[0],
        )
        return out

    def ssd_scan_(
        self,
        states: torch.Tensor,
        rows: PrefillRows,
        act: torch.Tensor,
        dt: torch.Tensor,
        a: torch.Tensor,
        d: torch.Tensor | None,
        groups: int,
        y: torch.Tensor,
    ) -> None:
        """``states`` ``[S, h, p, n]`` (updated in place, taps written); act ``[T, h p + 2 g n]``
        (x, then B, then C of each token; rows contiguous), dt ``[T, h]`` (after softplus and limits), a and d
        ``[h]``; writes ``y[tok] = (S c + d x)`` ``[h p]`` for the prefill tokens; float32."""
        _check_scan(states, rows, act, dt, a, d, groups, y)
        _, heads, p_dim, n_dim = states.shape
        _, t_lens, t_slots, ptr = rows.tap_arrays()
        b_off = heads * p_dim
        failed = self._scan(
            states.data_ptr(),
            rows.slots.data_ptr(),
            rows.starts.data_ptr(),
            rows.lens.data_ptr(),
            rows.lens.shape[0],
            act.data_ptr(),
            act.stride(0),
            b_off,
            b_off + groups * n_dim,
            dt.data_ptr(),
            a.data_ptr(),
            None if d is None else d.data_ptr(),
            y.data_ptr(),
            y.stride(0),
            heads,
            groups,
            p_dim,
            n_dim,
            ptr.data_ptr(),
            t_lens.data_ptr(),
            t_slots.data_ptr(),
            _head_span(heads, rows.lens.shape[0]),
        )
        if failed:
            raise MemoryError("Mamba2 prefill scan: out of memory for its work buffers")


def _head_span(heads: int, rows: int) -> int:
    """Heads per work item of the scan: at most 8 (their states stay in L2 and a token
    block's B and C rows are reused across them), few enough for two items per thread."""
    threads = torch.get_num_threads()
    return max(1, min(MAX_HEAD_SPAN, -(-rows * heads // (2 * threads))))


def _check_scan(
    states: torch.Tensor,
    rows: PrefillRows,
    act: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    d: torch.Tensor | None,
    groups: int,
    y: torch.Tensor,
) -> None:
    """``ssd_scan_``'s buffers fit each other and its rows (ValueError or IndexError naming
    the first that does not)."""
    _, heads, p_dim, n_dim = states.shape
    tokens = act.shape[0]
    if groups < 1 or heads % groups:
        raise ValueError(f"{heads} heads over {groups} groups")
    _check(states, "states", tuple(states.shape))
    act_shape = (tokens, heads * p_dim + 2 * groups * n_dim)
    if act.dtype != torch.float32 or tuple(act.shape) != act_shape or act.stride(1) != 1:
        raise ValueError(f"act must be float32 {act_shape} with contiguous rows")
    _check(dt, "dt", (tokens, heads))
    _check(a, "a", (heads,))
    _check(y, "y", (tokens, heads * p_dim))
    if d is not None:
        _check(d, "d", (heads,))
    _check_rows(rows, tokens, states.shape[0])


def _check(t: torch.Tensor, name: str, shape: tuple[int, ...]) -> None:
    if t.dtype != torch.float32 or not t.is_contiguous() or tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected contiguous float32 {shape}, got {t.dtype}")


def _check_rows(rows: PrefillRows, tokens: int, num_slots: int) -> None:
    """Index arrays contiguous int64 of one length; tokens and slots in range."""
    count = rows.lens.shape[0]
    for name, t in (("starts", rows.starts), ("lens", rows.lens), ("slots", rows.slots)):
        if t.dtype != torch.int64 or t.shape != (count,) or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous int64 [{count}]")
    if count and (int(rows.lens.min()) < 1 or int(rows.starts.min()) < 0):
        raise ValueError("prefill rows need at least one token and a start >= 0")
    if count and int((rows.starts + rows.lens).max()) > tokens:
        raise IndexError(f"prefill tokens past the {tokens} tokens of the step")
    _check_slot_ids(rows.slots, num_slots)
    if rows.taps is not None:
        t_rows, t_lens, t_slots = rows.taps
        if not t_rows.shape == t_lens.shape == t_slots.shape or t_rows.dim() != 1:
            raise ValueError("taps: rows, lens and slots must be [K] each")
        if t_rows.numel() and (int(t_rows.min()) < 0 or int(t_rows.max()) >= count):
            raise IndexError(f"tap row out of range [0, {count})")
        if t_rows.numel() and (int(t_lens.min()) < 1 or bool((t_lens > rows.lens[t_rows]).any())):
            raise ValueError("tap lens must be in [1, the row's length]")
        _check_slot_ids(t_slots, num_slots)


def _check_slot_ids(slots: torch.Tensor, num_slots: int) -> None:
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):
        raise IndexError(f"state slot out of range [0, {num_slots})")


@functools.cache
def load_ssm_prefill(isa: str | None = None) -> SsmPrefillKernels | None:
    """The Mamba2 prefill kernels, built on first use; None (logged once) if they cannot be."""
    lib = load_library(SOURCE, "Mamba2 prefill", "using torch", isa)
    return None if lib is None else SsmPrefillKernels(lib)
