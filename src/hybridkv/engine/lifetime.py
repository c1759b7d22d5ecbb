"""What an engine must give back when it ends: its connector's threads, buffers and
registrations, and its KV events' sockets.

``EngineCore`` puts them in an ``EngineResources`` as it creates them and registers
``release`` with ``weakref.finalize``, so they are released exactly once, by whichever comes
first:

- ``EngineCore.shutdown()`` (``LLM.close()``, the end of a ``with LLM(...)`` block, the end of
  ``hybridkv serve``);
- the engine being garbage collected (``del llm; gc.collect()``: a notebook that re-creates
  engines);
- the interpreter exiting (``weakref.finalize`` runs at exit: saves still in flight get their
  bounded wait).

NOTE: ``release`` must never reach the engine itself (a reference to it from the finalizer
would keep it alive forever): it holds the connector pair and the collector only.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ParamSpec

if TYPE_CHECKING:
    from hybridkv.connectors.base import KVConnectorPair
    from hybridkv.engine.cache_access import DeviceCacheAccess
    from hybridkv.kv_events.collector import KVEventCollector

logger = logging.getLogger(__name__)
P = ParamSpec("P")

SAVE_WAIT_SECONDS = 30.0  # saves handed over before the end get this long to become durable


class EngineClosedError(RuntimeError):
    """The engine was shut down (``LLM.close()``, a ``with`` block's end): create another."""


def weak_method(method: Callable[P, None]) -> Callable[P, None]:
    """``method`` (bound to the engine) without a strong reference to the engine, for the
    engine's own parts: the engine stays out of reference cycles, so dropping its last
    reference ends it at once (the finalizer runs outside the collector, and one
    ``gc.collect()`` afterwards frees the connector's own cycles)."""
    ref = weakref.WeakMethod(method)

    def call(*args: P.args, **kwargs: P.kwargs) -> None:
        bound = ref()
        if bound is None:
            raise EngineClosedError("the engine is gone")
        bound(*args, **kwargs)

    return call


@dataclass(slots=True)
class EngineResources:
    """The engine's parts that own threads or memory outside the device cache."""

    connector: KVConnectorPair | None = None
    cache: DeviceCacheAccess | None = None  # the connector's view of the device cache
    kv_events: KVEventCollector | None = None

    def release(self) -> None:
        """Wait (bounded) for saves, stop and join the connector's threads, free its buffers
        and registrations, close the events' sockets. Every step is tried even if an earlier
        one failed (a failure is logged, never raised: this runs from ``close()``, a
        ``with`` block's exit and the garbage collector, none of which may raise). Called once
        (``weakref.finalize`` guarantees it)."""
        connector, self.connector = self.connector, None
        events, self.kv_events = self.kv_events, None
        if connector is not None:
            worker = connector.worker
            _attempt("wait for the connector's saves", worker.wait_for_saves, SAVE_WAIT_SECONDS)
            _attempt("shut the connector down", worker.shutdown)
        if self.cache is not None:
            self.cache.release()
            self.cache = None
        if events is not None:
            _attempt("shut the KV events publisher down", events.publisher.shutdown)


def _attempt(what: str, fn: Callable[..., object], *args: object) -> None:
    try:
        if fn(*args) is False:
            logger.warning("engine shutdown: could not %s in time", what)
    except Exception:
        logger.exception("engine shutdown: could not %s", what)
