"""Shared builders for KV core tests: tiny specs, named layouts, a minimal request."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridkv.kv.block_pool import BlockPool
from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator
from hybridkv.kv.hashing import BlockHash, BlockHasher, get_hash_fn
from hybridkv.kv.spec import (
    FullAttentionSpec,
    KVCacheLayout,
    LayerSpec,
    SlidingWindowSpec,
    StateSpec,
    create_layout,
)

B = 4  # block size used by the exact-id tests


def full(block_size: int = B) -> FullAttentionSpec:
    return FullAttentionSpec(block_size, 2, 8, "float32")


def swa(window: int, block_size: int = B) -> SlidingWindowSpec:
    return SlidingWindowSpec(block_size, 2, 8, "float32", window)


def mamba() -> StateSpec:
    return StateSpec("mamba2", ((24, 3), (4, 8, 16)), ("float32", "float32"))


def gdn() -> StateSpec:
    return StateSpec("gated_deltanet", ((32, 3), (2, 16, 16)), ("bfloat16", "float32"))


def layer_specs(name: str, block_size: int = B, window: int = 8) -> list[LayerSpec | None]:
    """Named layer patterns: the layouts the tests and the benchmark care about."""
    f, s = full(block_size), swa(window, block_size)
    patterns: dict[str, list[LayerSpec | None]] = {
        "full": [f, f],
        "sliding": [s, s],
        "gemma3": ([s] * 5 + [f]) * 2,  # 5:1 -> 1 full + 5 sliding groups of 2
        "granite": [mamba(), mamba(), mamba(), f, mamba(), mamba(), mamba(), f],
        "qwen35": [gdn(), gdn(), gdn(), f] * 2,  # 3:1 state:attention
        "two_windows": [swa(window, block_size), swa(2 * window, block_size), f],
        "state_only": [mamba(), mamba()],
        "gptoss": [s, f] * 2,
        "irregular": [f, f, s, s, s],
    }
    return patterns[name]


def make_layout(name: str, block_size: int = B, window: int = 8) -> KVCacheLayout:
    return create_layout(layer_specs(name, block_size, window), block_size=block_size)


def make_coordinator(
    name: str,
    num_blocks: int = 32,
    num_state_slots: int = 8,
    block_size: int = B,
    window: int = 8,
    interval: int = 0,
    caching: bool = True,
    max_checkpoints: int | None = None,
    states_from_scan: bool = False,
) -> KVCacheCoordinator:
    layout = make_layout(name, block_size, window)
    config = KVCacheConfig(
        num_blocks,
        num_state_slots,
        caching,
        interval,
        max_checkpoints=max_checkpoints,
        states_from_scan=states_from_scan,
    )
    return KVCacheCoordinator(layout, config)


@dataclass
class FakeRequest:
    """The KVRequest protocol over a token list, hashed incrementally like the real one."""

    request_id: str
    token_ids: list[int]
    block_size: int = B
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    cache_salt: str | None = None
    block_hashes: list[BlockHash] = field(default_factory=list)
    cache_boundaries: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.num_prompt_tokens = self.num_prompt_tokens or len(self.token_ids)
        self.hasher = BlockHasher(self.block_size, get_hash_fn("sha256"), self.cache_salt)
        self.hasher.extend(self.block_hashes, self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def append(self, token: int) -> None:
        self.token_ids.append(token)
        self.hasher.extend(self.block_hashes, self.token_ids)


def run_step(coord: KVCacheCoordinator, req: FakeRequest, num_new: int, hit=None) -> bool:  # noqa: ANN001
    """Allocate, pretend the forward ran, cache: one scheduler step for one request."""
    if hit is None and not coord.has_request(req.request_id):
        hit = coord.find_cache_hit(req)
    if not coord.allocate(req, num_new, hit):
        return False
    start = req.num_computed_tokens + (hit.num_tokens if hit is not None else 0)
    req.num_computed_tokens = start + num_new
    coord.take_state_copies()
    coord.cache(req, req.num_computed_tokens)
    coord.end_step()
    return True


def prefill(coord: KVCacheCoordinator, req: FakeRequest, budget: int = 1 << 30) -> list[int]:
    """Compute ``req`` up to its last token in steps that end where checkpoints are due.

    Returns the step ends, so tests can check where chunks stopped."""
    ends = []
    while req.num_computed_tokens < req.num_tokens:
        hit = None if coord.has_request(req.request_id) else coord.find_cache_hit(req)
        start = req.num_computed_tokens + (hit.num_tokens if hit is not None else 0)
        end = coord.next_step_end(req, start, min(req.num_tokens, start + budget), hit)
        assert run_step(coord, req, end - start, hit), f"{req.request_id} did not fit"
        ends.append(end)
    return ends


def decode(coord: KVCacheCoordinator, req: FakeRequest, token: int) -> bool:
    """Append one sampled token and compute it (one decode step)."""
    req.append(token)
    return run_step(coord, req, req.num_tokens - req.num_computed_tokens)


def queue(pool: BlockPool) -> list[int]:
    """The free queue, front (allocated next) to back (evicted last)."""
    return list(pool.free_queue)


def granite_small_layout(block_size: int = 16) -> KVCacheLayout:
    """The small Granite 4.0-H checkpoint's cache layers (make_model --size small): 9 Mamba2
    layers (conv 1664 x 3, SSM 24 x 64 x 64, float32) and 3 full attention (4 x 64)."""
    mamba = StateSpec("mamba2", ((1664, 3), (24, 64, 64)), ("float32", "float32"))
    specs: list[LayerSpec | None] = [
        mamba,
        mamba,
        mamba,
        FullAttentionSpec(block_size, 4, 64, "float32"),
    ] * 3
    return create_layout(specs, block_size=block_size)
