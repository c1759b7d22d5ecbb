"""A request as the scheduler sees it: tokens, progress, status, and its block hashes."""

from __future__ import annotations

import time
from enum import Enum

from hybridkv.kv.hashing import BlockHash, BlockHasher
from hybridkv.sampling.params import SamplingParams


class RequestStatus(str, Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {
    RequestStatus.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH,
    RequestStatus.FINISHED_ABORTED,
    RequestStatus.FINISHED_ERROR,
}


class Request:
    """Tokens are ``prompt_token_ids + output_token_ids``; ``num_computed_tokens`` of them have
    KV in the cache. ``block_hashes`` grows with the tokens (full blocks only)."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        hasher: BlockHasher,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: the prompt is empty")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        self.all_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.error_is_client = False  # the request's own options failed it (a 400)
        self.num_preemptions = 0
        self.cached_tokens: dict[str, int] = {}  # prompt tokens not computed, by source
        # in: the client's (sampling_params.extra_args); out: the connector's at finish
        self.kv_transfer_params: dict[str, object] | None = sampling_params.kv_transfer_params
        self.transfer_fields = sampling_params.transfer_fields  # the client's, parsed once
        # prompt positions the caller wants state checkpoints at (kv/checkpoints.py)
        self.cache_boundaries: tuple[int, ...] = sampling_params.cache_boundaries
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.scheduled_time: float | None = None  # when a step first computed it (queue end)
        self._hasher = hasher
        self.block_hashes: list[BlockHash] = []
        hasher.extend(self.block_hashes, self.all_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def salted(self) -> bool:
        """Whether a cache salt keys its blocks (KV events never publish its token ids)."""
        return bool(self._hasher.extra)

    @property
    def cache_salt(self) -> str | None:
        """The salt of block 0's extra keys (KV events publish it as vLLM does)."""
        return self._hasher.cache_salt

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """Prompt logprobs need every prompt position computed (vLLM's rule too)."""
        return self.sampling_params.prompt_logprobs is not None

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    def append_output_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        self._hasher.extend(self.block_hashes, self.all_token_ids)

    def check_stop(self, max_model_len: int) -> RequestStatus | None:
        """The finish status the last appended token causes, if any."""
        params = self.sampling_params
        last = self.all_token_ids[-1]
        if not params.ignore_eos and last in self.eos_token_ids:
            self.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
        if last in params.stop_token_ids:
            self.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
        limit = params.max_tokens
        if (
            limit is not None and self.num_output_tokens >= limit
        ) or self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None
