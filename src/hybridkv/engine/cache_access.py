"""``KVCacheAccess`` over the runner's cache tensors: how connectors read and write bytes."""

from __future__ import annotations

import numpy as np
import torch

from hybridkv.kv.spec import KVCacheLayout
from hybridkv.native import STRIPE, PageTable


def contiguous_runs(block_ids: list[int]) -> list[tuple[int, int, int]]:
    """``(position in block_ids, first block id, length)`` of each run of consecutive ids."""
    runs: list[tuple[int, int, int]] = []
    for pos, b in enumerate(block_ids):
        if runs and runs[-1][1] + runs[-1][2] == b:
            start, first, n = runs[-1]
            runs[-1] = (start, first, n + 1)
        else:
            runs.append((pos, b, 1))
    return runs


class DeviceCacheAccess:
    """Blocks as ``[n, group_size, layer_page_bytes]`` uint8; a state slot as flat uint8.

    A block id has one owner group at a time, so a block's bytes are the same rows of every
    backing tensor whatever its group; short groups carry padding rows that are copied too.
    Copies go run by run through numpy (memcpy speed; torch's uint8 row copies are several
    times slower on CPU).
    """

    def __init__(
        self,
        layout: KVCacheLayout,
        backing: list[torch.Tensor],
        states: dict[int, tuple[torch.Tensor, ...]],
    ) -> None:
        self.layout = layout
        self.backing = backing
        self._backing_np = [b.numpy() for b in backing]  # views sharing the tensors' memory
        self._pages = _page_table(backing)
        self.group_states = {
            g: [t for layer in layout.groups[g].layer_ids for t in states[layer]]
            for g in layout.state_group_ids
        }

    def release(self) -> None:
        """Drop every reference to the cache tensors (at engine shutdown, once the connector
        stopped): a connector that outlives its engine in an uncollected reference cycle
        then holds no device cache memory."""
        self.backing, self._backing_np, self._pages, self.group_states = [], [], None, {}

    def read_blocks(self, block_ids: list[int]) -> torch.Tensor:
        page = self.backing[0].shape[1] if self.backing else 0
        # torch's allocator: fresh large numpy buffers page-fault several times slower here
        out = torch.empty((len(block_ids), len(self.backing), page), dtype=torch.uint8)
        dst = out.numpy()  # [n, G, page]
        for pos, first, n in contiguous_runs(block_ids):
            for i, b in enumerate(self._backing_np):
                np.copyto(dst[pos : pos + n, i], b[first : first + n])
        return out

    def write_blocks(self, block_ids: list[int], data: torch.Tensor | np.ndarray) -> None:
        """``data``: ``[n, G, page]`` uint8, a CPU tensor or a numpy array (no conversion)."""
        src = data if isinstance(data, np.ndarray) else data.numpy()  # [n, G, page]
        for pos, first, n in contiguous_runs(block_ids):
            for i, b in enumerate(self._backing_np):
                np.copyto(b[first : first + n], src[pos : pos + n, i])

    def page_table(self) -> PageTable | None:
        return self._pages

    def read_state(self, group_id: int, slot: int) -> torch.Tensor:
        parts = [t[slot].reshape(-1).view(torch.uint8) for t in self.group_states[group_id]]
        return torch.cat(parts)  # [slot_bytes]

    def write_state(self, group_id: int, slot: int, data: torch.Tensor) -> None:
        offset = 0
        for t in self.group_states[group_id]:
            view = t[slot].view(-1).view(torch.uint8)
            view.copy_(data[offset : offset + view.numel()])
            offset += view.numel()
        if offset != data.numel():
            raise ValueError(
                f"state data of {data.numel()} bytes, group {group_id} slots hold {offset}"
            )


def _page_table(backing: list[torch.Tensor]) -> PageTable | None:
    """The backing tensors as addresses, when native kernels can walk them: CPU, contiguous
    ``[num_blocks, page]`` uint8 of one shape, pages a whole number of stripes."""
    if not backing:
        return None
    shape = backing[0].shape
    usable = all(
        b.device.type == "cpu" and b.dtype == torch.uint8 and b.is_contiguous() and b.shape == shape
        for b in backing
    )
    if not usable or len(shape) != 2 or shape[1] % STRIPE:
        return None
    bases = np.array([b.data_ptr() for b in backing], dtype=np.uint64)
    return PageTable(bases, int(shape[1]), int(shape[0]), tuple(backing))
