"""One decode token's quantized projections of a GGUF file through ``quant_linear`` (the
path decode takes: int8 activations for Q4_K / Q6_K, float32 for Q8_0), against the weight-read
floor measured in the same passes (``quant_decode.step_seconds``: each pass's time x the
bandwidth of the 512 MiB ``torch.sum`` just before it / the file's projection bytes), and,
with ``--llama-bench``, llama.cpp's whole token on the same file (``llama-bench -p 0 -n N``,
same threads, its best sample) against the floor measured right after it (best ``torch.sum``). Every 2-D Q8_0 / Q4_K / Q6_K tensor but the token
embedding is one projection of the token (the embedding is read for one row only).

``--make-random FILE`` first writes a ~1.26B-parameter random qwen3 (hidden 2048, MLP 8192,
20 layers; every projection Q4_K by the project's packer, 718 MB: larger than this machine's
L3, so neither engine runs from cache) -- "a pure Q4_K file".

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/quant_gguf_decode.py \\
        --make-random /tmp/qwen3-big-q4_k.gguf --threads 1 2 --repeats 5 \\
        --llama-bench /work/llamacpp/build/bin/llama-bench
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import torch

from bench_common import cpu_flags, machine_info
from hybridkv.model.layers.quant_linear import quant_linear
from hybridkv.model.loading.tiny_tokenizer import write_tokenizer
from hybridkv.native.quant_blocks import QuantFormat, pack
from quant_decode import read_bandwidth, step_seconds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' GGUF tokenizer writer
from tests.support.gguf_checkpoints import _write_tokenizer  # noqa: E402

FORMATS = {f.layout.ggml_type: f for f in QuantFormat}
# hidden, MLP, layers, heads, KV heads, head dim, vocab of --make-random
HIDDEN, MLP, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 2048, 8192, 20, 16, 8, 128, 1024


def make_random_gguf(path: Path) -> None:
    """A random qwen3 GGUF, every projection Q4_K, norms and embedding float32."""
    tok_dir = path.parent / f"{path.stem}-tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    write_tokenizer(tok_dir, VOCAB)
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_block_count(LAYERS), w.add_context_length(4096), w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(MLP), w.add_head_count(HEADS), w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM), w.add_value_length(HEAD_DIM), w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    _write_tokenizer(w, tok_dir)
    gen = np.random.default_rng(0)

    def mat(name: str, n: int, k: int) -> None:
        values = gen.standard_normal((n, k), dtype=np.float32) * 0.02
        raw = gguf.GGMLQuantizationType.Q4_K
        w.add_tensor(name, pack(values, QuantFormat.Q4_K), raw_dtype=raw)

    w.add_tensor("token_embd.weight", gen.standard_normal((VOCAB, HIDDEN), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    mat("output.weight", VOCAB, HIDDEN)
    for i in range(LAYERS):
        for norm, size in (("attn_norm", HIDDEN), ("ffn_norm", HIDDEN), ("attn_q_norm", HEAD_DIM),
                           ("attn_k_norm", HEAD_DIM)):  # fmt: skip
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(size, np.float32))
        for name, n, k in (("attn_q", HEADS * HEAD_DIM, HIDDEN), ("attn_k", KV_HEADS * HEAD_DIM, HIDDEN),
                           ("attn_v", KV_HEADS * HEAD_DIM, HIDDEN), ("attn_output", HIDDEN, HEADS * HEAD_DIM),
                           ("ffn_gate", MLP, HIDDEN), ("ffn_up", MLP, HIDDEN), ("ffn_down", HIDDEN, MLP)):  # fmt: skip
            mat(f"blk.{i}.{name}.weight", n, k)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


def projections(path: Path) -> list[tuple[torch.Tensor, QuantFormat, int]]:
    """(uint8 [N, row_bytes], format, K) of every quantized projection of the file."""
    out = []
    for t in gguf.GGUFReader(str(path)).tensors:
        fmt = FORMATS.get(int(t.tensor_type))
        if fmt is None or len(t.shape) != 2 or t.name.startswith("token_embd"):
            continue
        k, n = int(t.shape[0]), int(t.shape[1])
        data = np.array(t.data).reshape(n, fmt.row_bytes(k))  # a copy: writable, in RAM
        out.append((torch.from_numpy(data), fmt, k))
    return out


def llama_bench_seconds(binary: str, path: Path, threads: int, tokens: int) -> float:
    """llama.cpp's seconds per generated token: one thread, its CPU time (user + sys of
    ``llama-bench -p 0 -n 16 + tokens`` minus ``-n 16``, so load, warm-up and start-up cancel
    out, as hybridkv's one-thread passes count CPU time); more, the best wall-clock sample of
    ``-n tokens -r 5``."""
    base = [binary, "-m", str(path), "-p", "0", "-t", str(threads)]
    if threads > 1:
        cmd = [*base, "-n", str(tokens), "-r", "5", "-o", "json"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return 1.0 / max(json.loads(done.stdout)[0]["samples_ts"])
    cpu = []
    for n in (16, 16 + tokens):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([*base, "-n", str(n), "-r", "1"], capture_output=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return (cpu[1] - cpu[0]) / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", type=Path)
    parser.add_argument("--make-random", type=Path, help="write this random Q4_K file first")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--llama-bench", help="llama-bench binary: its tg on the same file")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="1 thread, 1 repeat, 64 MiB evict")
    args = parser.parse_args()
    if args.quick:
        args.threads, args.repeats = [1], 1
    path = args.make_random or args.gguf
    if path is None:
        raise SystemExit("a GGUF file or --make-random FILE")
    if args.make_random and not path.exists():
        make_random_gguf(path)
    weights = projections(path)
    step_bytes = sum(w.numel() for w, _, _ in weights)
    by_k = {id(w): (fmt, k) for w, fmt, k in weights}
    evict = torch.ones((64 if args.quick else 512) * (1 << 20) // 4)
    results = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        clock = time.thread_time if threads == 1 else time.perf_counter

        def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            fmt, k = by_k[id(w)]
            return quant_linear(x, w, fmt)

        tensors, ks = [w for w, _, _ in weights], [k for _, _, k in weights]
        secs, paired = step_seconds(run, tensors, ks, 1, args.repeats, clock, evict)
        row = {"threads": threads, "step_ms": secs * 1e3, "x_paired_floor": paired}
        if args.llama_bench:
            token = llama_bench_seconds(args.llama_bench, path, threads, args.tokens)
            floor = step_bytes / read_bandwidth(threads, args.repeats, 512)
            row |= {"llama_token_ms": token * 1e3, "llama_x_floor": token / floor,
                    "llama_floor_ms": floor * 1e3}  # fmt: skip
        results.append(row)
    report = {
        "benchmark": "quant_gguf_decode", "file": str(path), "weight_mb": step_bytes / 1e6,
        "formats": sorted({fmt.name for _, fmt, _ in weights}), "results": results,
        "machine": machine_info(load_average=os.getloadavg(), cpu_flags=cpu_flags()),
    }  # fmt: skip
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
