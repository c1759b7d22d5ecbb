"""``pd_floor.py --sweep``: the floor once per UCX setting (transports, protocol selection, UCX's
error mode, huge pages, progress threads, polling), each in a child process with
``UCX_LOG_LEVEL=info`` and ``UCX_PROTO_INFO=y``, reporting which transport UCX chose."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = str(Path(__file__).with_name("pd_floor.py"))

NONE = ["--ucx-param", "ucx_error_handling_mode=none"]
SWEEP: list[tuple[str, dict[str, str], list[str]]] = [  # huge pages unless said (as CacheTensors)
    ("default (error mode peer)", {}, ["--hugepages"]),
    ("error mode peer, 4 KiB pages", {}, []),
    ("error mode none", {}, ["--hugepages", *NONE]),
    ("error mode none, 4 KiB pages", {}, NONE),
    ("UCX_TLS=cma,tcp,self", {"UCX_TLS": "cma,tcp,self"}, ["--hugepages"]),
    (
        "UCX_TLS=posix,cma,self, error mode none",
        {"UCX_TLS": "posix,cma,self"},
        ["--hugepages", *NONE],
    ),
    ("UCX_TLS=sm,self (peer: fails, no AM transport)", {"UCX_TLS": "sm,self"}, ["--hugepages"]),
    ("UCX_TLS=tcp,self", {"UCX_TLS": "tcp,self"}, ["--hugepages"]),
    ("UCX_PROTO_ENABLE=n (old protocols)", {"UCX_PROTO_ENABLE": "n"}, ["--hugepages"]),
    ("UCX_RMA_ZCOPY_MAX_SEG_SIZE=64M", {"UCX_RMA_ZCOPY_MAX_SEG_SIZE": "64M"}, ["--hugepages"]),
    ("producer progress thread delay 0 us", {}, ["--hugepages", "--delay-us", "0"]),
    ("consumer progress thread on", {}, ["--hugepages", "--consumer-thread"]),
    ("busy poll", {}, ["--hugepages", "--busy-poll"]),
]


def _transports(log: str) -> dict[str, list[str]]:
    """What UCX chose, from its INFO log and ``UCX_PROTO_INFO`` tables: the consumer's
    endpoint configuration to the producer and the rows of the remote-read protocol table."""
    lines = [line.split("]", 2)[-1].strip() for line in log.splitlines()]
    endpoints = sorted({line.split("UCX  INFO", 1)[1].strip() for line in lines if "intra-node cfg#" in line and "UCX  INFO" in line})  # fmt: skip
    reads: list[str] = []
    for i, line in enumerate(lines):
        if "remote memory read by ucp_get" in line and "intra-node" in lines[i - 1]:
            reads += [row for row in lines[i + 4 : i + 9] if row.startswith("|") and ".." in row]
    return {"endpoints": endpoints, "remote_read": sorted(set(reads))}


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, env, extra in SWEEP:
        cmd = [sys.executable, SCRIPT, "--repeats", str(args.repeats), "--sizes", *map(str, args.sizes), *extra]  # fmt: skip
        full_env = {**os.environ, **env, "UCX_PROTO_INFO": "y", "UCX_LOG_LEVEL": "info"}
        done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=600)
        start = done.stdout.rfind("\n{\n")
        if done.returncode or start < 0:
            out[label] = {"error": (done.stderr + done.stdout)[-2000:]}
            print(f"{label}: failed", file=sys.stderr, flush=True)
            continue
        floor = json.loads(done.stdout[start:])["floor"]
        out[label] = {**floor, "ucx": _transports(done.stdout + done.stderr)}
        row = {k: (v["us"]["floor"], v["floor_vs_copy"], v["floor_vs_pvr"]) for k, v in floor["by_bytes"].items()}  # fmt: skip
        print(f"{label}: {row} {out[label]['ucx']}", file=sys.stderr, flush=True)
    return out
