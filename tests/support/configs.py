"""``kv_transfer_config`` dicts that tests pass to engines and connectors."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def offload_config(
    cpu: int | str | None = None,
    disk: Path | None = None,
    remote: str | None = None,
    *,
    default_disk_bytes: str = "64MiB",
    **extra: Any,
) -> dict[str, Any]:
    """The OffloadingConnector with the tiers named (a CPU budget, a disk directory of
    ``default_disk_bytes`` unless ``extra`` says otherwise, a remote URL) and ``extra``'s options
    (``chunk_tokens`` among them)."""
    options: dict[str, Any] = dict(extra)
    if remote is not None:
        options["remote_url"] = remote
    if cpu is not None:
        options["cpu_bytes"] = cpu
    if disk is not None:
        options["disk_path"] = str(disk)
        options.setdefault("disk_bytes", default_disk_bytes)
    return {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": options}
