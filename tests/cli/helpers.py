"""Run the ``hybridkv`` command line in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_cli(
    *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hybridkv", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=full_env,
        check=False,
    )


def write_prompts_file(path: Path, prompts: list[Any]) -> Path:
    """One JSON object per line: token-id lists become ``prompt_token_ids``, str ``prompt``."""
    lines = []
    for p in prompts:
        obj = {"prompt": p} if isinstance(p, str) else {"prompt_token_ids": p}
        lines.append(json.dumps(obj))
    path.write_text("\n".join(lines) + "\n")
    return path


def json_records(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def assert_clean_error(proc: subprocess.CompletedProcess[str], message: str) -> None:
    """Non-zero exit, ``hybridkv: error: ...`` naming the problem, and no traceback."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert "hybridkv: error:" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr
