"""``check_integrity()`` over the whole KV core: pools, tables, slots, reference counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridkv.kv.block_pool import NULL_BLOCK

if TYPE_CHECKING:
    from hybridkv.kv.coordinator_queries import CoordinatorQueries


def check_coordinator(coord: CoordinatorQueries) -> None:
    """Raise AssertionError naming the first broken invariant.

    - every pool: ref 0 <=> in the free queue; map and keys agree; keys match owner groups;
    - every block's ref count equals the references the tables hold on it;
    - a block in group g's table is owned by g (one owner group per block id);
    - every slot's ref count equals the references the state managers hold;
    - every state group's checkpoints (pending saves included) fit its budget;
    - requests known to the coordinator have a table in every group and a live slot (unless
      finished and kept for a transfer without state).
    """
    pool = coord.pool
    pool.check_integrity()
    refs = [0] * pool.num_items
    for m in coord.attn:
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
    for sm in coord.state:
        sm.pool.check_integrity()
        held = sm.held_refs()
        for s in range(sm.pool.num_items):
            assert held.get(s, 0) == sm.pool.ref_cnt[s], (
                f"state group {sm.group_id} slot {s}: ref count {sm.pool.ref_cnt[s]}, held {held.get(s, 0)}"
            )
        sm.check_budget()
    for req_id in coord._extra_due:
        assert all(req_id in m.tables for m in coord.attn), f"{req_id} lacks a table"
        assert req_id in coord.stateless or all(req_id in sm.live for sm in coord.state), (
            f"{req_id} lacks a live slot"
        )
