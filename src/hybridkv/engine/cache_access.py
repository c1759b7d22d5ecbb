"""``KVCacheAccess`` over the runner's cache tensors: how connectors read and write bytes."""

from __future__ import annotations

import torch

from hybridkv.kv.spec import KVCacheLayout


class DeviceCacheAccess:
    """Blocks as ``[n, group_size, layer_page_bytes]`` uint8; a state slot as flat uint8.

    A block id has one owner group at a time, so a block's bytes are the same rows of every
    backing tensor whatever its group; short groups carry padding rows that are copied too.
    """

    def __init__(
        self,
        layout: KVCacheLayout,
        backing: list[torch.Tensor],
        states: dict[int, tuple[torch.Tensor, ...]],
    ) -> None:
        self.layout = layout
        self.backing = backing
        self.group_states = {
            g: [t for layer in layout.groups[g].layer_ids for t in states[layer]]
            for g in layout.state_group_ids
        }

    def read_blocks(self, block_ids: list[int]) -> torch.Tensor:
        index = torch.tensor(block_ids, dtype=torch.long)
        return torch.stack([b.index_select(0, index) for b in self.backing], dim=1)  # [n, G, page]

    def write_blocks(self, block_ids: list[int], data: torch.Tensor) -> None:
        index = torch.tensor(block_ids, dtype=torch.long)
        for i, b in enumerate(self.backing):
            b.index_copy_(0, index, data[:, i])

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
