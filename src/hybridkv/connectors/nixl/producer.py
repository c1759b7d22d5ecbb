"""The producer side of the NixlConnector's scheduler half: a request sent with
``{"do_remote_decode": true}`` stops its prefill at E (``spans.transfer_end``), stages the state
at E, keeps its KV under a lease once finished and answers with signed params.

    steps end at E (get_step_interval)  ->  StageState: copy the live state at E (state layouts)
    request_finished  ->  delay the free, clip the tables, StartLease, return the params
    finished_sending (consumer notified, or lease expired)  ->  blocks and staging freed

``Producer`` owns the two bounded pools that outlive a request's blocks: staging entries (one
per request whose state at E is kept) and lease slots (one per request whose KV waits for a
consumer); both go back when the request id comes back in ``finished_sending``.
"""

from __future__ import annotations

import logging

from hybridkv.connectors.base import KeptKV, KVConnectorRequest, RequestBlocks
from hybridkv.connectors.nixl.auth import prompt_digest, sign_params
from hybridkv.connectors.nixl.layout import GroupDesc
from hybridkv.connectors.nixl.meta import Lease, ParamsPolicy
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.plan import (
    first_held,
    producer_first_block,
    producer_kept_tokens,
    transfer_end,
)
from hybridkv.sampling.transfer_params import parse_transfer_params

log = logging.getLogger(__name__)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Producer:
    def __init__(
        self,
        options: NixlOptions,
        engine_id: str,
        groups: tuple[GroupDesc, ...],
        block_size: int,
        policy: ParamsPolicy,
    ) -> None:
        self.options = options
        self.engine_id = engine_id
        self.policy = policy  # the deployment key signs the params
        self.block_size = block_size
        self.attn = [g for g in groups if g.token_bytes]
        self.num_state = sum(1 for g in groups if not g.token_bytes)
        self.has_state = self.num_state > 0
        self._free_staging = list(range(options.max_staged_states - 1, -1, -1))
        self._staged: dict[str, int] = {}
        self._free_leases = list(range(options.max_leases - 1, -1, -1))
        self._leases: dict[str, Lease] = {}
        self._generation = 0

    def end_of(self, request: KVConnectorRequest) -> int | None:
        """E for a request this engine prefills for a consumer; None for any other."""
        fields = request.transfer_fields
        if not (fields and fields.do_remote_decode):
            return None
        return transfer_end(request.num_prompt_tokens, self.block_size, self.has_state)

    def stage_index(self, request_id: str) -> int | None:
        """The request's staging entry (taken at first ask); None when all are busy."""
        if request_id not in self._staged:
            if not self._free_staging:
                log.warning("NIXL: all %d staging entries busy", self.options.max_staged_states)
                return None
            self._staged[request_id] = self._free_staging.pop()
        return self._staged[request_id]

    def is_staged(self, request_id: str) -> bool:
        return request_id in self._staged

    def release_staging(self, request_id: str) -> None:
        index = self._staged.pop(request_id, None)
        if index is not None:
            self._free_staging.append(index)

    def new_lease(self, request_id: str) -> Lease | None:
        if not self._free_leases:
            log.warning("NIXL: all %d leases busy; the consumer computes", len(self._leases))
            return None
        self._generation += 1
        self._leases[request_id] = Lease(self._free_leases.pop(), self._generation)
        return self._leases[request_id]

    def sent(self, request_id: str) -> None:
        """The consumer read (or the lease expired): its staging entry and lease slot go back."""
        self.release_staging(request_id)
        lease = self._leases.pop(request_id, None)
        if lease is not None:
            self._free_leases.append(lease.slot)

    def kept_kv(self, request: KVConnectorRequest) -> KeptKV | None:
        """Only what the consumer reads stays pinned: blocks before E (sliding groups: the
        window ending at E plus one block); the live state slot goes (E's state is staged)."""
        end = self.end_of(request)
        return KeptKV(end, producer_kept_tokens(end, self.block_size)) if end else None

    def params(
        self, request: KVConnectorRequest, blocks: RequestBlocks, end: int
    ) -> dict[str, object]:
        """The signed params a consumer loads the KV of tokens [0, end) with (``auth``)."""
        rid = request.request_id
        last = cdiv(end, self.block_size)
        firsts = [
            min(last, first_held(t, producer_first_block(g, end, self.block_size)))
            for g, t in zip(self.attn, blocks.block_ids, strict=True)
        ]
        staged = self._staged.get(rid)
        lease = self._leases.get(rid)
        expires = self.policy.clock_ms() + int(self.options.abort_timeout_seconds * 1000)
        params: dict[str, object] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_host": self.options.side_channel_host,
            "remote_port": self.options.side_channel_port,
            "remote_request_id": rid,
            "remote_block_ids": [t[f:last] for t, f in zip(blocks.block_ids, firsts, strict=True)],
            "remote_block_starts": firsts,
            "remote_state": [] if staged is None or not end else [staged] * self.num_state,
            "remote_block_size": self.block_size,
            "num_tokens": end,
            "remote_lease": [lease.slot, lease.gen] if lease is not None else None,
            "remote_expires_ms": expires,
        }
        params["remote_prompt_digest"] = prompt_digest(request.all_token_ids[:end])
        params["remote_signature"] = sign_params(self.policy.key, parse_transfer_params(params))
        return params
