"""The step's I/O: what the scheduler hands the runner and the connector's worker half, and
what comes back. Plain data only (no tensors, no torch); imported by the scheduler, the model
runner, the connectors and the engine, and importing none of them.

One engine step is ``SchedulerOutput -> runner (+ connector worker) -> RunnerOutput``. A test
can play either side.

A scheduled request computes ``token_ids`` at positions
``[start_pos, start_pos + len(token_ids))``::

    | computed (start_pos tokens) | token_ids (this step) |
      KV already in the pages       KV written by this step, then attended

Per attention group ``block_ids[g]`` is the request's whole block table in that group (entry k
holds tokens ``[k*B, (k+1)*B)``; entries outside a sliding window are the null block 0). It
covers at least ``start_pos + len(token_ids)`` tokens. For state groups ``state_slots[i]`` is
the request's live slot in the i-th state group of the layout (``layout.state_group_ids``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic

from typing_extensions import TypeVar  # a TypeVar with a default (PEP 696; typing's in 3.13)

from hybridkv.choice import Choice
from hybridkv.kv.state_manager import StateCopy
from hybridkv.sampling.params import SamplingParams

__all__ = [
    "ConnectorMetadata",
    "FailureReason",
    "KVConnectorOutput",
    "LoadSpec",
    "PositionLogprobs",
    "PromptLogprobsChunk",
    "RunnerOutput",
    "ScheduledRequest",
    "SchedulerOutput",
    "StateCopy",
]


# What a connector's scheduler half writes for its worker half, by connector: how a load is
# addressed (``LoadSpec.keys``) and what one save item is. Covariant: a connector's own
# ``ConnectorMetadata[FileLoadKeys, FileSave]`` is a ``ConnectorMetadata`` (of objects), which
# is what the engine hands around; its worker half narrows back with ``isinstance``.
KeysT = TypeVar("KeysT", covariant=True, default=object)
SaveT = TypeVar("SaveT", covariant=True, default=object)


class FailureReason(Choice):
    """Why a load (or a part of it) failed. A reason in ``KVConnectorOutput`` is one of these
    values, optionally followed by ``": detail"`` (``FailureReason.of`` reads it back)."""

    MISSING = "missing"  # no such file / unit
    TRUNCATED = "truncated"  # shorter than its header says
    CORRUPT = "corrupt"  # bad magic, checksum mismatch, trailing bytes, undecodable header
    MISMATCH = "mismatch"  # valid, but of another version, fingerprint, key, span or size
    IO_ERROR = "io_error"  # could not be read
    FORGED = "forged"  # a header the cache directory's key did not authenticate
    FOREIGN = "foreign"  # authenticated by another directory's key
    UNSAFE = "unsafe"  # not a regular file (symlink, FIFO, device...)
    TIMEOUT = "timeout"  # did not finish in time
    INJECTED = "injected"  # FaultInjection failed it on purpose
    ERROR = "error"  # an exception (device or programming error)
    REJECTED_PAST_LAST_TOKEN = "rejected_past_last_token"  # a hit past N-1 a state cannot use

    @classmethod
    def of(cls, reason: str) -> FailureReason:
        """The reason a report's text starts with (``"error: OSError"`` -> ``ERROR``)."""
        try:
            return cls(cls.head(reason))
        except ValueError:
            return cls.ERROR

    @staticmethod
    def head(reason: str) -> str:
        """A report's reason without its detail (``"nixl_timeout: no data ..."`` ->
        ``"nixl_timeout"``), kept as written even when it is not one of these values."""
        return reason.partition(":")[0].strip()


@dataclass(frozen=True, slots=True)
class LoadSpec(Generic[KeysT]):
    """One request's load: tokens [start, end) into the blocks and live slots named.

    ``block_ids[g]`` lists, per attention group, the table entries covering [start, end) that
    must be filled (null entries, outside a window, are left out); ``block_indices[g]`` gives
    their positions in the table (entry k holds tokens [k*B, (k+1)*B)). ``state_slots`` are the
    live slots that must receive the state at ``end``."""

    request_id: str
    start: int
    end: int
    block_ids: tuple[list[int], ...]
    block_indices: tuple[list[int], ...]
    state_slots: tuple[int, ...]
    is_async: bool
    keys: KeysT  # connector-specific addressing (units, file keys, a producer); None if none


@dataclass(slots=True)
class ConnectorMetadata(Generic[KeysT, SaveT]):
    """The per-step metadata a connector's scheduler half writes for its worker half: the
    loads to start before the forward pass and the saves to make after it. Every connector
    emits this type (or a subclass), typed by its own keys and save items (plain data)."""

    loads: list[LoadSpec[KeysT]] = field(default_factory=list)
    saves: list[SaveT] = field(default_factory=list)


@dataclass(slots=True)
class KVConnectorOutput:
    """What the worker half reports after a step (all sets of request ids unless noted)."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: dict[str, str] = field(default_factory=dict)  # req id -> reason
    invalid_block_ids: dict[int, str] = field(default_factory=dict)  # block id -> reason
    invalid_state: dict[str, str] = field(default_factory=dict)  # req id -> reason (state part)

    @property
    def is_empty(self) -> bool:
        return not (
            self.finished_sending
            or self.finished_recving
            or self.failed_recving
            or self.invalid_block_ids
            or self.invalid_state
        )


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    request_id: str
    token_ids: list[int]
    start_pos: int
    block_ids: tuple[list[int], ...]  # one table per attention group, in layout order
    state_slots: tuple[int, ...]  # one live slot per state group, in layout order
    reset_state: bool  # zero the live slots before computing (start_pos == 0, no restore)
    sample: bool  # sample a token after the last position (prefill done, or decoding)
    sampling_params: SamplingParams
    num_output_tokens: int = 0  # tokens generated so far (seeded sampling offsets by this)
    # the request's prompt + output tokens (a reference, read during the step only: penalties,
    # bad words, grammar state and prompt logprobs read it) and how many are prompt
    all_token_ids: Sequence[int] = ()
    num_prompt_tokens: int = 0


@dataclass(slots=True)
class SchedulerOutput:
    """What the runner does in one step, in order:

    1. drop per-request runner state of ``finished_request_ids``;
    2. ``state_restores``: copy checkpoints into live slots (before the forward pass);
    3. zero the live slots of requests with ``reset_state``;
    4. the forward pass over ``requests``, writing K/V pages and live states, and the
       ``state_saves`` with ``at`` set (a checkpoint due inside a prefill: the scan's state
       after ``at`` tokens goes straight into ``dst_slot``);
    5. the other ``state_saves``: copy live slots into checkpoint slots (the state at the
       step's end);
    6. sample one token for each request with ``sample``.

    ``kv_connector_metadata`` is for the connector's worker half (None without a connector);
    the engine hands it to ``start_load`` before the runner and to ``save`` after it.
    """

    requests: list[ScheduledRequest] = field(default_factory=list)
    state_restores: list[StateCopy] = field(default_factory=list)
    state_saves: list[StateCopy] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)
    kv_connector_metadata: ConnectorMetadata | None = None

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.requests)

    @property
    def is_empty(self) -> bool:
        return not self.requests


@dataclass(frozen=True, slots=True)
class PositionLogprobs:
    """Log-probabilities at one position: entry 0 is the chosen (or, for a prompt position,
    the actual next) token, then the top k by rank. ``ranks[i]`` is 1 + how many tokens are
    more likely (the top k are 1..k)."""

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]


@dataclass(frozen=True, slots=True)
class PromptLogprobsChunk:
    """``entries[j]``: the logprobs of prompt token ``start + j`` (``start >= 1``), computed
    from the logits at position ``start + j - 1`` in this step's chunk."""

    start: int
    entries: list[PositionLogprobs]


@dataclass(slots=True)
class RunnerOutput:
    """Sampled tokens of the requests that asked to sample, keyed by request id; ``errors``
    names the requests the runner could not sample for (non-finite logits): they fail."""

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    # the ids in ``errors`` failed by their own options (nothing left to sample): a client's
    # error (HTTP 400), not the engine's
    client_errors: set[str] = field(default_factory=set)
    logprobs: dict[str, PositionLogprobs] = field(default_factory=dict)  # where params.logprobs
    prompt_logprobs: dict[str, PromptLogprobsChunk] = field(default_factory=dict)
    logits: dict[str, list[float]] = field(default_factory=dict)  # only if the runner keeps logits
    kv_connector_output: KVConnectorOutput | None = None  # filled by the engine after the step
