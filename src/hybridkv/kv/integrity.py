"""``check_integrity()`` over the whole KV core: pools, tables, slots, reference counts."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from hybridkv.kv.attention_managers import BaseAttentionManager
from hybridkv.kv.block_pool import NULL_BLOCK, BlockPool
from hybridkv.kv.state_manager import StateManager


def check_coordinator(
    pool: BlockPool,
    attn: Sequence[BaseAttentionManager],
    state: Sequence[StateManager],
    admitted: Collection[str],
    stateless: Collection[str],
) -> None:
    """Raise AssertionError naming the first broken invariant.

    - every pool: ref 0 <=> in the free queue; map and keys agree; keys match owner groups;
    - every block's ref count equals the references the tables hold on it;
    - a block in group g's table is owned by g (one owner group per block id);
    - every slot's ref count equals the references the state managers hold;
    - every state group's checkpoints (pending saves included) fit its budget;
    - requests known to the coordinator (``admitted``) have a table in every group and a live slot (unless
      finished and kept for a transfer without state).
    """
    pool.check_integrity()
    refs = [0] * pool.num_items
    for m in attn:
        for req_id, table in m.tables.items():
            for b in table:
                if b == NULL_BLOCK:
                    continue
                refs[b] += 1
                assert pool.owner[b] == m.group_id, (
                    f"block {b} in group {m.group_id}'s table of {req_id} is owned by group {pool.owner[b]}"
                )
    for b in range(1, pool.num_items):
        assert refs[b] == pool.ref_cnt[b], (
            f"block {b}: ref count {pool.ref_cnt[b]}, tables hold {refs[b]}"
        )
    for sm in state:
        sm.pool.check_integrity()
        held = sm.held_refs()
        for s in range(sm.pool.num_items):
            assert held.get(s, 0) == sm.pool.ref_cnt[s], (
                f"state group {sm.group_id} slot {s}: ref count {sm.pool.ref_cnt[s]}, held {held.get(s, 0)}"
            )
        sm.check_budget()
    for req_id in admitted:
        assert all(req_id in m.tables for m in attn), f"{req_id} lacks a table"
        assert req_id in stateless or all(req_id in sm.live for sm in state), (
            f"{req_id} lacks a live slot"
        )
