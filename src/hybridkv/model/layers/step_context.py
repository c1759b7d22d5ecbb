"""Per-step tensors the layers read: positions, per-group attention and state metadata.

Tokens of all scheduled requests are flattened in request order (``T`` tokens)::

    | req 0: n0 tokens | req 1: n1 tokens | ... |      token t -> (request, offset)

The runner builds every tensor here once per step; each layer only looks up its own group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridkv.native.attention import AttentionKernels, KernelTable


@dataclass(frozen=True, slots=True)
class AttnSubBatch:
    """Requests attended together: queries padded to ``[R, Q]``, keys gathered by block."""

    token_idx: torch.Tensor  # [Tb] flat token index of each query
    rows: torch.Tensor  # [Tb] request row in the sub-batch
    cols: torch.Tensor  # [Tb] query offset within the row
    block_table: torch.Tensor  # [R, nb] blocks to read, first one holds key position first_pos
    mask: torch.Tensor | None  # [R, 1, Q, nb * B] bool, True = attend; None when causal
    hidden_keys: torch.Tensor  # [R or 1, 1, nb * B, 1] bool: key slots no query of the row sees
    num_queries: int  # Q
    dense: bool  # the step's tokens are exactly [R, Q] in order: no padding, no scatter
    causal: bool  # dense, every row starts at 0 and no window cuts in: plain causal mask


@dataclass(frozen=True, slots=True)
class AttnMeta:
    """One attention group in one step: where K/V are written, how they are read."""

    write_blocks: torch.Tensor  # [T] block id of each token's K/V
    write_offsets: torch.Tensor  # [T] offset inside that block
    sub_batches: tuple[AttnSubBatch, ...]


@dataclass(frozen=True, slots=True)
class StateTaps:
    """States a prefill hands back from inside its scan (checkpoints due mid-chunk): tap k is
    the state of prefill row ``rows[k]`` after ``lens[k]`` of its tokens (``1 <= lens[k] <=``
    the row's length), written into slot ``slots[k]`` (conv inputs and recurrent state)."""

    rows: torch.Tensor  # [K] prefill row
    lens: torch.Tensor  # [K]
    slots: torch.Tensor  # [K]


@dataclass(frozen=True, slots=True)
class KernelAttnMeta:
    """One attention group in one step, on the native kernels: they write and read K/V
    through the block table in place (no gathered context, no masks)."""

    table: KernelTable
    kernels: AttentionKernels


@dataclass(frozen=True, slots=True)
class StateMeta:
    """One state group in one step. Decode requests (1 token) take the recurrent step; the
    others are padded to ``[R, L]`` (left-aligned) for the chunked scan."""

    decode_token_idx: torch.Tensor  # [Rd] flat token index
    decode_slots: torch.Tensor  # [Rd] live slot
    decode_slot_run: slice | None  # the same slots when they are one ascending run
    prefill_gather: torch.Tensor  # [Rp, L] flat token index (0 where padding)
    prefill_valid: torch.Tensor  # [Rp, L] bool
    prefill_lens: torch.Tensor  # [Rp]
    prefill_slots: torch.Tensor  # [Rp] live slot
    prefill_token_idx: torch.Tensor  # [sum(lens)] = prefill_gather[prefill_valid]
    taps: StateTaps | None = None

    @property
    def has_decode(self) -> bool:
        return self.decode_token_idx.numel() > 0

    @property
    def has_prefill(self) -> bool:
        return self.prefill_lens.numel() > 0


@dataclass(frozen=True, slots=True)
class StepContext:
    positions: torch.Tensor  # [T]
    max_position: int
    kv_pages: dict[int, torch.Tensor]  # layer id -> [num_blocks, 2, B, kv_heads, head_dim]
    attn_meta: dict[int, AttnMeta | KernelAttnMeta]  # layer id -> its group's metadata
    states: dict[int, tuple[torch.Tensor, ...]]  # layer id -> state tensors [num_slots, ...]
    state_meta: dict[int, StateMeta]  # layer id -> its group's metadata
