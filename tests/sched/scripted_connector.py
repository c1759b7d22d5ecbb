"""A scripted connector (test double) that writes true or garbage "KV" into a PageRunner.

Each request id can be given a script: how many external tokens the lookup reports (after the
local hit), sync or async, how many lookups answer "ask later", which table indices fail, a
whole-request or state failure, and how many steps an async load takes. Loaded tokens are the
request's real tokens, so a correct scheduler produces exactly the reference outputs; failed
blocks get garbage, so a scheduler that trusts them produces wrong tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hybridkv.connectors.base import (
    BaseConnectorScheduler,
    BaseConnectorWorker,
    KVConnectorRequest,
    RequestBlocks,
)
from hybridkv.step_io import ConnectorMetadata, FailureReason, KVConnectorOutput, LoadSpec
from tests.sched.page_runner import PageRunner

GARBAGE = 10**6


@dataclass
class Script:
    external: int  # tokens beyond the local hit the lookup reports (clipped by the scheduler)
    is_async: bool = True
    ask_later: int = 0  # lookups answering None first
    fail_indices: set[int] = field(default_factory=set)  # table indices whose load fails
    fail_request: bool = False
    fail_state: bool = False
    steps: int = 1  # get_finished calls until an async load completes
    report_early: bool = False  # report block failures before the load finishes
    send_steps: int = 0  # producer side: keep the blocks until a send finishes after N polls


class ScriptedScheduler(BaseConnectorScheduler):
    def __init__(self, scripts: dict[str, Script]) -> None:
        self.scripts = scripts
        self.lookups: dict[str, int] = {}
        self.pending: list[LoadSpec] = []
        self.finished_calls: list[str] = []
        self.finished_blocks: dict[str, RequestBlocks] = {}
        self.params_seen: dict[str, dict[str, object] | None] = {}
        self.allocs: list[tuple[str, int]] = []

    def get_num_new_matched_tokens(
        self, request: KVConnectorRequest, num_local_computed: int
    ) -> tuple[int, bool] | None:
        script = self.scripts.get(request.request_id)
        if script is None:
            return 0, False
        seen = self.lookups.get(request.request_id, 0)
        self.lookups[request.request_id] = seen + 1
        if seen < script.ask_later:
            return None
        n = max(0, script.external - num_local_computed)
        return n, script.is_async and n > 0

    def update_state_after_alloc(
        self, request: KVConnectorRequest, blocks: RequestBlocks, num_external_tokens: int
    ) -> None:
        self.allocs.append((request.request_id, num_external_tokens))
        if num_external_tokens == 0:
            return
        end = request.num_computed_tokens
        start = end - num_external_tokens
        script = self.scripts[request.request_id]
        self.pending.append(
            LoadSpec(
                request.request_id,
                start,
                end,
                blocks.block_ids,
                (),
                blocks.state_slots,
                script.is_async,
                keys=list(request.all_token_ids[:end]),
            )  # fmt: skip
        )

    def build_connector_meta(
        self, scheduled: list[tuple[KVConnectorRequest, int, int, RequestBlocks]]
    ) -> ConnectorMetadata:
        meta = ConnectorMetadata(loads=self.pending)
        self.pending = []
        return meta

    def request_finished(
        self, request: KVConnectorRequest, blocks: RequestBlocks
    ) -> tuple[bool, dict[str, object] | None]:
        self.finished_calls.append(request.request_id)
        self.params_seen[request.request_id] = request.kv_transfer_params
        self.finished_blocks[request.request_id] = blocks
        script = self.scripts.get(request.request_id)
        if script is None or script.send_steps == 0:
            return False, None
        return True, {"remote_block_ids": [list(t) for t in blocks.block_ids]}

    # the lease hooks (``LeaseHooks``): no-ops a test replaces to listen

    def on_waiting(self, requests: Sequence[KVConnectorRequest]) -> None:
        return None

    def request_dropped(self, request: KVConnectorRequest) -> None:
        return None


class ScriptedWorker(BaseConnectorWorker):
    """Writes into the PageRunner's pages; async loads complete after ``script.steps`` polls."""

    def __init__(self, runner: PageRunner, scripts: dict[str, Script]) -> None:
        self.runner = runner
        self.scripts = scripts
        self.inflight: dict[str, tuple[LoadSpec, int]] = {}
        self.sending: dict[str, int] = {}  # request id -> polls until its send completes
        self.report = KVConnectorOutput()

    def start_load(self, metadata: ConnectorMetadata) -> None:
        for spec in metadata.loads:
            self._write(spec)
            script = self.scripts[spec.request_id]
            if spec.is_async:
                self.inflight[spec.request_id] = (spec, script.steps)
                if script.report_early:
                    self._report_failures(spec)
            else:
                self._report_failures(spec)

    def save(self, metadata: ConnectorMetadata) -> None:
        pass

    def get_finished(self, finished_request_ids: list[str]) -> KVConnectorOutput:
        for rid in finished_request_ids:
            script = self.scripts.get(rid)
            if script is not None and script.send_steps:
                self.sending[rid] = script.send_steps
        for rid, left in list(self.sending.items()):
            if left <= 1:
                del self.sending[rid]
                self.report.finished_sending.add(rid)
            else:
                self.sending[rid] = left - 1
        for rid, (spec, left) in list(self.inflight.items()):
            if left <= 1:
                del self.inflight[rid]
                self.report.finished_recving.add(rid)
                if not self.scripts[rid].report_early:
                    self._report_failures(spec)
            else:
                self.inflight[rid] = (spec, left - 1)
        out, self.report = self.report, KVConnectorOutput()
        return out

    def has_pending(self) -> bool:
        return bool(self.inflight or self.sending)

    def _write(self, spec: LoadSpec) -> None:
        tokens: list[int] = spec.keys
        script = self.scripts[spec.request_id]
        B = self.runner.B
        for g, table in enumerate(spec.block_ids):
            for pos in range(spec.start, spec.end):
                k = pos // B
                if table[k] == 0:
                    continue  # outside a window: not needed
                bad = k in script.fail_indices
                self.runner.pages.setdefault(table[k], [None] * B)[pos % B] = (
                    g,
                    GARBAGE if bad else tokens[pos],
                )
        for j, gid in enumerate(self.runner.layout.state_group_ids):
            history = tuple(tokens[: spec.end])
            if script.fail_state:
                history = (GARBAGE,) * spec.end
            self.runner.states[(gid, spec.state_slots[j])] = history

    def _report_failures(self, spec: LoadSpec) -> None:
        script = self.scripts[spec.request_id]
        if script.fail_request:
            self.report.failed_recving[spec.request_id] = FailureReason.INJECTED
        if script.fail_state:
            self.report.invalid_state[spec.request_id] = FailureReason.INJECTED
        for table in spec.block_ids:
            for k in script.fail_indices:
                if k < len(table) and table[k] != 0:
                    self.report.invalid_block_ids[table[k]] = FailureReason.INJECTED
