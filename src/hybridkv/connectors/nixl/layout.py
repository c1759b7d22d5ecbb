"""What a producer tells a consumer about its cache: the layout descriptor of the handshake.

Everything a consumer needs to address the producer's memory (base addresses, strides, block
size) plus a compatibility digest it checks first: model identity (architecture, weights,
dtype) and the grouping (kinds, windows, layers, per-token bytes). Block sizes may differ
between the two sides: transfers are described in tokens and mapped onto each side's pages.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from hybridkv.kv.spec import KVCacheLayout, SlidingWindowSpec, StateSpec, dtype_bytes

# 4: consumers send lease heartbeats (``heartbeats``); 5: the side channel authenticates both
# sides (``side_channel``) and the descriptor carries its block and staging entry counts
PROTOCOL_VERSION = 5


@dataclass(frozen=True, slots=True)
class GroupDesc:
    kind: str  # SpecKind value
    window: int  # sliding window in tokens (0: none)
    num_layers: int
    token_bytes: int  # attention: bytes of one token's K (or V) in one layer; state: 0


@dataclass(frozen=True, slots=True)
class TensorDesc:
    """One state tensor: slot s lives at ``base + s * slot_bytes``."""

    base: int
    slot_bytes: int


@dataclass(frozen=True, slots=True)
class LayoutDescriptor:
    engine_id: str
    compat: str
    block_size: int
    layer_page_bytes: int  # row stride of every backing tensor
    backing: tuple[int, ...]  # base address of backing tensor i
    groups: tuple[GroupDesc, ...]
    state_tensors: tuple[tuple[TensorDesc, ...], ...]  # per state group, in slot byte order
    staging_base: int  # a producer's staged state checkpoints (0: none)
    staging_stride: int  # bytes of one staged entry (every state group's slot)
    agent_metadata: bytes = b""
    lease_base: int = 0  # a producer's lease words (uint64 each; see ``leases``)
    lease_words: int = 0  # how many
    model_id: str = ""  # "architecture:weights identity:dtype" (for the mismatch message)
    lease_seconds: float = 0.0  # a producer's abort_timeout_seconds (0: not a producer)
    num_blocks: int = 0  # blocks of every backing tensor (remote block ids are below it)
    staging_entries: int = 0  # a producer's staged state entries (remote_state below it)

    def encode(self) -> bytes:
        data = asdict(self)
        data["agent_metadata"] = base64.b64encode(self.agent_metadata).decode()
        data["version"] = PROTOCOL_VERSION
        return json.dumps(data).encode()

    @classmethod
    def decode(cls, blob: bytes) -> LayoutDescriptor:
        """Raises ValueError for another version or any malformed field."""
        try:
            data: dict[str, Any] = json.loads(blob)
            version = data.pop("version", None)
        except (ValueError, AttributeError, TypeError):
            raise ValueError("a malformed layout descriptor") from None
        if version != PROTOCOL_VERSION:
            raise ValueError(
                f"the remote engine speaks NixlConnector protocol version {version}, this "
                f"engine {PROTOCOL_VERSION} (version 5 authenticates the handshake); run the "
                "same hybridkv version on the prefill and decode engines"
            )
        try:
            data["agent_metadata"] = base64.b64decode(data["agent_metadata"], validate=True)
            data["backing"] = tuple(data["backing"])
            data["groups"] = tuple(GroupDesc(**g) for g in data["groups"])
            data["state_tensors"] = tuple(
                tuple(TensorDesc(**t) for t in group) for group in data["state_tensors"]
            )
            desc = cls(**data)
        except (KeyError, TypeError, ValueError) as exc:  # binascii.Error is a ValueError
            raise ValueError(f"a malformed layout descriptor ({exc})") from None
        desc._check_numbers()
        return desc

    def _check_numbers(self) -> None:
        counts = (self.block_size, self.layer_page_bytes, self.num_blocks, self.lease_words,
                  self.staging_entries, self.staging_stride, self.lease_base, self.staging_base,
                  *self.backing)  # fmt: skip
        ok = all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 64 for n in counts
        )
        if not ok or self.block_size < 1:
            raise ValueError("a malformed layout descriptor (counts and addresses must be "
                             "non-negative integers)")  # fmt: skip

    def state_offsets(self, state_index: int) -> list[int]:
        """Byte offsets of each of a state group's tensors inside a staged entry."""
        offset = sum(t.slot_bytes for group in self.state_tensors[:state_index] for t in group)
        out = []
        for t in self.state_tensors[state_index]:
            out.append(offset)
            offset += t.slot_bytes
        return out


def group_descs(layout: KVCacheLayout) -> tuple[GroupDesc, ...]:
    out = []
    for g in layout.groups:
        spec = g.spec
        if isinstance(spec, StateSpec):
            out.append(GroupDesc(g.kind.value, 0, len(g.layer_ids), 0))
            continue
        window = spec.sliding_window if isinstance(spec, SlidingWindowSpec) else 0
        token = spec.num_kv_heads * spec.head_size * dtype_bytes(spec.dtype)
        out.append(GroupDesc(g.kind.value, window, len(g.layer_ids), token))
    return tuple(out)


def compat_digest(layout: KVCacheLayout, model_id: str) -> str:
    """Model identity and grouping, block size excluded (it may differ between P and D)."""
    groups = []
    for g, desc in zip(layout.groups, group_descs(layout), strict=True):
        spec = repr(g.spec) if isinstance(g.spec, StateSpec) else asdict(desc)
        groups.append([g.kind.value, list(g.layer_ids), spec])
    blob = json.dumps({"model": model_id, "groups": groups}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def check_compatible(local: LayoutDescriptor, remote: LayoutDescriptor) -> None:
    """Raise ValueError naming what differs if ``remote``'s KV cannot be loaded here."""
    if remote.compat == local.compat and remote.groups == local.groups:
        return
    head = f"the producer (engine {remote.engine_id}) has an incompatible KV layout: "
    raise ValueError(head + _difference(local, remote))


def _difference(local: LayoutDescriptor, remote: LayoutDescriptor) -> str:
    names = ("architecture", "weights", "dtype")
    mine, theirs = _model_parts(local.model_id), _model_parts(remote.model_id)
    for name, a, b in zip(names, mine, theirs, strict=True):
        if a != b:
            return f"{name} {b} there, {a} here (both engines must serve the same checkpoint)"
    if len(remote.groups) != len(local.groups):
        return f"{len(remote.groups)} KV cache groups there, {len(local.groups)} here"
    fields = ("kind", "window", "num_layers", "token_bytes")
    for i, (here, there) in enumerate(zip(local.groups, remote.groups, strict=True)):
        for f in fields:
            if getattr(here, f) != getattr(there, f):
                return f"group {i} {f} {getattr(there, f)} there, {getattr(here, f)} here"
    return (
        f"the layers or state shapes of the groups differ (layout digest {remote.compat} "
        f"there, {local.compat} here)"
    )


def _model_parts(model_id: str) -> tuple[str, str, str]:
    arch, _, rest = model_id.partition(":")
    weights, _, dtype = rest.rpartition(":")
    return arch, weights, dtype
