"""The checkpoint book's value policy on small cases (granite layout, block size 4): scan
resistance, value by recompute avoided, reuse learned from where requests resume, links worth
what their continuation misses, a shared head kept, held checkpoints never evicted."""

from __future__ import annotations

import logging

import pytest

from hybridkv.kv.checkpoint_counters import EvictReason
from hybridkv.kv.checkpoint_value import PRIOR_REUSE, recompute_cost
from hybridkv.kv.checkpoints import CheckpointKind, CheckpointPolicy
from hybridkv.kv.coordinator import KVCacheCoordinator
from tests.kv.builders import FakeRequest, make_coordinator


def _scan(max_checkpoints: int) -> KVCacheCoordinator:
    return make_coordinator(
        "granite", num_blocks=96, num_state_slots=16, states_from_scan=True,
        max_checkpoints=max_checkpoints,
    )  # fmt: skip


def _serve(coord: KVCacheCoordinator, req: FakeRequest, reply: tuple[int, ...] = ()) -> int:
    """Admit and prefill in one step, then the reply token by token (a chat turn), free;
    returns the hit."""
    hit = coord.find_cache_hit(req)
    assert coord.allocate(req, req.num_tokens - hit.num_tokens, hit)
    for token in [None, *reply]:
        if token is not None:
            req.append(token)
            assert coord.allocate(req, 1)
        coord.take_state_copies()
        req.num_computed_tokens = req.num_tokens
        coord.cache(req, req.num_tokens)
        coord.end_step()
    coord.free(req)
    coord.check_integrity()
    return hit.num_tokens


def _prompt(i: int, n: int = 10) -> list[int]:
    return [100 * i + j for j in range(n)]


def test_a_resent_batch_larger_than_the_budget_keeps_a_budget_of_it() -> None:
    """LRU hits nothing on A B C A B C with room for two; equals never churn: A and B stay."""
    coord = _scan(max_checkpoints=2)
    book = coord.state[0].book
    first = [_serve(coord, FakeRequest(f"{c}1", _prompt(i))) for i, c in enumerate("ABC")]
    second = [_serve(coord, FakeRequest(f"{c}2", _prompt(i))) for i, c in enumerate("ABC")]
    assert first == [0, 0, 0] and second == [8, 8, 0]
    assert book.counters.hits == {CheckpointKind.PROMPT: 2}
    assert book.counters.refused[CheckpointKind.PROMPT] >= 1


def test_the_checkpoint_saving_more_work_wins() -> None:
    coord = _scan(max_checkpoints=1)
    _serve(coord, FakeRequest("A", _prompt(1)))  # prompt end 8
    _serve(coord, FakeRequest("B", _prompt(2, 22)))  # prompt end 20: worth more, displaces A
    assert _serve(coord, FakeRequest("B2", _prompt(2, 22))) == 20
    assert _serve(coord, FakeRequest("A2", _prompt(1))) == 0
    assert coord.state[0].book.counters.evicted[EvictReason.VALUE] == 1


def test_checkpoints_used_once_give_way_to_a_new_batch() -> None:
    """After A B A B the book has seen prompt ends reused once and never twice: new prompt
    ends (C, D) are worth more than the used ones and displace them."""
    coord = _scan(max_checkpoints=2)
    for rnd in range(2):
        hits = [_serve(coord, FakeRequest(f"{c}{rnd}", _prompt(i))) for i, c in enumerate("AB")]
        assert hits == [8 * rnd] * 2
    rates = coord.state[0].book.rates
    assert rates.expected(CheckpointKind.PROMPT, 1) < rates.expected(CheckpointKind.PROMPT, 0)
    for rnd in range(2):
        hits = [_serve(coord, FakeRequest(f"{c}{rnd}", _prompt(i))) for i, c in enumerate("CD", 2)]
        assert hits == [8 * rnd] * 2


def test_a_link_is_worth_what_its_continuation_misses() -> None:
    coord = _scan(max_checkpoints=8)
    book = coord.state[0].book
    _serve(coord, FakeRequest("A", _prompt(1, 10), cache_boundaries=(4,)))  # 4 (caller), 8
    at = {e.boundary: e for e in book.entries.values()}
    assert book.num_ways(at[4]) == 1 and book.num_ways(at[8]) == 0
    assert at[8].ancestor == 4 and at[4].ancestor == 0
    onward = book.rates.expected(CheckpointKind.PROMPT, 0)
    caller = book.rates.expected(CheckpointKind.CALLER, 0)
    assert book.value(at[4]) == caller * (1 - onward) * recompute_cost(0, 4)
    assert book.value(at[8]) == onward * recompute_cost(4, 8)


def test_a_shared_head_outlives_the_single_use_checkpoints_around_it() -> None:
    """A system prompt's end that two conversations continue is a branch point (no link
    discount) and served a hit: it stays while other conversations push the budget."""
    coord = _scan(max_checkpoints=3)
    book = coord.state[0].book
    system = [7, 7, 7, 1]
    _serve(coord, FakeRequest("A", system + [1, 2, 3, 4, 5, 6, 7, 8], cache_boundaries=(4,)))
    _serve(coord, FakeRequest("B", system + [9, 8, 7, 6, 5, 4, 3, 2], cache_boundaries=(4,)))
    head = next(e for e in book.entries.values() if e.boundary == 4)
    assert book.num_ways(head) == 2 and head.hits == 1
    for i in range(3):
        _serve(coord, FakeRequest(f"C{i}", _prompt(3 + i, 12)))
    assert head.key in {e.key for e in book.entries.values()}
    assert _serve(coord, FakeRequest("D", system + [5, 5, 5, 5, 5])) == 4


def test_a_running_request_keeps_its_checkpoint_and_runs_without_room() -> None:
    """One checkpoint of budget, held by the request that resumed from it: its own prompt
    end is refused (the shortfall counted), the request runs on, nothing is evicted."""
    coord = _scan(max_checkpoints=1)
    book = coord.state[0].book
    _serve(coord, FakeRequest("A", _prompt(1)))
    b = FakeRequest("B", _prompt(1) + [5] * 12)
    hit = coord.find_cache_hit(b)
    assert hit.num_tokens == 8
    assert coord.allocate(b, b.num_tokens - 8, hit)  # plans B's prompt end at 20: no room
    held = hit.state_slots[0]
    assert held is not None and book.pool.ref_cnt[held] == 1
    assert book.counters.refused == {CheckpointKind.PROMPT: 1}
    assert not book.evict_one()  # the only checkpoint is held
    coord.take_state_copies()
    b.num_computed_tokens = b.num_tokens
    coord.cache(b, b.num_tokens)
    coord.end_step()
    assert book.pool.ref_cnt[held] == 1  # held past the step, until B is freed
    coord.free(b)
    coord.check_integrity()
    assert book.pool.ref_cnt[held] == 0 and book.count() == 1


def test_priors_rank_shared_heads_over_one_shot_tails() -> None:
    kinds = CheckpointKind
    assert PRIOR_REUSE[kinds.CALLER] > PRIOR_REUSE[kinds.PROMPT] > PRIOR_REUSE[kinds.PERIODIC]
    assert PRIOR_REUSE[kinds.JUNCTION] > PRIOR_REUSE[kinds.PROMPT]
    assert PRIOR_REUSE[kinds.TURN_END] > PRIOR_REUSE[kinds.FINISHED]


def test_stats_count_by_kind_and_bytes_against_the_budget() -> None:
    coord = _scan(max_checkpoints=1)
    # A's caller boundary 4 is kept, its prompt end 8 (worth less) refused; A2 resumes at 4,
    # holding the whole budget while it runs: its prompt end 8 is refused again
    _serve(coord, FakeRequest("A", _prompt(1), cache_boundaries=(4,)))
    _serve(coord, FakeRequest("A2", _prompt(1)))
    s = coord.checkpoint_stats()
    slot_bytes = coord.layout.state_slot_bytes(coord.state[0].group_id)
    assert s.admitted == {"caller": 1} and s.refused == {"prompt": 2}
    assert s.hits == {"caller": 1} and s.evicted == {}
    assert (s.held_bytes, s.budget_bytes) == (slot_bytes, slot_bytes)


def test_a_budget_below_the_running_batch_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    coord = _scan(max_checkpoints=1)
    reqs = [FakeRequest(f"R{i}", _prompt(i)) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="hybridkv.kv.state_manager"):
        for r in reqs:
            assert coord.allocate(r, r.num_tokens, coord.find_cache_hit(r))
        coord.take_state_copies()
    assert [r.getMessage() for r in caplog.records if "fewer than" in r.getMessage()] == [
        "state group 1: the checkpoint budget holds 1 checkpoints, fewer than the 2 running "
        "requests: some prefixes will be recomputed (raise state_checkpoint_budget or "
        "kv_cache_memory)"
    ]
    for r in reqs:  # every request ran: none refused for checkpoint room
        r.num_computed_tokens = r.num_tokens
        coord.cache(r, r.num_tokens)
        coord.free(r)
    coord.check_integrity()
    assert coord.checkpoint_stats().refused == {"prompt": 2}


def test_a_request_naming_every_block_keeps_few_of_them() -> None:
    """A client may name a boundary at every block (cache_boundaries is bounded in count, not
    in density): once one of them is kept, the next is worth only the tokens since it, so the
    request cannot fill the budget with its own fine-grained checkpoints."""
    coord = _scan(max_checkpoints=4)
    book = coord.state[0].book
    for i in range(2):
        _serve(coord, FakeRequest(f"S{i}", _prompt(i, 18), cache_boundaries=(12,)))
    flood = FakeRequest("F", _prompt(9, 41), cache_boundaries=tuple(range(4, 41, 4)))
    _serve(coord, flood)
    mine = [e for e in book.entries.values() if e.key[0] in flood.block_hashes]
    assert len(mine) <= 3 and book.count() <= 4  # of its 10 boundaries
    assert book.counters.refused[CheckpointKind.CALLER] >= 7


def test_conversations_move_their_checkpoint_forward_past_the_budget() -> None:
    """Three interleaved conversations, two checkpoints: each turn end supersedes the one
    its turn resumed from (and its own prompt end), so two conversations keep resuming at
    their last turn; the third does not take their slots round after round."""
    coord = _scan(max_checkpoints=2)
    book = coord.state[0].book
    history = {c: _prompt(c + 1, 6) for c in range(3)}
    hits: dict[int, list[int]] = {c: [] for c in range(3)}
    for rnd in range(4):
        for c in range(3):
            prompt = history[c] + [50 + rnd, 60 + c]
            named = (len(history[c]), len(prompt))
            req = FakeRequest(f"c{c}t{rnd}", prompt, cache_boundaries=named)
            reply = (70 + rnd, 80 + c, 90, 91, 92)
            hits[c].append(_serve(coord, req, reply))
            history[c] = prompt + list(reply)
    resumed = [c for c in range(3) if all(h >= 4 * (rnd + 2) for rnd, h in enumerate(hits[c][1:]))]
    assert len(resumed) == 2, hits  # two conversations resume at every turn's end
    assert book.counters.evicted.get(EvictReason.SUPERSEDED, 0) >= 6


def test_a_named_boundary_at_the_prompt_end_is_a_prompt_end() -> None:
    """A chat's last message ends where its prompt does: that checkpoint serves the same
    prompt sent again (a prompt end), not the heads other requests share (caller)."""
    policy = CheckpointPolicy(block_size=4, interval=0)
    extra = policy.request_boundaries(10, 0, caller=(4, 10))
    assert policy.kind(4, extra) is CheckpointKind.CALLER
    assert policy.kind(8, extra) is CheckpointKind.PROMPT
    assert policy.kind(8, policy.request_boundaries(10, 8, caller=(10,))) is CheckpointKind.JUNCTION
