"""Base classes for a connector that wraps one other (``FaultInjection``): every hook of the
contract goes to ``inner`` unchanged, so a wrapper overrides only what it changes and a hook
added to ``BaseConnectorScheduler`` / ``BaseConnectorWorker`` later is never silently left to
the default. ``tests/connectors/test_contract.py`` checks that each public hook is forwarded
here (and spelled out by ``MultiConnector``, which fans out to several children).

The optional hook groups are the inner's own objects (``capabilities``): a wrapper that
changes one of them answers with its own.
"""

from __future__ import annotations

from hybridkv.connectors.base import (
    BaseConnectorScheduler,
    BaseConnectorWorker,
    Capabilities,
    KVCacheAccess,
    KVConnectorRequest,
    RequestBlocks,
)
from hybridkv.connectors.stats import ConnectorStats
from hybridkv.step_io import ConnectorMetadata, KVConnectorOutput


class DelegatingConnectorScheduler(BaseConnectorScheduler):
    """A scheduler half that is ``inner``'s, hook by hook."""

    def __init__(self, inner: BaseConnectorScheduler) -> None:
        self.inner = inner

    def get_num_new_matched_tokens(
        self, request: KVConnectorRequest, num_local_computed: int
    ) -> tuple[int, bool] | None:
        return self.inner.get_num_new_matched_tokens(request, num_local_computed)

    def update_state_after_alloc(
        self, request: KVConnectorRequest, blocks: RequestBlocks, num_external_tokens: int
    ) -> None:
        self.inner.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(
        self, scheduled: list[tuple[KVConnectorRequest, int, int, RequestBlocks]]
    ) -> ConnectorMetadata:
        return self.inner.build_connector_meta(scheduled)

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        self.inner.update_connector_output(output)

    def has_pending(self) -> bool:
        return self.inner.has_pending()

    def request_finished(
        self, request: KVConnectorRequest, blocks: RequestBlocks
    ) -> tuple[bool, dict[str, object] | None]:
        return self.inner.request_finished(request, blocks)

    def get_step_interval(self, request: KVConnectorRequest) -> int:
        return self.inner.get_step_interval(request)

    def get_hit_sources(
        self, request: KVConnectorRequest, num_external_tokens: int
    ) -> dict[str, int]:
        return self.inner.get_hit_sources(request, num_external_tokens)

    def take_stats(self) -> ConnectorStats:
        return self.inner.take_stats()

    def capabilities(self) -> Capabilities:
        return self.inner.capabilities()


class DelegatingConnectorWorker(BaseConnectorWorker):
    """A worker half that is ``inner``'s, hook by hook."""

    def __init__(self, inner: BaseConnectorWorker) -> None:
        self.inner = inner

    def register_kv_caches(self, cache: KVCacheAccess) -> None:
        self.cache = cache
        self.inner.register_kv_caches(cache)

    def start_load(self, metadata: ConnectorMetadata) -> None:
        self.inner.start_load(metadata)

    def save(self, metadata: ConnectorMetadata) -> None:
        self.inner.save(metadata)

    def get_finished(self, finished_request_ids: list[str]) -> KVConnectorOutput:
        return self.inner.get_finished(finished_request_ids)

    def has_pending(self) -> bool:
        return self.inner.has_pending()

    def needs_steps(self) -> bool:
        return self.inner.needs_steps()

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        return self.inner.wait_for_saves(timeout)

    def wait_for_progress(self, timeout: float) -> None:
        self.inner.wait_for_progress(timeout)

    def take_stats(self) -> ConnectorStats:
        return self.inner.take_stats()

    def shutdown(self) -> None:
        self.inner.shutdown()
