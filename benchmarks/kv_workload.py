"""Shared, deterministic workload for the KV-cache-manager micro-benchmarks.

Pure standard library, so that it can be imported both by hybridkv's own benchmark (project
venv) and by ``benchmarks/vllm_kv_baseline.py`` (run with the separate vLLM venv). Both
engines must be fed exactly what this module defines, so that their timings can be reported
as a ratio measured in the same benchmark run.

Workload
--------
``make_requests(n)`` returns ``n`` prompts of ``prompt_len`` (2000) token ids each. Request
``i`` is ``prefix[i % num_prefixes] + tail_i``:

* ``num_prefixes`` (10) shared prefixes of ``prefix_len`` (1024) tokens. Prefix ``k`` is drawn
  from ``random.Random(f"hybridkv-prefix:{seed}:{k}")`` (a str seed is hashed with SHA-512 by
  ``random``, so it does not depend on ``PYTHONHASHSEED``).
* a private tail of ``prompt_len - prefix_len`` (976) tokens drawn from
  ``random.Random(seed * 1_000_003 + i)``.
* every token is ``rng.randrange(vocab)`` with ``vocab`` = 32000.

Operations measured per request, in this order (one request at a time, no concurrency):

(a) hit search: longest prefix-cache hit for the prompt (vLLM: ``get_computed_blocks``; the
    request's block hashes are computed when the request object is built, and that hashing is
    timed separately);
(b) allocate the whole prompt in ONE call (vLLM: ``allocate_slots(request, P - hit, hit,
    hit_blocks)``), which also registers the prompt's full blocks in the prefix cache, then
(c) free the request (vLLM: ``free``). Freed cached blocks stay in the prefix cache as
    evictable blocks (LRU), so later requests hit on the shared prefixes.

Pool size (the same memory for both engines, expressed in tokens of KV): ``POOL_TOKENS`` =
8 concurrent requests x 4 x ``prompt_len`` = 64,000 tokens, converted to bytes by
``pool_bytes(layout)``:

* every attention layer (full AND sliding window, i.e. sized as if the window were not
  exploited) gets ``POOL_TOKENS`` tokens of K+V: ``2 * kv_heads * head_size * dtype_bytes``
  bytes per token per layer;
* every recurrent-state layer gets ``POOL_STATE_SLOTS`` (= 8 x 4 = 32) copies of its state
  (conv + recurrent tensors).

Each engine turns those bytes into blocks its own way (vLLM: ``get_kv_cache_configs`` with
``available_memory = pool_bytes``). The 10 shared prefixes alone need 10,240 tokens and each
request brings 976 private tokens, so the pool fills after a few dozen requests and eviction
happens for the rest of the run.

Layouts (``LAYOUTS``)
---------------------
* ``"gemma3"``: 36 layers, 30 sliding-window (window 1024) + 6 full attention, full at every
  6th layer (layer index i is full iff (i + 1) % 6 == 0); 8 KV heads, head size 128, bfloat16;
  block size 16.
* ``"qwen35"``: 48 layers, 36 Gated-DeltaNet state layers + 12 full attention, full at every
  4th layer ((i + 1) % 4 == 0); full attention 2 KV heads x head size 256 bfloat16; GDN state
  = conv (8192, 3) bfloat16 + recurrent (32, 128, 128) float32; block size 16 (vLLM forces a
  much larger block size for its Mamba-style layout; the baseline reports what it used).
"""

from __future__ import annotations

import random
import statistics

PROMPT_LEN = 2000
NUM_PREFIXES = 10
PREFIX_LEN = 1024
VOCAB = 32000
SEED = 0

#: 8 concurrent requests' worth of prompts, times 4.
POOL_CONCURRENCY = 8
POOL_FACTOR = 4
POOL_TOKENS = POOL_CONCURRENCY * POOL_FACTOR * PROMPT_LEN  # 64,000 tokens
POOL_STATE_SLOTS = POOL_CONCURRENCY * POOL_FACTOR  # 32 states per state layer

# Scheduler control-plane workload (B2; benchmarks/vllm_sched_baseline.py): SCHED_NUM_RUNNING
# requests with SCHED_PROMPT_LEN-token private prompts (make_requests(SCHED_NUM_RUNNING,
# SCHED_PROMPT_LEN, num_prefixes=0, prefix_len=0)) are admitted and prefilled (untimed), then
# every request decodes one token per step; a step = schedule() + update_from_output() with a
# fake model output (one sampled token per request, no model). Pool:
# pool_bytes(layout, SCHED_POOL_TOKENS, SCHED_STATE_SLOTS): room for every request's whole
# sequence 4 times over, and 4 states per request per state layer.
SCHED_NUM_RUNNING = 256
SCHED_PROMPT_LEN = 512
SCHED_MAX_TOKENS = 2048
SCHED_WARMUP_STEPS = 20
SCHED_STEPS_PER_RUN = 100
SCHED_POOL_TOKENS = 4 * SCHED_NUM_RUNNING * (SCHED_PROMPT_LEN + SCHED_MAX_TOKENS)
SCHED_STATE_SLOTS = 4 * SCHED_NUM_RUNNING

DEFAULT_NUM_REQUESTS = 10_000
QUICK_NUM_REQUESTS = 200

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

#: The operations timed per request, in order.
OPERATIONS = (
    "hash: block hashes of the prompt, computed when the request object is built",
    "hit_search: longest prefix-cache hit (vLLM get_computed_blocks)",
    "alloc_cache_free: allocate the whole prompt in one call + cache its full blocks "
    "(vLLM allocate_slots) + free the request (vLLM free)",
)


def _pattern(num_layers: int, every: int) -> list[str]:
    """'full' at every ``every``-th layer (1-based), 'other' elsewhere."""
    return ["full" if (i + 1) % every == 0 else "other" for i in range(num_layers)]


LAYOUTS: dict[str, dict] = {
    "gemma3": {
        "block_size": 16,
        "layer_kinds": [
            "full_attention" if k == "full" else "sliding_window" for k in _pattern(36, 6)
        ],
        "full_attention": {"num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"},
        "sliding_window": {
            "num_kv_heads": 8,
            "head_size": 128,
            "dtype": "bfloat16",
            "window": 1024,
        },
    },
    "qwen35": {
        "block_size": 16,
        "layer_kinds": ["full_attention" if k == "full" else "gdn" for k in _pattern(48, 4)],
        "full_attention": {"num_kv_heads": 2, "head_size": 256, "dtype": "bfloat16"},
        "gdn": {
            # conv state (conv_dim, kernel - 1); conv_dim = 2*16*128 + 32*128 = 8192
            "conv_shape": (8192, 3),
            "conv_dtype": "bfloat16",
            # recurrent state (num_v_heads, head_v_dim, head_k_dim)
            "recurrent_shape": (32, 128, 128),
            "recurrent_dtype": "float32",
            # the GDN geometry that produces those shapes (Qwen3-Next style)
            "num_k_heads": 16,
            "head_k_dim": 128,
            "num_v_heads": 32,
            "head_v_dim": 128,
            "conv_kernel": 4,
        },
    },
}


def layer_counts(layout: str) -> dict[str, int]:
    kinds = LAYOUTS[layout]["layer_kinds"]
    return {k: kinds.count(k) for k in sorted(set(kinds))}


def attn_kv_bytes_per_token(spec: dict) -> int:
    """K+V bytes of one token in one attention layer."""
    return 2 * spec["num_kv_heads"] * spec["head_size"] * DTYPE_BYTES[spec["dtype"]]


def gdn_state_bytes(spec: dict) -> int:
    """Bytes of one request's GDN state (conv + recurrent) in one layer."""
    conv = spec["conv_shape"][0] * spec["conv_shape"][1] * DTYPE_BYTES[spec["conv_dtype"]]
    r = spec["recurrent_shape"]
    rec = r[0] * r[1] * r[2] * DTYPE_BYTES[spec["recurrent_dtype"]]
    return conv + rec


def pool_bytes(
    layout: str, pool_tokens: int = POOL_TOKENS, state_slots: int = POOL_STATE_SLOTS
) -> int:
    """Memory given to each engine's KV pool for ``layout`` (see the module docstring)."""
    cfg = LAYOUTS[layout]
    total = 0
    for kind in cfg["layer_kinds"]:
        if kind in ("full_attention", "sliding_window"):
            total += pool_tokens * attn_kv_bytes_per_token(cfg[kind])
        elif kind == "gdn":
            total += state_slots * gdn_state_bytes(cfg["gdn"])
        else:  # pragma: no cover - layouts above only use these kinds
            raise ValueError(kind)
    return total


def make_prefixes(
    num_prefixes: int = NUM_PREFIXES,
    prefix_len: int = PREFIX_LEN,
    vocab: int = VOCAB,
    seed: int = SEED,
) -> list[list[int]]:
    out = []
    for k in range(num_prefixes):
        rng = random.Random(f"hybridkv-prefix:{seed}:{k}")
        out.append([rng.randrange(vocab) for _ in range(prefix_len)])
    return out


def make_requests(
    n: int,
    prompt_len: int = PROMPT_LEN,
    num_prefixes: int = NUM_PREFIXES,
    prefix_len: int = PREFIX_LEN,
    vocab: int = VOCAB,
    seed: int = SEED,
) -> list[list[int]]:
    """``n`` prompts: request i = shared prefix[i % num_prefixes] + its own random tail."""
    if not 0 <= prefix_len <= prompt_len:
        raise ValueError("need 0 <= prefix_len <= prompt_len")
    prefixes = make_prefixes(num_prefixes, prefix_len, vocab, seed)
    tail_len = prompt_len - prefix_len
    reqs = []
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        tail = [rng.randrange(vocab) for _ in range(tail_len)]
        reqs.append(prefixes[i % num_prefixes] + tail if num_prefixes else tail)
    return reqs


def ideal_hit_tokens(n: int, block_size: int, num_prefixes: int = NUM_PREFIXES) -> int:
    """Upper bound on hit tokens: every request after the first of its prefix reuses the
    block-aligned part of its prefix (assumes nothing useful is evicted)."""
    per_hit = (PREFIX_LEN // block_size) * block_size
    return max(0, n - num_prefixes) * per_hit


def us_per_request(runs: list[dict[str, float]], n: int) -> dict[str, dict[str, float]]:
    """Median, min and max microseconds per request of each measured operation over ``runs``
    (each run: total seconds under "hit", "alloc", "hash", and optionally "build")."""

    def stats(values_s: list[float]) -> dict[str, float]:
        us = [v / n * 1e6 for v in values_s]
        return {
            "median": round(statistics.median(us), 3),
            "min": round(min(us), 3),
            "max": round(max(us), 3),
        }

    out = {
        "hit_search": stats([r["hit"] for r in runs]),
        "alloc_cache_free": stats([r["alloc"] for r in runs]),
        "hit_search_plus_alloc_cache_free": stats([r["hit"] + r["alloc"] for r in runs]),
        "hash": stats([r["hash"] for r in runs]),
    }
    if all("build" in r for r in runs):
        out["request_build_excl_hash"] = stats([r["build"] for r in runs])
    return out
