"""The weights identity that keys every external KV cache covers every byte of the weights,
the tokenizer and the config (issue 18: it once hashed only each file's first 64 KiB, and a
fine-tune reused its base model's disk cache)."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybridkv.engine import weights_id
from hybridkv.engine.weights_id import DIGEST_CACHE, weights_identity
from tests.engine.helpers import assert_no_leaks, copy_checkpoint, greedy, make_llm, random_ids
from tests.support.cache_dirs import private_cache

HEAD = 1 << 16  # what the old identity read of each file


def fine_tune(src: Path, dst: Path) -> Path:
    """A copy with every tensor stored past the first 64 KiB scaled by 1.5: same names, sizes
    and first 64 KiB, different weights."""
    model_dir = copy_checkpoint(src, dst)
    path = model_dir / "model.safetensors"
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    late = [n for n, v in header.items() if n != "__metadata__" and v["data_offsets"][0] + 8 + header_len > HEAD]  # fmt: skip
    tensors = load_file(str(path))
    for name in late:
        tensors[name] = tensors[name] * 1.5
    save_file(tensors, str(path), header.get("__metadata__"))
    assert late and path.read_bytes()[:HEAD] == raw[:HEAD] and path.stat().st_size == len(raw)
    return model_dir


@pytest.fixture(scope="module")
def base(checkpoints: dict[str, Path]) -> Path:
    return checkpoints["granitemoehybrid"]


def test_identity_covers_every_byte_tokenizer_and_config(base: Path, tmp_path: Path) -> None:
    ident = weights_identity(base, tmp_path / "cache")
    assert weights_identity(copy_checkpoint(base, tmp_path / "copy"), None) == ident
    assert weights_identity(fine_tune(base, tmp_path / "tuned"), None) != ident
    tok = copy_checkpoint(base, tmp_path / "tok")
    config = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<x>"}))
    assert weights_identity(tok, None) != ident
    cfg = copy_checkpoint(base, tmp_path / "cfg")
    config = json.loads((cfg / "config.json").read_text())
    (cfg / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    assert weights_identity(cfg, None) != ident


def count_hashing(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files hashed from now on."""
    calls: list[str] = []
    real = weights_id.file_digest

    def counting(path: Path) -> str:
        calls.append(path.name)
        return real(path)

    monkeypatch.setattr(weights_id, "file_digest", counting)
    return calls


def test_digests_are_cached_per_file_version(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = copy_checkpoint(base, tmp_path / "m")
    calls = count_hashing(monkeypatch)
    monkeypatch.setattr(weights_id, "RACY_SECONDS", 0.0)  # the copy was just written
    cache = tmp_path / "cache"
    first = weights_identity(model_dir, cache)
    assert "model.safetensors" in calls and (cache / DIGEST_CACHE).is_file()
    calls.clear()
    assert weights_identity(model_dir, cache) == first and calls == []  # start-up stays fast
    tensors = load_file(str(model_dir / "model.safetensors"))
    name = sorted(tensors)[-1]
    tensors[name] = tensors[name] + 1.0  # a new version of the file: rehashed
    save_file(tensors, str(model_dir / "model.safetensors"), {"format": "pt"})
    assert weights_identity(model_dir, cache) != first and calls == ["model.safetensors"]
    (cache / DIGEST_CACHE).write_text("{not json")  # a broken cache only costs hashing
    assert weights_identity(model_dir, cache) == weights_identity(model_dir, None)


def test_an_in_place_edit_with_its_mtime_restored_is_hashed_again(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 finding 10: same size, same inode, mtime put back with ``os.utime``: the
    change time (which no unprivileged process can set) still tells the versions apart."""
    model_dir = copy_checkpoint(base, tmp_path / "m")
    monkeypatch.setattr(weights_id, "RACY_SECONDS", 0.0)  # the copy was just written
    cache = tmp_path / "cache"
    first = weights_identity(model_dir, cache)
    path = model_dir / "model.safetensors"
    before = path.stat()
    time.sleep(0.05)  # past the kernel's timestamp tick (1-10 ms); RACY_SECONDS guards a tick
    with path.open("r+b") as f:  # flip one bit of the last tensor's last byte, in place
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 1]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    same = ("st_size", "st_ino", "st_dev", "st_mtime_ns")
    assert all(getattr(after, k) == getattr(before, k) for k in same)
    edited = weights_identity(model_dir, cache)
    assert edited != first and edited == weights_identity(model_dir, None)


def test_a_file_written_just_now_is_hashed_but_not_cached(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write in the same clock tick as the stat would leave the ctime as it was: a digest
    is cached only once the file is ``RACY_SECONDS`` old."""
    model_dir = copy_checkpoint(base, tmp_path / "m")
    calls = count_hashing(monkeypatch)
    cache = tmp_path / "cache"
    first = weights_identity(model_dir, cache)
    assert weights_identity(model_dir, cache) == first
    assert calls.count("model.safetensors") == 2  # hashed again: not cached while racy
    later = time.time_ns() + int(2 * weights_id.RACY_SECONDS * 1e9)
    monkeypatch.setattr(weights_id, "time", SimpleNamespace(time_ns=lambda: later))
    calls.clear()
    assert weights_identity(model_dir, cache) == first and "model.safetensors" in calls
    calls.clear()
    assert weights_identity(model_dir, cache) == first and calls == []


def external_hits(outs: list[Any]) -> int:
    return sum(n for o in outs for src, n in o.cached_tokens.items() if src != "local")


def test_fine_tune_gets_no_hits_from_the_base_models_disk_cache(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a fresh cache (no weights identity remembered) with the shared kernels: not compiled again
    monkeypatch.setenv("HYBRIDKV_CACHE_DIR", str(private_cache(tmp_path / "hybridkv-cache")))
    tuned = fine_tune(base, tmp_path / "tuned")
    prompts = [random_ids(40, 60), random_ids(70, 61)]
    kv = {"kv_connector": "FileConnector", "kv_connector_extra_config": {"path": str(tmp_path / "kv")}}  # fmt: skip

    def run(model_dir: Path, config: dict[str, Any] | None) -> list[Any]:
        llm = make_llm(model_dir, kv_transfer_config=config)
        outs = llm.generate(prompts, greedy(6, ignore_eos=True), use_tqdm=False)
        assert_no_leaks(llm.engine)
        llm.engine.shutdown()
        return outs

    run(base, kv)  # stores the base model's KV
    assert external_hits(run(copy_checkpoint(base, tmp_path / "same"), kv)) > 0  # same bytes
    got, plain = run(tuned, kv), run(tuned, None)
    assert external_hits(got) == 0
    for a, b in zip(got, plain, strict=True):
        assert a.token_ids == b.token_ids
        diff = (torch.tensor(a.logits) - torch.tensor(b.logits)).abs().max().item()
        assert diff < 1e-4
