"""Plain data between the NixlConnector's halves and between engines (``kv_transfer_params``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hybridkv.connectors.nixl.auth import AuthKey, prompt_digest, verify_params
from hybridkv.sampling.transfer_params import TransferFields


@dataclass(frozen=True, slots=True)
class Lease:
    """A producer's lease on one request's KV: word ``slot`` of its lease words reads ``gen``
    while it holds the KV (see ``leases``)."""

    slot: int
    gen: int


class ParamsRefused(ValueError):
    """A request's ``kv_transfer_params`` are not loaded; ``reason`` is the counted failure."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ParamsPolicy:
    """What a consumer accepts: params signed with ``key``, naming one of ``trusted`` hosts,
    not expired by ``clock_ms`` (epoch milliseconds)."""

    key: AuthKey
    trusted: frozenset[str]
    clock_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))


@dataclass(frozen=True, slots=True)
class RemoteSource:
    """A consumer's view of a producer's ``kv_transfer_params`` (validated and verified)."""

    engine_id: str
    host: str
    port: int
    request_id: str
    block_ids: tuple[tuple[int, ...], ...]  # per attention group, from table index ``first``
    first_blocks: tuple[int, ...]  # per attention group
    staged_state: int | None  # the producer's staging entry holding the state at num_tokens
    num_tokens: int  # tokens whose KV the producer holds: [0, num_tokens)
    lease: Lease | None = None  # where the producer publishes whether it still holds them
    block_size: int = 0  # the producer's tokens per block (0: not given)

    @classmethod
    def parse(
        cls,
        f: TransferFields,
        token_ids: Sequence[int] | None,
        layout: tuple[int, bool],
        policy: ParamsPolicy,
    ) -> RemoteSource:
        """The params of a request whose tokens are ``token_ids`` (None: not to load, only to
        tell the producer to free), on a consumer with ``layout`` (attention groups, whether it
        has state groups); ``f`` was typed and bounded at the API boundary
        (``parse_transfer_params``). Raises ParamsRefused: incomplete, not signed by
        this deployment's key, computed for another prompt, an untrusted host, or expired."""
        src = cls._typed(f, *layout)
        if not verify_params(policy.key, f):
            raise ParamsRefused(
                "nixl_params_forged",
                "kv_transfer_params: remote_signature is missing or does not match the "
                f"deployment key ({policy.key.source}); only a producer's own params load",
            )
        if token_ids is not None and f.prompt_digest != prompt_digest(token_ids[: src.num_tokens]):  # fmt: skip
            raise ParamsRefused("nixl_params_forged", "kv_transfer_params: computed for another "
                                "prompt (remote_prompt_digest)")  # fmt: skip
        if src.host not in policy.trusted:
            raise ParamsRefused("nixl_params_untrusted",
                                f"kv_transfer_params: remote_host {src.host!r} is not trusted "
                                "(add it to trusted_hosts)")  # fmt: skip
        if f.expires_ms is None or f.expires_ms < policy.clock_ms():
            raise ParamsRefused("nixl_params_expired", "kv_transfer_params: expired (the "
                                "producer's abort_timeout_seconds passed before they came)")  # fmt: skip
        return src

    @classmethod
    def _typed(cls, f: TransferFields, num_attn: int, has_state: bool) -> RemoteSource:
        if None in (f.engine_id, f.host, f.port, f.request_id, f.block_ids, f.block_starts,
                    f.num_tokens):  # fmt: skip
            raise ParamsRefused("nixl_params_malformed", "kv_transfer_params: a remote_* field "
                                "or num_tokens is missing")  # fmt: skip
        assert f.block_ids is not None and f.block_starts is not None
        if len(f.block_ids) != num_attn or len(f.block_starts) != num_attn:
            raise ParamsRefused(
                "nixl_params_malformed",
                f"kv_transfer_params: remote_block_ids has {len(f.block_ids)} groups, "
                f"this engine has {num_attn} attention groups",
            )
        src = cls(str(f.engine_id), str(f.host), int(f.port or 0), str(f.request_id),
                  f.block_ids, f.block_starts, f.state[0] if f.state else None,
                  int(f.num_tokens or 0), Lease(*f.lease) if f.lease else None,
                  f.block_size or 0)  # fmt: skip
        if src.num_tokens > 0 and src.lease is None:
            raise ParamsRefused("nixl_params_malformed", "kv_transfer_params: remote_lease is "
                                "required")  # fmt: skip
        if src.num_tokens > 0 and has_state and src.staged_state is None:
            raise ParamsRefused("nixl_params_malformed", "kv_transfer_params: remote_state is "
                                "required for state groups")  # fmt: skip
        return src


@dataclass(frozen=True, slots=True)
class StageState:
    """Producer: after this step's forward, copy these state slots (the live ones when the step
    ends at E, the checkpoint restored at E when it starts there) to a staging entry."""

    request_id: str
    index: int
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StartLease:
    """Producer: the request's KV waits for a consumer's read until the lease expires."""

    request_id: str
    seconds: float
    lease: Lease


@dataclass(frozen=True, slots=True)
class NotifyOnly:
    """Consumer: nothing to read (full local hit, or aborted): tell the producer to free."""

    source: RemoteSource


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Consumer: tell the producer of ``source`` (its engine, host and port) that its requests
    ``request_ids`` still wait here, so it keeps their KV (see ``heartbeats``)."""

    source: RemoteSource
    request_ids: tuple[str, ...]


# what the scheduler half writes in ``ConnectorMetadata.saves`` for its worker half
NixlItem = StageState | StartLease | NotifyOnly | Heartbeat
