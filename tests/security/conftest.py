"""The security tests build their tiny checkpoints with the NixlConnector tests' fixture (one
set per session, shared)."""

from tests.connectors.nixl.conftest import checkpoint

__all__ = ["checkpoint"]
