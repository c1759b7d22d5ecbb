"""A thin, typed wrapper over one NIXL agent (UCX backend, host memory).

All calls happen on the engine thread. Transfers are READs of descriptor pairs
(local address, remote address, bytes) with a notification the remote agent receives once the
read completed.
"""

from __future__ import annotations

import logging
import os
import sys
from enum import Enum
from typing import Any

import numpy as np

from hybridkv.connectors.nixl.plan import Rows

log = logging.getLogger(__name__)


def _import_nixl() -> Any:
    try:
        import nixl_cu12 as nixl
    except ImportError:
        try:
            import nixl  # type: ignore[no-redef]
        except ImportError:
            raise ValueError(
                "NixlConnector needs the NIXL Python package: pip install nixl-cu12==1.5.1"
            ) from None
    _quiet_nixl_logging()
    return nixl


def _quiet_nixl_logging() -> None:
    """NIXL logs INFO lines to stdout, where they would corrupt a command's output (``generate
    --json``, the benchmarks' JSON): send them to stderr, warnings and up unless NIXL_LOG_LEVEL
    asks otherwise."""
    nixl_log = logging.getLogger("nixl")
    if not os.environ.get("NIXL_LOG_LEVEL"):
        nixl_log.setLevel(logging.WARNING)
    for handler in nixl_log.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)


PROGRESS_DELAY_US = int(os.environ.get("HYBRIDKV_NIXL_PROGRESS_DELAY_US", "100"))


def _with_progress_delay(nixl: Any, create: Any) -> Any:
    """Create an agent whose UCX progress thread waits ``PROGRESS_DELAY_US`` between rounds.

    The Python API hard-codes 0: the thread then spins, burning most of a core per engine even
    when idle (0.8 CPU-s per 2 s measured) and fighting the engine thread for the worker. A
    progress thread is still needed: a peer's READ completes only once this side answered
    UCX's wire-up and flush messages, which an idle engine thread would never do. With 100 µs
    it costs ~2 % of a core idle. The binding's constructor is swapped only for this call."""
    binding = nixl._api.nixlBind
    original = binding.nixlAgent

    def agent(name: str, config: Any) -> Any:
        config.pthrDelay = PROGRESS_DELAY_US
        return original(name, config)

    binding.nixlAgent = agent
    try:
        return create()
    finally:
        binding.nixlAgent = original


ERROR_MODES = ("peer", "none")


def ucx_params(error_mode: str = "peer") -> dict[str, str]:
    """The UCX backend's parameters. ``ucx_error_handling_mode``: ``error_mode`` (the
    connector's ``ucx_error_handling_mode`` option), or ``HYBRIDKV_NIXL_UCX_ERROR_MODE`` if
    set. ``peer`` (NIXL's default) detects dead peers on every transport, but UCX's shared-memory
    transports cannot, so on one host UCX then sends its messages over tcp/lo and every READ
    pays tcp progress (~15 µs at 4 KiB, ~50 µs at 1 MiB). ``none`` lets UCX use shared memory
    on one host (a READ of a dead producer's memory still fails: ``process_vm_readv`` errors);
    across hosts keep ``peer``, where a network error under ``none`` is fatal to UCX."""
    mode = os.environ.get("HYBRIDKV_NIXL_UCX_ERROR_MODE") or error_mode
    if mode not in ERROR_MODES:
        raise ValueError(f"NIXL ucx_error_handling_mode={mode!r}: expected one of {ERROR_MODES}")
    return {"ucx_error_handling_mode": mode}


def net_devices(option: str | None, single_host: bool) -> str | None:
    """The UCX network devices an agent listens and connects on: ``$UCX_NET_DEVICES`` when the
    user set it (None: UCX reads it), else the ``ucx_net_devices`` option, else ``lo`` for a
    single-host deployment (UCX then listens on loopback only), else None (UCX's default: every
    device, so a multi-host deployment names its interface). NIXL's own ``ucx_devices``
    parameter does not stop UCX's TCP transport from listening on every interface (checked with
    nixl 1.5.1: ``ss -tlnp`` shows the external address); the environment variable does."""
    if os.environ.get("UCX_NET_DEVICES"):
        return None
    return option or ("lo" if single_host else None)


class XferState(str, Enum):
    DONE = "DONE"
    PROC = "PROC"
    ERR = "ERR"


class NixlAgent:
    """Set-up calls go through NIXL's Python API; the per-load calls (descriptor lists,
    create, post, status, release) through its binding, the layer that API wraps: 6-10 µs
    less per load (docs/benchmarks.md, ninth session). Transfer handles are then the binding's
    integers; every one is released by its caller (``release``)."""

    def __init__(
        self,
        name: str,
        progress_thread: bool = True,
        error_mode: str = "peer",
        devices: str | None = None,
    ) -> None:
        """``progress_thread``: needed where peers read this agent's memory (a producer must
        answer their wire-up and flush messages while its engine thread computes); a
        consumer-only agent progresses in its own posts and polls, without the thread's lock.
        ``error_mode``: UCX's error handling (``ucx_params``). ``devices``: UCX's network
        devices (``net_devices``), set as ``UCX_NET_DEVICES`` for the process, which UCX reads
        when the backend is created."""
        params = ucx_params(error_mode)
        if devices:
            os.environ["UCX_NET_DEVICES"] = devices
        nixl = _import_nixl()
        config = nixl.nixl_agent_config(enable_prog_thread=progress_thread, backends=[])
        self.name = name
        self._agent = _with_progress_delay(nixl, lambda: nixl.nixl_agent(name, config))
        if "UCX" not in self._agent.get_plugin_list():
            raise ValueError("NIXL: the UCX backend is not available in this installation")
        self._agent.create_backend("UCX", params)
        self._regs: list[Any] = []
        bind = nixl._api.nixlBind
        self._raw, self._dlist, self._dram = self._agent.agent, bind.nixlXferDList, bind.DRAM_SEG
        self._read_op = self._agent.nixl_ops["READ"]
        self._states = {bind.NIXL_SUCCESS: XferState.DONE, bind.NIXL_IN_PROG: XferState.PROC}

    def register(self, regions: list[tuple[int, int]]) -> None:
        """Register host memory regions ``(address, bytes)`` once, at start-up."""
        regions = [(addr, size) for addr, size in regions if size > 0]
        if regions:
            descs = [(addr, size, 0, "") for addr, size in regions]
            self._regs.append(self._agent.register_memory(descs, "DRAM"))

    def close(self) -> None:
        """Deregister every region (peers can no longer reach this memory) and let NIXL's
        agent go: it is destroyed with its UCX workers and progress thread once the last
        prepared list referring to it is collected. Idempotent; no other call after it."""
        regs, self._regs = self._regs, []
        for reg in regs:
            try:
                self._agent.deregister_memory(reg)
            except Exception as exc:  # noqa: BLE001 - NIXL raises its own error types
                log.warning("NIXL: deregistering memory failed: %s", exc)
        self._agent = self._raw = None

    def metadata(self) -> bytes:
        return bytes(self._agent.get_agent_metadata())

    def add_remote(self, metadata: bytes) -> str:
        name = self._agent.add_remote_agent(metadata)
        return name.decode() if isinstance(name, bytes) else str(name)

    def remove_remote(self, name: str) -> None:
        try:
            self._agent.remove_remote_agent(name)
        except Exception as exc:  # noqa: BLE001 - NIXL raises its own error types
            log.warning("NIXL: removing remote agent %s failed: %s", name, exc)

    def read(self, remote: str, rows: Rows, notif: bytes) -> tuple[int, XferState]:
        """Post a READ of ``rows`` (local address, remote address, bytes); returns its handle
        and state (a same-host read is often DONE inside its post; raises on a posting
        error)."""
        local: Any
        far: Any
        if isinstance(rows, list):  # NIXL's (address, bytes, device 0) rows
            local, far = [(a, n, 0) for a, _, n in rows], [(b, n, 0) for _, b, n in rows]
        else:
            local = np.zeros((len(rows), 3), dtype=np.uint64)
            far = np.zeros((len(rows), 3), dtype=np.uint64)
            local[:, :2] = rows[:, ::2]
            far[:, :2] = rows[:, 1:]
        dlist, dram = self._dlist, self._dram
        handle = self._raw.createXferReq(self._read_op, dlist(dram, local), dlist(dram, far), remote, notif, [])  # fmt: skip
        return handle, self._post(handle)

    def prepare(self, remote: str | None, regions: list[tuple[int, int]]) -> Any:
        """A prepared descriptor list over ``regions`` (address, bytes) of this agent
        (``remote`` None) or of a remote agent, for ``read_prepared``; ``release_prepared``
        frees it."""
        rows = np.array([(a, n, 0) for a, n in regions], dtype=np.uint64).reshape(-1, 3)
        return self._agent.prep_xfer_dlist(remote or "NIXL_INIT_AGENT", rows, "DRAM")

    def read_prepared(
        self, local: Any, local_index: int, far: Any, far_index: int
    ) -> tuple[int, XferState]:
        """Post a READ of entry ``far_index`` of ``far`` into entry ``local_index`` of
        ``local`` (both from ``prepare``, same sizes); returns its handle and state."""
        handle = self._raw.makeXferReq(self._read_op, local._handle, [local_index], far._handle, [far_index], b"", [], False)  # fmt: skip
        return handle, self._post(handle)

    def release_prepared(self, prepared: Any) -> None:
        try:
            self._agent.release_dlist_handle(prepared)
        except Exception as exc:  # noqa: BLE001
            log.warning("NIXL: releasing a prepared descriptor list failed: %s", exc)

    def _post(self, handle: int) -> XferState:
        try:
            state = self._states.get(self._raw.postXferReq(handle, b""), XferState.ERR)
        except BaseException:
            # UCX may run a large read inside the post; a peer that dies during it raises here
            # (NIXL_ERR_REMOTE_DISCONNECT) with part of the bytes landed: the caller fails the
            # load, whose blocks are recomputed, never read.
            self.release(handle)
            raise
        if state is XferState.ERR:
            self.release(handle)
            raise RuntimeError("NIXL refused to post the read")
        return state

    def state(self, handle: int) -> XferState:
        return self._states.get(self._raw.getXferStatus(handle), XferState.ERR)

    def release(self, handle: int) -> bool:
        try:
            self._raw.releaseXferReq(handle)
            return True
        except Exception as exc:  # noqa: BLE001
            log.warning("NIXL: releasing a transfer handle failed: %s", exc)
            return False

    def notify(self, remote: str, message: bytes) -> None:
        self._agent.send_notif(remote, message)

    def notifications(self) -> list[bytes]:
        found = self._agent.get_new_notifs()
        return [bytes(m) for messages in found.values() for m in messages]
