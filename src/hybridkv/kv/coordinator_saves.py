"""The coordinator's state-checkpoint planning: which state copies a step saves, and where
a step must end so a due checkpoint gets taken.

``CoordinatorSaves`` is a base of ``KVCacheCoordinator``, which owns every attribute declared
here. Due boundaries come from ``CheckpointPolicy`` (periodic, prompt end, junction, the
caller's ``cache_boundaries``); an admitted request's extra boundaries are fixed at admission
(``_extra_due``). Planned saves are appended to ``_saves``, which the coordinator's
``take_state_copies`` drains. Best effort (``StateManager.save``): a due save holds its slot
as pending until ``cache`` keys it or ``free`` releases it; any other boundary overwrites the
request's trailing slot; with no room nothing is saved.
"""

from __future__ import annotations

from hybridkv.kv.checkpoints import CheckpointPolicy, RequestBoundaries
from hybridkv.kv.coordinator_types import CacheHit, KVCacheConfig, KVRequest
from hybridkv.kv.state_manager import StateCopy, StateManager


class CoordinatorSaves:
    config: KVCacheConfig
    block_size: int
    caching: bool
    state: list[StateManager]
    policy: CheckpointPolicy
    _extra_due: dict[str, RequestBoundaries]
    _saves: list[StateCopy]  # this step's saves, drained by ``take_state_copies``
    _restores: list[StateCopy]  # copies the runner makes before the step's forward

    def _boundaries(self, req: KVRequest, hit: CacheHit | None) -> RequestBoundaries:
        return self.policy.request_boundaries(
            req.num_prompt_tokens, _junction(hit), req.cache_boundaries
        )

    def _plan_saves(self, req: KVRequest, start: int, end: int) -> None:
        """Checkpoints due inside the step (from the scan), then the state at its end."""
        if not (self.caching and self.state):
            return
        extra = self._extra_due[req.request_id]
        if self.config.states_from_scan:
            for t in self.policy.due_inside(start, end, extra):
                self._save(req, t, extra, at=t)
        if end > 0 and end % self.block_size == 0:
            self._save(req, end, extra, at=None)

    def _save(
        self, req: KVRequest, boundary: int, extra: RequestBoundaries, at: int | None
    ) -> None:
        due = self.policy.is_due(boundary, extra)
        kind = self.policy.kind(boundary, extra) if due else None
        for sm in self.state:
            copy = sm.save(req.request_id, req.block_hashes, boundary, kind, at)
            if copy is not None:
                self._saves.append(copy)

    def _maybe_save_loaded(self, req: KVRequest, boundary: int | None) -> None:
        """The request's first computing step after an async load that wrote its live state
        at ``boundary``: keep that state as a checkpoint if the boundary is due (the prompt's
        last block boundary is), so requests sharing the prefix (the other copies of an
        ``n > 1`` request, the next turn) hit it instead of recomputing the prompt. The copy
        runs with the restores, before the forward moves the live state on. Nothing is saved
        if the step does not start there (recovery rewound the request after a failed load)."""
        if boundary is None or boundary != req.num_computed_tokens or not boundary:
            return
        if boundary % self.block_size:
            return
        extra = self._extra_due[req.request_id]
        if not self.policy.is_due(boundary, extra):
            return
        kind = self.policy.kind(boundary, extra)
        for sm in self.state:
            copy = sm.save(req.request_id, req.block_hashes, boundary, kind)
            if copy is not None:
                self._restores.append(copy)

    def has_due_checkpoint(self, req_id: str, lo: int, hi: int) -> bool:
        """Whether computing tokens (lo, hi] of the admitted request ``req_id`` leaves a longer
        prefix hit for a request that shares them: on layouts with state groups, whether a
        state checkpoint is due at a boundary there (periodic, a prompt end, the junction, the
        caller's); without state groups every full block is cached (True). A request not
        admitted is not known: True."""
        if not self.state:
            return True
        extra = self._extra_due.get(req_id)
        if extra is None:
            return True
        return self.caching and bool(self.policy.due_inside(lo, hi + 1, extra))

    @property
    def splits_steps(self) -> bool:
        """Whether ``next_step_end`` can end a step before its tokens or budget run out
        (due state checkpoints, when states do not come from the scan)."""
        return self.caching and bool(self.state) and not self.config.states_from_scan

    def next_step_end(
        self,
        req: KVRequest,
        start: int,
        end: int,
        hit: CacheHit | None = None,
        split: bool = False,
    ) -> int:
        """Where a step computing [start, end) must stop so a due checkpoint gets taken.

        For a request not admitted yet, pass the hit it will be admitted with. ``split``
        ends steps at due boundaries even when states come from the scan (a KV connector
        saves the live state at step ends only)."""
        if not (self.caching and self.state) or (self.config.states_from_scan and not split):
            return end
        extra = self._extra_due.get(req.request_id)
        if extra is None:
            extra = self._boundaries(req, hit)
        return self.policy.clip(start, end, extra)


def _junction(hit: CacheHit | None) -> int:
    """A full-attention prefix longer than the joint hit: worth a state checkpoint."""
    if hit is None or hit.num_common_prefix_tokens <= hit.num_tokens:
        return 0
    return hit.num_common_prefix_tokens
