"""Device memory for the KV cache, allocated exactly as ``KVCacheLayout`` places it.

Attention: ``group_size`` byte tensors ``[num_blocks, layer_page_bytes]``; the i-th layer of
every attention group reads and writes backing tensor i through a typed view
``[num_blocks, 2, B, kv_heads, head_dim]`` (K then V), so one block id means the same bytes
in every group. State: per state group and layer, one tensor per state entry, each
``[num_state_slots, *shape]``; slot s of all of them is the group's slot s.
"""

from __future__ import annotations

import torch

from hybridkv.kv.spec import FullAttentionSpec, KVCacheLayout, SlidingWindowSpec, StateSpec
from hybridkv.model.loading.loader import torch_dtype
from hybridkv.model.step.host_memory import zeros_huge


class CacheTensors:
    def __init__(
        self,
        layout: KVCacheLayout,
        num_blocks: int,
        num_state_slots: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.layout = layout
        self.num_blocks = num_blocks
        self.num_state_slots = num_state_slots
        self.backing = [  # huge pages: fewer TLB misses, faster same-host NIXL reads
            zeros_huge((num_blocks, layout.layer_page_bytes), torch.uint8, device)
            for _ in range(layout.group_size if layout.attention_group_ids else 0)
        ]
        self.kv_pages: dict[int, torch.Tensor] = {}
        self.states: dict[int, tuple[torch.Tensor, ...]] = {}
        self._group_states: dict[int, list[torch.Tensor]] = {}
        for group in layout.groups:
            if isinstance(group.spec, StateSpec):
                self._allocate_state_group(group.group_id, group.layer_ids, group.spec, device)
            else:
                for index, layer_id in enumerate(group.layer_ids):
                    self.kv_pages[layer_id] = self._page_view(self.backing[index], group.spec)

    def _page_view(
        self, backing: torch.Tensor, spec: FullAttentionSpec | SlidingWindowSpec
    ) -> torch.Tensor:
        typed = backing[:, : spec.page_bytes].view(torch_dtype(spec.dtype))  # [N, page_elems]
        return typed.view(self.num_blocks, 2, spec.block_size, spec.num_kv_heads, spec.head_size)

    def _allocate_state_group(
        self,
        group_id: int,
        layer_ids: tuple[int, ...],
        spec: StateSpec,
        device: torch.device | str,
    ) -> None:
        tensors: list[torch.Tensor] = []
        for layer_id in layer_ids:
            per_layer = tuple(
                torch.zeros(self.num_state_slots, *shape, dtype=torch_dtype(dtype), device=device)
                for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)
            )
            self.states[layer_id] = per_layer
            tensors.extend(per_layer)
        self._group_states[group_id] = tensors

    def copy_slot(self, group_id: int, src_slot: int, dst_slot: int) -> None:
        """Copy every layer's state of ``src_slot`` onto ``dst_slot`` within one state group."""
        self._check_slot(group_id, src_slot)
        self._check_slot(group_id, dst_slot)
        for tensor in self._group_states[group_id]:
            tensor[dst_slot] = tensor[src_slot]

    def zero_slots(self, group_id: int, slots: list[int]) -> None:
        if not slots:
            return
        index = torch.tensor(slots, dtype=torch.long)
        for tensor in self._group_states[group_id]:
            tensor[index] = 0

    def _check_slot(self, group_id: int, slot: int) -> None:
        if group_id not in self._group_states:
            raise ValueError(f"group {group_id} is not a state group of this layout")
        if not 0 <= slot < self.num_state_slots:
            raise ValueError(f"state slot {slot} out of range [0, {self.num_state_slots})")
