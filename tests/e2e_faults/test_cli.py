"""``hybridkv generate --kv-transfer-config``: the FileConnector from the command line, and bad
configs rejected at start-up with a message that names the problem (exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hybridkv.cli import main

from .conftest import Builder
from .workload import fault_config, file_config, make_prompts

ENGINE_FLAGS = ["--dtype", "float32", "--block-size", "16", "--kv-cache-memory", "32MiB"]


@pytest.fixture(scope="module")
def model(checkpoint: Builder) -> Path:
    return checkpoint("granitemoehybrid")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "prompts.jsonl"
    lines = [json.dumps({"prompt_token_ids": p}) for p in make_prompts()[:4]]
    path.write_text("\n".join(lines) + "\n")
    return path


def generate_args(model: Path, prompts_file: Path, config: dict[str, Any] | str) -> list[str]:
    text = config if isinstance(config, str) else json.dumps(config)
    return [
        "generate",
        "--model",
        str(model),
        "--prompts-file",
        str(prompts_file),
        "--max-tokens",
        "4",
        "--json",
        "--kv-transfer-config",
        text,
        *ENGINE_FLAGS,
    ]


def run_cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridkv", *args], capture_output=True, text=True, timeout=120
    )


def records(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_generate_stores_then_loads_from_files(
    model: Path, prompts_file: Path, tmp_path: Path
) -> None:
    config = file_config(tmp_path / "kv", "async")
    first = run_cli(generate_args(model, prompts_file, config))
    assert first.returncode == 0, first.stderr[-2000:]
    cold = records(first.stdout)
    assert len(cold) == 4 and all("disk" not in r["cached_tokens"] for r in cold)
    assert any((tmp_path / "kv").rglob("*.kv")) and any((tmp_path / "kv").rglob("*.state"))

    second = run_cli(generate_args(model, prompts_file, config))  # a new process: files only
    assert second.returncode == 0, second.stderr[-2000:]
    warm = records(second.stdout)
    assert [r["token_ids"] for r in warm] == [r["token_ids"] for r in cold]
    assert all(r["cached_tokens"].get("disk", 0) > 0 for r in warm)
    assert all(r["finish_reason"] == "length" for r in warm)

    # every load fails and the policy is "fail": each request reports its error, exit 1
    broken = fault_config(tmp_path / "kv", "sync", "fail", block_failure_rate=1.0)
    third = run_cli(generate_args(model, prompts_file, broken))
    assert third.returncode == 1, third.stderr[-2000:]
    failed = records(third.stdout)
    assert all(r["finish_reason"] == "error" for r in failed)
    assert all("loading KV from the connector failed (injected)" in r["error"] for r in failed)
    assert "Traceback" not in third.stderr


def _bad_configs(tmp: Path) -> list[tuple[str, dict[str, Any] | str, str]]:
    """(id, --kv-transfer-config, text the error message must contain)."""
    good = file_config(tmp / "kv")
    extra = good["kv_connector_extra_config"]
    a_file = tmp / "not_a_directory"
    a_file.write_text("x")
    return [
        ("unknown-connector", {"kv_connector": "NoSuchConnector"}, "NoSuchConnector"),
        ("unknown-key", {**good, "kv_conector_role": "kv_both"}, "kv_conector_role"),
        ("bad-policy", {**good, "kv_load_failure_policy": "retry"}, "kv_load_failure_policy"),
        ("bad-role", {**good, "kv_role": "kv_sender"}, "kv_role"),
        ("not-json", "{kv_connector: FileConnector}", "not valid JSON"),
        ("not-an-object", "[1, 2]", "JSON object"),
        ("no-connector", {"kv_role": "kv_both"}, "kv_connector"),
        (
            "file-unknown-key",
            {**good, "kv_connector_extra_config": {**extra, "mode": "sync"}},
            "'mode'",
        ),
        ("file-no-path", {"kv_connector": "FileConnector"}, "'path'"),
        (
            "file-bad-load-mode",
            {**good, "kv_connector_extra_config": {**extra, "load_mode": "fast"}},
            "load_mode",
        ),
        (
            "file-path-is-a-file",
            {**good, "kv_connector_extra_config": {**extra, "path": str(a_file)}},
            str(a_file),
        ),
        (
            "faults-unknown-key",
            {
                **fault_config(tmp / "kv", "sync"),
                "kv_connector_extra_config": {"inner": good, "rate": 1},
            },
            "'rate'",
        ),
        (
            "faults-bad-rate",
            fault_config(tmp / "kv", "sync", block_failure_rate=1.5),
            "block_failure_rate",
        ),
        (
            "faults-bad-inner",
            fault_config(tmp / "kv", "sync") | {"kv_connector_extra_config": {"inner": {}}},
            "'inner'",
        ),
    ]


@pytest.mark.parametrize(
    "case",
    [
        "unknown-connector",
        "unknown-key",
        "bad-policy",
        "bad-role",
        "not-json",
        "not-an-object",
        "no-connector",
        "file-unknown-key",
        "file-no-path",
        "file-bad-load-mode",
        "file-path-is-a-file",
        "faults-unknown-key",
        "faults-bad-rate",
        "faults-bad-inner",
    ],
)
def test_bad_config_is_a_clear_startup_error(
    case: str,
    model: Path,
    prompts_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config, needle = {c[0]: (c[1], c[2]) for c in _bad_configs(tmp_path)}[case]
    code = main(generate_args(model, prompts_file, config))  # an exception here = a traceback
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == "", "nothing is generated"
    assert captured.err.startswith("hybridkv: error: "), captured.err
    assert needle in captured.err, captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err


def test_bad_config_process_exit_has_no_traceback(model: Path, prompts_file: Path) -> None:
    res = run_cli(generate_args(model, prompts_file, {"kv_connector": "NoSuchConnector"}))
    assert res.returncode == 2
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    assert "unknown kv_connector 'NoSuchConnector'" in res.stderr
    assert "FileConnector" in res.stderr  # it lists the ones that exist
