"""``create_nixl_connector``: the registry entry for ``kv_connector: "NixlConnector"``."""

from __future__ import annotations

import uuid

from hybridkv.connectors.base import KVConnectorPair
from hybridkv.connectors.config import KVRole, KVTransferConfig
from hybridkv.connectors.nixl.auth import load_auth_key
from hybridkv.connectors.nixl.layout import compat_digest, group_descs
from hybridkv.connectors.nixl.meta import ParamsPolicy
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.scheduler import NixlScheduler
from hybridkv.connectors.nixl.worker import NixlWorker
from hybridkv.connectors.registry import ConnectorContext


def create_nixl_connector(config: KVTransferConfig, context: ConnectorContext) -> KVConnectorPair:
    options = config.options_as(NixlOptions)
    producer = config.kv_role is not KVRole.CONSUMER
    consumer = config.kv_role.loads
    engine_id = f"hybridkv-{uuid.uuid4().hex[:16]}"
    layout = context.layout
    key = load_auth_key(options.auth_key_file, options.single_host())
    policy = ParamsPolicy(key, options.trusted())
    scheduler = NixlScheduler(
        options, engine_id, group_descs(layout), layout.block_size, producer, consumer, policy
    )
    compat = compat_digest(layout, context.model_id)
    worker = NixlWorker(options, layout, context.model_id, engine_id, producer, compat, key)
    return KVConnectorPair(scheduler, worker)
