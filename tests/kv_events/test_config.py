"""``--kv-events-config``: vLLM's keys parse into a frozen config; bad input names the key."""

from __future__ import annotations

import dataclasses

import pytest

from hybridkv.cli import build_parser, engine_options
from hybridkv.config import EngineConfig
from hybridkv.kv_events.config import KVEventsConfig, parse_kv_events_config

GOOD = (
    '{"enable_kv_cache_events": true, "publisher": "zmq", '
    '"endpoint": "tcp://127.0.0.1:5557", "topic": "kv-events"}'
)


def test_vllm_keys_parse_from_json_dict_and_engine_config() -> None:
    config = parse_kv_events_config(GOOD)
    assert config == KVEventsConfig(True, "zmq", "tcp://127.0.0.1:5557", topic="kv-events")
    assert config.enabled and config.max_queue_size == 100_000 and config.replay_endpoint is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.topic = "x"  # type: ignore[misc]
    engine = EngineConfig.create("m", kv_events_config={"enable_kv_cache_events": True})
    assert engine.kv_events_config == KVEventsConfig(enable_kv_cache_events=True)
    assert EngineConfig.create("m").kv_events_config is None


def test_the_cli_flag_comes_back_parsed() -> None:
    args = build_parser().parse_args(["generate", "--prompt", "x", "--kv-events-config", GOOD])
    assert engine_options(args)["kv_events_config"] == parse_kv_events_config(GOOD)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"enable_kv_cache_events": true', "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ({"enable_events": True}, "unknown keys ['enable_events']"),
        ({"enable_kv_cache_events": "yes"}, "enable_kv_cache_events='yes' must be a bool"),
        ({"publisher": "kafka"}, "publisher='kafka' is not one of ['null', 'zmq']"),
        ({"endpoint": "localhost:5557"}, "endpoint='localhost:5557' must start with"),
        ({"replay_endpoint": 5558}, "replay_endpoint=5558 must be a str"),
        ({"hwm": 0}, "hwm=0 must be a positive integer"),
        ({"max_queue_size": True}, "max_queue_size=True must be a int"),
        ({"buffer_steps": 2.5}, "buffer_steps=2.5 must be a int"),
        ({"heartbeat_seconds": "1"}, "heartbeat_seconds='1' must be a number"),
        ({"heartbeat_seconds": -1}, "heartbeat_seconds=-1 must be in [0, 3600]"),
        ({"heartbeat_seconds": float("nan")}, "heartbeat_seconds=nan must be in [0, 3600]"),
    ],
)
def test_bad_values_name_the_key(value: object, message: str) -> None:
    with pytest.raises(ValueError, match="kv_events_config") as info:
        parse_kv_events_config(value)  # type: ignore[arg-type]
    assert message in str(info.value)
