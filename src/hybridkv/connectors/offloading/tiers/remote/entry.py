"""The remote tier's registry entry: its options (the ``remote_*`` keys) and factory.

Torch-free to import (the factory imports the tier, and the tier the valkey client).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hybridkv.connectors.config import OptionsContext, TierName
from hybridkv.connectors.offloading.config import OffloadingConfig, remote_values
from hybridkv.connectors.offloading.tier_registry import TierBuild, TierEntry, TierOptions

if TYPE_CHECKING:
    from hybridkv.connectors.offloading.tier_base import Tier


@dataclass(frozen=True, slots=True)
class RemoteOptions(TierOptions):
    KEYS: ClassVar[tuple[str, ...]] = (
        "remote_url",
        "remote_timeout_seconds",
        "remote_key_prefix",
        "remote_ttl_seconds",
        "remote_auth_key_file",
        "remote_username",
        "remote_password_file",
        "remote_tls_ca_file",
        "remote_tls_cert_file",
        "remote_tls_key_file",
    )
    remote_url: str
    remote_timeout_seconds: float = 2.0
    remote_key_prefix: str = "hybridkv:"
    remote_ttl_seconds: int | None = None
    remote_auth_key_file: str | None = None
    remote_username: str | None = None
    remote_password_file: str | None = None
    remote_tls_ca_file: str | None = None
    remote_tls_cert_file: str | None = None
    remote_tls_key_file: str | None = None

    @classmethod
    def parse(cls, extra: Mapping[str, Any], ctx: OptionsContext) -> RemoteOptions | None:
        values = remote_values(extra)  # every key checked, also without remote_url
        return None if "remote_url" not in values else cls(**values)


def _create_remote(options: RemoteOptions, build: TierBuild) -> Tier:
    from hybridkv.connectors.offloading.tiers.remote.tier import RemoteTier

    # the remote tier reads the flat ``remote_*`` fields, which parse copied from ``options``
    assert isinstance(build.shared, OffloadingConfig)
    return RemoteTier(build.shared, build.fingerprint, build.geometry)


ENTRY: TierEntry[Any] = TierEntry(
    TierName.REMOTE, "REMOTE", RemoteOptions, _create_remote, order=30
)
