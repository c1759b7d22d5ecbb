"""The remote tier: unit parts as values in a Valkey (or Redis) server shared by engines.

::

    <remote_key_prefix><keyed name of fingerprint, chunk_tokens, unit hash, group>:<i>

A part is stored in ``tiers.remote.format``: an authenticated header as value 0 (a MAC with the
deployment key, ``tiers.remote.key``, over the span, the length, the payload's keyed digest, the
fingerprint and the part key), the payload in values of at most ``VALUE_BYTES``. Names are
keyed hashes, so engines of another model, layout or key never see a value, and no one without
the key can tell what the server holds. A value that does not authenticate (forged, garbled,
cut, of the wrong size) is a counted load failure and recomputed, its sizes checked before
anything is allocated (``tiers.remote.reply``). Credentials and TLS: ``tiers.remote.connect``. A unit is written with one
pipelined batch of ``SET``s (with ``EX`` if ``remote_ttl_seconds``) and read per part with one
``MGET``; every read is verified.

The server may evict any value (``maxmemory`` + ``allkeys-lru``) or lose everything (a
restart), so the index only says "this process believed it was there": a unit is found for
another process only if **every** value of every part exists (one ``EXISTS`` over all its keys,
pipelined over a request's following units, on the probe worker), and a value gone at load
time is a ``missing`` load failure (counted, recovered by recompute) that also deletes the
unit's other values. Every command has ``remote_timeout_seconds`` as its socket timeout, on a
bounded connection pool; a connection error or timeout marks the server down for
``RETRY_SECONDS`` (lookups miss, loads fail, stores are dropped, all counted without waiting),
after which the pool reconnects by itself.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import valkey
from valkey._parsers.encoders import Encoder
from valkey.connection import PythonRespSerializer

from hybridkv.connectors.config import TierName
from hybridkv.connectors.offloading.config import OffloadingConfig
from hybridkv.connectors.offloading.policies import Eviction, create_policy
from hybridkv.connectors.offloading.rate_log import RateLimitedLog
from hybridkv.connectors.offloading.tier import TierIndex
from hybridkv.connectors.offloading.tier_base import ProbeAnswer, Tier, UnitRef
from hybridkv.connectors.offloading.tiers.disk.key import DirectoryKey
from hybridkv.connectors.offloading.tiers.remote.checks import RemoteChecks
from hybridkv.connectors.offloading.tiers.remote.connect import check_server, create_pool
from hybridkv.connectors.offloading.tiers.remote.format import (
    HEADER_BYTES,
    encode_header,
    parse_part,
    value_name,
)
from hybridkv.connectors.offloading.tiers.remote.key import load_remote_key
from hybridkv.connectors.offloading.tiers.remote.reply import ReplyReader, read_part_reply
from hybridkv.connectors.offloading.units import UnitGeometry, part_key
from hybridkv.connectors.part_error import IO_ERROR, MISSING, PartError
from hybridkv.kv.hashing import BlockHash
from hybridkv.step_io import FailureReason

VALUE_BYTES = 4 << 20  # a few MiB per value: big enough to stream, small enough for the server
RETRY_SECONDS = 1.0  # after a connection error or timeout, the server is skipped this long
NUM_IO_THREADS = 2
TIMEOUT = FailureReason.TIMEOUT
_UNBOUNDED = 1 << 62  # the server bounds its memory; the index only tracks what we stored

ServerError = (valkey.ConnectionError, valkey.TimeoutError)
# ``_tensor`` shares a reply's read-only bytes on purpose (see there).
warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning, __name__)


class RemoteTier(Tier):
    name = TierName.REMOTE
    removed_counter = "values_removed"

    def __init__(
        self,
        options: OffloadingConfig,
        fingerprint: str,
        geometry: UnitGeometry,
        dkey: DirectoryKey | None = None,
    ) -> None:
        """Connects as ``options`` say (``tiers.remote.connect``); ``ValueError`` naming the option
        if the key or the credentials cannot be used. ``dkey``: the deployment key (default:
        ``load_remote_key``)."""
        self.fingerprint = fingerprint
        self.geometry = geometry
        self.timeout = options.remote_timeout_seconds
        self.ttl = options.remote_ttl_seconds
        self.key = dkey if dkey is not None else load_remote_key(options.remote_auth_key_file)
        self.prefix = options.remote_key_prefix
        self.namespace = f"{fingerprint}:c{geometry.chunk_tokens}"
        self.pool: Any = create_pool(options, _ZeroCopyPacker())  # valkey-py is untyped
        self.client = valkey.Valkey(connection_pool=self.pool)
        check_server(self.client, options)
        self._error_log = RateLimitedLog("remote tier")
        self.index = TierIndex("remote", _UNBOUNDED, create_policy(Eviction.LRU, 1 << 20))
        self.io = ThreadPoolExecutor(NUM_IO_THREADS, thread_name_prefix="offload-remote")
        self._counters: dict[str, float] = {}  # under ``_lock``
        self.clock: Callable[[], float] = time.monotonic
        self._lock = threading.Lock()
        self._down_until = 0.0
        self.checks = RemoteChecks(
            self.index, self._count_keys, self._now, self.is_down, self._progressed
        )

    # -- keys ----------------------------------------------------------------------------

    def part_keys(self, unit_hash: BlockHash, group_id: int, end: int) -> list[str]:
        name = value_name(self.key, self.namespace, part_key(unit_hash, group_id))
        num_values = 1 + -(-self.geometry.part_nbytes(group_id, end) // VALUE_BYTES)
        return [f"{self.prefix}{name}:{i}" for i in range(num_values)]

    def unit_keys(self, unit_hash: BlockHash, end: int) -> list[str]:
        return [
            k
            for g in self.geometry.layout.groups
            for k in self.part_keys(unit_hash, g.group_id, end)
        ]

    # -- the server's health -------------------------------------------------------------

    def _now(self) -> float:
        return self.clock()

    def _progressed(self) -> None:
        if self.progress is not None:
            self.progress()

    def is_down(self) -> bool:
        with self._lock:
            return self.clock() < self._down_until

    def _failed(self, exc: BaseException) -> None:
        """A connection error or timeout: skip the server for ``RETRY_SECONDS``."""
        with self._lock:
            self._down_until = self.clock() + RETRY_SECONDS
        self._count("remote_errors", f"remote_errors:{type(exc).__name__}")
        self._error_log.warn(f"{type(exc).__name__}: {exc}; skipped for {RETRY_SECONDS} s")

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run one round trip, or raise ``PartError(IO_ERROR)`` (server down or failing)."""
        if self.is_down():
            raise PartError(IO_ERROR, "remote store down")
        try:
            return fn()
        except ServerError as exc:
            self._failed(exc)
            raise PartError(IO_ERROR, f"remote: {type(exc).__name__}") from None
        except valkey.ValkeyError as exc:  # e.g. OOM: the server answers, but refuses
            self._count(f"remote_errors:{type(exc).__name__}")
            self._error_log.warn(f"{type(exc).__name__}: {exc}")
            raise PartError(IO_ERROR, f"remote: {exc}") from None

    # -- bytes (I/O workers) -------------------------------------------------------------

    def write(self, unit_hash: BlockHash, end: int, parts: dict[int, Any]) -> int:
        total = 0
        pipe = self.client.pipeline(transaction=False)
        for gid, data in parts.items():
            array: Any = data.contiguous().numpy()
            payload = memoryview(array).cast("B")
            key = part_key(unit_hash, gid)
            span = self.geometry.part_span(gid, end)
            head = encode_header(self.key, self.fingerprint, key, span, payload)
            names = self.part_keys(unit_hash, gid, end)
            for name, value in zip(names, _values(head, payload), strict=True):
                pipe.set(name, value, ex=self.ttl)
            total += payload.nbytes
        self._call(pipe.execute)
        if not self.index.commit(unit_hash, {}):  # the reservation was dropped meanwhile
            self._delete(unit_hash, end)
        else:
            self.checks.seen_complete(unit_hash)
        return total

    def read(
        self, unit_hash: BlockHash, end: int, group_id: int, deadline: float | None = None
    ) -> torch.Tensor:
        keys = self.part_keys(unit_hash, group_id, end)
        nbytes = self.geometry.part_nbytes(group_id, end)
        reply = self._call(lambda: self._mget(keys, nbytes, deadline))
        key = part_key(unit_hash, group_id)
        if reply is None:
            raise PartError(MISSING, f"remote part {key}")
        span = self.geometry.part_span(group_id, end)
        payload = parse_part(self.key, reply[0], reply[1], self.fingerprint, key, span, nbytes)
        return _tensor(payload)

    def _mget(
        self, keys: list[str], payload_nbytes: int, deadline: float | None
    ) -> tuple[bytes, list[memoryview]] | None:
        """One part's ``MGET`` (``tiers.remote.reply``: header value, payload pieces; None if a
        value is missing) whose socket waits end by the load's ``deadline`` too; a wait cut
        short by it is ``PartError(TIMEOUT)`` (the server is not marked down for that). A
        value of the wrong size is ``PartError(CORRUPT)``; the connection is dropped then."""
        wait = self.timeout if deadline is None else min(self.timeout, deadline - time.monotonic())
        if wait <= 0:
            raise PartError(TIMEOUT, "the load's deadline passed")
        conn: Any = self.pool.get_connection("MGET")
        try:
            conn._sock.settimeout(wait)
            conn.send_command("MGET", *keys)
            reader = ReplyReader(conn._sock)
            return read_part_reply(reader, len(keys), HEADER_BYTES, payload_nbytes)
        except valkey.TimeoutError:
            conn.disconnect()  # the rest of the reply may still come: the stream is lost
            if wait < self.timeout:
                raise PartError(TIMEOUT, "the load's deadline passed") from None
            raise
        except BaseException:
            conn.disconnect()
            raise
        finally:
            if conn._sock is not None:  # None: disconnected by the error
                conn._sock.settimeout(self.timeout)
            self.pool.release(conn)

    def discard_bad(self, unit_hash: BlockHash, reason: str) -> int:
        entry = self.index.remove(unit_hash)
        if entry is None or reason == IO_ERROR:
            return 0
        try:
            return self._delete(unit_hash, entry.end)
        except PartError:
            return 0

    def _delete(self, unit_hash: BlockHash, end: int) -> int:
        keys = self.unit_keys(unit_hash, end)
        return int(self._call(lambda: self.client.delete(*keys)))

    def submit(self, fn: Callable[[], Any], key: Hashable | None = None) -> Future[Any]:
        return self.io.submit(fn)

    # -- what lookups ask (scheduler thread; checks on the probe worker, ``tiers.remote.checks``) --

    def probe(self, units: Sequence[UnitRef]) -> ProbeAnswer:
        return self.checks.probe(units)

    def confirm(self, units: Sequence[UnitRef]) -> int | None:
        return self.checks.confirm(units)

    def probing(self) -> bool:
        return self.checks.probing()

    def take_found(self) -> list[UnitRef]:
        return self.checks.take_found()

    def mark_absent(self, unit_hash: BlockHash) -> None:
        self.checks.mark_absent(unit_hash)

    def _count_keys(self, units: Sequence[UnitRef]) -> list[tuple[int, int]]:
        """How many of each unit's values exist, and how many it has (one round trip)."""
        keys = [self.unit_keys(u.unit_hash, u.end) for u in units]
        pipe = self.client.pipeline(transaction=False)
        for unit_keys in keys:
            pipe.exists(*unit_keys)
        counts = self._call(pipe.execute)
        return [(int(n), len(k)) for n, k in zip(counts, keys, strict=True)]

    def _count(self, *names: str) -> None:
        with self._lock:
            for name in names:
                self._counters[name] = self._counters.get(name, 0) + 1

    def take_counters(self) -> dict[str, float]:
        with self._lock:
            counters, self._counters = self._counters, {}
        for name, value in self.checks.take_counts().items():
            counters[name] = counters.get(name, 0) + value
        return counters

    def shutdown(self) -> None:
        self.checks.shutdown()
        self.io.shutdown(wait=True)
        self.pool.disconnect()


def _tensor(payload: bytes | memoryview) -> torch.Tensor:
    """A verified payload as a flat uint8 tensor sharing its memory. The tensor is only read
    (rows are copied into the cache), so a read-only buffer (a reply's ``bytes``) is fine."""
    if not payload:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(payload, dtype=torch.uint8)


def _values(head: bytes, payload: memoryview) -> list[bytes | memoryview]:
    """The header as value 0, then the payload in values of at most ``VALUE_BYTES`` (views of
    the snapshot, sent without a copy); concatenated, they are the disk format's bytes."""
    values: list[bytes | memoryview] = [head]
    values.extend(payload[i : i + VALUE_BYTES] for i in range(0, payload.nbytes, VALUE_BYTES))
    return values


class _ZeroCopyPacker(PythonRespSerializer):
    """valkey-py's pure-Python command packer: large values (our snapshot's memoryviews) go to
    ``sendall`` as they are. The default with ``libvalkey`` copies every argument into one
    ``bytes`` per command (a copy of the whole unit on the store path)."""

    def __init__(self) -> None:
        super().__init__(6000, Encoder("utf-8", "strict", False).encode)  # type: ignore[no-untyped-call]
