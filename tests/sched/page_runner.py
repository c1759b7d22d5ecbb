"""A test double of the model runner that keeps token ids as its "KV" and checks every read.

Attention pages store ``(group, token)`` per slot, so a block read by the wrong group, a stale
block, or a position never written is caught at once. A state slot stores the tuple of tokens
it has absorbed, so a checkpoint restored at the wrong boundary is caught too. The next token is
a hash of the visible context, so any wrong KV also changes the generated tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from hybridkv.kv.block_pool import NULL_BLOCK
from hybridkv.kv.spec import KVCacheLayout, SlidingWindowSpec
from hybridkv.step_io import RunnerOutput, ScheduledRequest, SchedulerOutput

VOCAB = 997


def next_token(context: Sequence[int]) -> int:
    digest = hashlib.sha256(repr(tuple(context)).encode()).digest()
    return int.from_bytes(digest[:4], "little") % VOCAB


def reference_generation(
    prompt: Sequence[int], max_tokens: int, window: int | None = None
) -> list[int]:
    """What a correct engine generates with this runner (greedy, no stops)."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens if window is None else tokens[-window:]))
    return tokens[len(prompt) :]


class PageRunner:
    def __init__(self, layout: KVCacheLayout) -> None:
        self.layout = layout
        self.B = layout.block_size
        self.pages: dict[int, list[tuple[int, int] | None]] = {}
        self.states: dict[tuple[int, int], tuple[int, ...]] = {}
        self.steps: list[SchedulerOutput] = []
        self.disagreements: list[str] = []  # requests that computed on inconsistent KV
        self.windows = {
            g.group_id: g.spec.sliding_window
            for g in layout.groups
            if isinstance(g.spec, SlidingWindowSpec)
        }

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        self.steps.append(out)
        for c in out.state_restores:
            self.states[(c.group_id, c.dst_slot)] = self.states[(c.group_id, c.src_slot)]
        result = RunnerOutput()
        for r in out.requests:
            context = self._run_request(r)
            if r.sample:
                result.sampled_token_ids[r.request_id] = next_token(context)
        for c in out.state_saves:  # from inside the step: the live state's first `at` tokens
            state = self.states[(c.group_id, c.src_slot)]
            self.states[(c.group_id, c.dst_slot)] = state if c.at is None else state[: c.at]
        return result

    def _run_request(self, r: ScheduledRequest) -> list[int]:
        """Write this step's tokens, read every group's context back, cross-check them."""
        end = r.start_pos + len(r.token_ids)
        for g, table in enumerate(r.block_ids):
            for i, tok in enumerate(r.token_ids):
                self._write(g, table, r.start_pos + i, tok)
        views: list[list[int]] = []
        for g, table in enumerate(r.block_ids):
            lo = max(0, end - self.windows[g]) if g in self.windows else 0
            views.append([self._read(g, table, p) for p in range(lo, end)])
        for j, gid in enumerate(self.layout.state_group_ids):
            key = (gid, r.state_slots[j])
            history = () if r.reset_state else self.states[key]
            assert len(history) == r.start_pos, (
                f"{r.request_id}: state at {len(history)}, step starts at {r.start_pos}"
            )
            self.states[key] = history + tuple(r.token_ids)
            views.append(list(self.states[key]))
        return self._visible(r.request_id, views)

    def _visible(self, req_id: str, views: list[list[int]]) -> list[int]:
        """The context the model sees. Groups that disagree (a failed load's garbage in one
        of them) poison it, so the sampled token is wrong unless the step is discarded."""
        longest = max(views, key=len)
        if any(longest[len(longest) - len(v) :] != v for v in views):
            self.disagreements.append(req_id)
            return [*longest, -1]
        return longest

    def _write(self, g: int, table: list[int], pos: int, tok: int) -> None:
        block = table[pos // self.B]
        assert block != NULL_BLOCK, f"group {g}: writing position {pos} into the null block"
        page = self.pages.setdefault(block, [None] * self.B)
        page[pos % self.B] = (g, tok)

    def _read(self, g: int, table: list[int], pos: int) -> int:
        block = table[pos // self.B]
        assert block != NULL_BLOCK, f"group {g}: reading position {pos} from the null block"
        entry = self.pages.get(block, [None] * self.B)[pos % self.B]
        assert entry is not None, f"group {g}: position {pos} in block {block} was never written"
        assert entry[0] == g, f"group {g}: block {block} holds group {entry[0]}'s data"
        return entry[1]
