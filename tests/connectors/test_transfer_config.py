"""``kv_transfer_config`` is parsed once, at the boundary, into typed values: the connector's
own options dataclass and enums. A bad connector option fails before any engine is built (no
weight read, no tier allocated), naming the option (in ``LLM()``, ``hybridkv generate`` and
``hybridkv serve``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hybridkv.cli import main
from hybridkv.config import EngineConfig
from hybridkv.connectors import registry
from hybridkv.connectors.config import (
    ConnectorOptions,
    KVRole,
    LoadFailurePolicy,
    LoadMode,
    OptionsContext,
)
from hybridkv.connectors.fault.plan import FaultConfig
from hybridkv.connectors.file.connector import FileConnectorConfig
from hybridkv.connectors.offloading.config import OffloadingConfig
from hybridkv.connectors.offloading.policies import Eviction
from hybridkv.connectors.registry import parse_kv_transfer_config
from hybridkv.engine.core import EngineCore

BAD_OPTIONS = [
    ({"cpu_bytes": "1GiB", "chunk_tokens": 17}, "chunk_tokens"),
    ({"cpu_bytes": "1GiB", "eviction": "mru"}, "eviction"),
    ({"cpu_bytes": "-1"}, "cpu_bytes"),
]


def offload(extra: dict[str, Any]) -> dict[str, Any]:
    return {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if an engine is built: a bad option is refused before any weight is
    read or any tier allocated (the engine does both), however fast the machine."""

    def refuse(*args: object, **kw: object) -> None:
        raise AssertionError("an engine was built before the bad option was refused")

    monkeypatch.setattr(EngineCore, "__init__", refuse)


@pytest.mark.parametrize(("extra", "name"), BAD_OPTIONS)
def test_bad_option_fails_fast_naming_it(extra: dict[str, Any], name: str, no_engine: None) -> None:
    with pytest.raises(ValueError, match=name):
        EngineConfig.create("/no/such/model", kv_transfer_config=offload(extra))


@pytest.mark.parametrize(("extra", "name"), BAD_OPTIONS)
def test_bad_option_on_the_command_line_fails_before_the_model(
    extra: dict[str, Any],
    name: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_engine: None,
) -> None:
    """The model path does not exist: had anything tried to read weights first, the error
    would be about the model, not the option."""
    import json

    args = ["generate", "--model", str(tmp_path / "no-model"), "--prompt", "hi"]
    code = main([*args, "--kv-transfer-config", json.dumps(offload(extra))])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("hybridkv: error: ") and name in err, err
    assert "no-model" not in err


def test_llm_without_a_model_checks_options_before_making_the_default_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hybridkv import LLM
    from hybridkv.engine import default_model

    def must_not_run() -> Path:
        raise AssertionError("the default model was built before the options were checked")

    monkeypatch.setattr(default_model, "ensure_default_model", must_not_run)
    with pytest.raises(ValueError, match="eviction"):
        LLM(kv_transfer_config=offload({"cpu_bytes": 4096, "eviction": "mru"}))


def test_parsed_config_is_typed() -> None:
    config = EngineConfig.create(
        "m",
        block_size=32,
        kv_transfer_config={
            "kv_connector": "FaultInjection",
            "kv_role": "kv_consumer",
            "kv_load_failure_policy": "fail",
            "kv_connector_extra_config": {
                "inner": offload({"cpu_bytes": "2KiB", "chunk_tokens": 64, "eviction": "arc"}),
                "corrupt_rate": 0.5,
            },
        },
    )
    transfer = config.kv_transfer_config
    assert transfer is not None
    assert transfer.kv_role is KVRole.CONSUMER
    assert transfer.kv_role.loads and not transfer.kv_role.saves
    assert transfer.kv_load_failure_policy is LoadFailurePolicy.FAIL
    faults = transfer.options_as(FaultConfig)
    assert faults.corrupt_rate == 0.5
    inner = faults.inner.options_as(OffloadingConfig)  # nested: parsed with the outer one
    assert (inner.cpu_bytes, inner.chunk_tokens) == (2048, 64)
    assert inner.eviction is Eviction.ARC and inner.load_mode is LoadMode.ASYNC
    with pytest.raises(TypeError, match="OffloadingConfig"):
        transfer.options_as(OffloadingConfig)


def test_chunk_tokens_is_checked_against_the_configured_block_size() -> None:
    ok = offload({"cpu_bytes": 4096, "chunk_tokens": 48})
    assert EngineConfig.create("m", block_size=16, kv_transfer_config=ok).kv_transfer_config
    with pytest.raises(ValueError, match="chunk_tokens"):
        EngineConfig.create("m", block_size=32, kv_transfer_config=ok)


def test_file_connector_options() -> None:
    parsed = parse_kv_transfer_config(
        '{"kv_connector": "FileConnector", "kv_connector_extra_config": '
        '{"path": "/x", "load_mode": "sync"}}',
        16,
    )
    assert parsed.options == FileConnectorConfig("/x", LoadMode.SYNC, True)
    assert parsed.kv_role is KVRole.BOTH
    assert parsed.kv_load_failure_policy is LoadFailurePolicy.RECOMPUTE


@dataclass(frozen=True, slots=True)
class _EchoOptions(ConnectorOptions):
    level: int = 0

    @classmethod
    def parse(cls, extra: Mapping[str, Any], ctx: OptionsContext) -> _EchoOptions:
        if set(extra) - {"level"}:
            raise ValueError(f"Echo: unknown keys {sorted(set(extra) - {'level'})}")
        return cls(int(extra.get("level", 0)) * ctx.block_size)


def test_an_out_of_tree_connector_registers_options_and_factory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register_connector(
        "Echo", options=f"{__name__}:_EchoOptions", factory=f"{__name__}:no_factory"
    )
    parsed = parse_kv_transfer_config(
        {"kv_connector": "Echo", "kv_connector_extra_config": {"level": 2}}, 16
    )
    assert parsed.options_as(_EchoOptions).level == 32
    with pytest.raises(ValueError, match="colour"):
        parse_kv_transfer_config(
            {"kv_connector": "Echo", "kv_connector_extra_config": {"colour": 1}}, 16
        )
    assert "Echo" in registry.connector_names()


def test_the_command_fails_without_loading_torch(tmp_path: Path) -> None:
    """In a fresh process: the error names the option and neither torch nor the model loaded."""
    import json
    import subprocess
    import sys

    config = json.dumps(offload({"cpu_bytes": "-1"}))
    argv = ["serve", "--model", str(tmp_path / "no-model"), "--kv-transfer-config", config]
    code = (
        "import sys\nfrom hybridkv.cli import main\n"
        f"rc = main({argv!r})\nassert 'torch' not in sys.modules, 'torch was loaded'\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("hybridkv: error: ") and "cpu_bytes" in proc.stderr
    assert "Traceback" not in proc.stderr
