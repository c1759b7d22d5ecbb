"""Grouping of layer specs into a layout; page/slot bytes; placement; fingerprint."""

from __future__ import annotations

import pytest

from hybridkv.kv.spec import (
    FullAttentionSpec,
    LayerSpec,
    SlidingWindowSpec,
    SpecKind,
    StateSpec,
    create_layout,
)
from tests.kv.builders import full, make_layout, mamba, swa

F, S, ST = SpecKind.FULL, SpecKind.SLIDING, SpecKind.STATE


def groups(name: str) -> list[tuple[SpecKind, tuple[int, ...]]]:
    return [(g.kind, g.layer_ids) for g in make_layout(name).groups]


def test_all_full() -> None:
    lay = make_layout("full")
    assert groups("full") == [(F, (0, 1))]
    assert (lay.group_size, lay.layer_page_bytes, lay.page_bytes) == (2, 512, 1024)
    assert lay.attention_group_ids == (0,) and lay.state_group_ids == ()
    assert lay.padding_waste == 0.0


def test_all_sliding() -> None:
    assert groups("sliding") == [(S, (0, 1))]


def test_gemma3_like_5_to_1() -> None:
    # 12 layers: sliding x5 then full, twice -> G = 2 (the "1" of 5:1 has 2 layers)
    assert groups("gemma3") == [
        (F, (5, 11)),
        (S, (0, 1)),
        (S, (2, 3)),
        (S, (4, 6)),
        (S, (7, 8)),
        (S, (9, 10)),
    ]
    assert make_layout("gemma3").padding_waste == 0.0


def test_real_gemma3_geometry_36_layers() -> None:
    f = FullAttentionSpec(16, 8, 128, "bfloat16")
    s = SlidingWindowSpec(16, 8, 128, "bfloat16", 1024)
    specs: list[LayerSpec | None] = [f if (i + 1) % 6 == 0 else s for i in range(36)]
    lay = create_layout(specs)
    assert lay.group_size == 6
    assert [g.kind for g in lay.groups] == [F, S, S, S, S, S]
    assert lay.groups[0].layer_ids == (5, 11, 17, 23, 29, 35)
    assert lay.groups[1].layer_ids == (0, 1, 2, 3, 4, 6)
    assert lay.groups[5].layer_ids == (28, 30, 31, 32, 33, 34)
    assert lay.layer_page_bytes == 2 * 16 * 8 * 128 * 2 == 65536
    assert lay.page_bytes == 6 * 65536
    assert lay.block_size == 16


def test_gptoss_1_to_1() -> None:
    assert groups("gptoss") == [(F, (1, 3)), (S, (0, 2))]


def test_attention_plus_state_granite() -> None:
    lay = make_layout("granite")
    assert groups("granite") == [(F, (3, 7)), (ST, (0, 1, 2, 4, 5, 6))]
    assert lay.attention_group_ids == (0,) and lay.state_group_ids == (1,)
    # mamba slot per layer: 24*3*4 + 4*8*16*4 = 288 + 2048 = 2336; six layers
    assert lay.state_slot_bytes(1) == 6 * 2336 == 14016
    assert lay.total_state_slot_bytes() == 14016
    with pytest.raises(ValueError):
        lay.state_slot_bytes(0)


def test_state_to_attention_3_to_1_qwen35() -> None:
    lay = make_layout("qwen35")
    assert groups("qwen35") == [(F, (3, 7)), (ST, (0, 1, 2, 4, 5, 6))]
    # gdn slot per layer: 32*3*2 + 2*16*16*4 = 192 + 2048 = 2240
    assert lay.state_slot_bytes(1) == 6 * 2240 == 13440


def test_state_only() -> None:
    lay = make_layout("state_only")
    assert groups("state_only") == [(ST, (0, 1))]
    assert (lay.group_size, lay.page_bytes, lay.block_size) == (0, 0, 4)
    assert lay.attention_group_ids == ()
    assert lay.num_blocks_for(10 * 4672, 10) == 1
    assert lay.num_blocks_for(10 * 4672 - 1, 10) == 0


def test_two_distinct_state_specs_get_two_groups() -> None:
    other = StateSpec("short_conv", ((16, 3),), ("float32",))
    lay = create_layout([mamba(), full(), other, mamba()])
    assert [(g.kind, g.layer_ids) for g in lay.groups] == [(F, (1,)), (ST, (0, 3)), (ST, (2,))]
    assert lay.state_slot_bytes(2) == 16 * 3 * 4
    assert lay.total_state_slot_bytes() == 2 * 2336 + 192


def test_irregular_reports_padding_waste() -> None:
    lay = make_layout("irregular")
    # buckets 2 full, 3 sliding: 3 < 1.5 * 2 is false -> G = 2, the sliding bucket splits 2 + 1
    assert groups("irregular") == [(F, (0, 1)), (S, (2, 3)), (S, (4,))]
    # 5 layer pages used of 3 groups x 2 pages
    assert lay.padding_waste == pytest.approx(1 - 5 / 6)
    assert lay.padding_waste > 0


def test_group_size_prefers_largest_when_close() -> None:
    f, s = full(), swa(8)
    lay = create_layout([f, f, f, s, s, s, s])  # 4 < 1.5 * 3 -> G = 4
    assert [(g.kind, g.layer_ids) for g in lay.groups] == [(F, (0, 1, 2)), (S, (3, 4, 5, 6))]
    assert lay.padding_waste == pytest.approx(1 - 7 / 8)


def test_mixed_page_sizes_pad_to_the_largest() -> None:
    small = FullAttentionSpec(4, 1, 8, "float32")  # 2*4*1*8*4 = 256
    big = SlidingWindowSpec(4, 2, 8, "float32", 8)  # 512
    lay = create_layout([small, big])
    assert lay.layer_page_bytes == 512 and lay.page_bytes == 512
    assert lay.padding_waste == pytest.approx(1 - (256 + 512) / 1024)


def test_block_sizes_must_agree() -> None:
    with pytest.raises(ValueError, match="block size"):
        create_layout([full(4), full(8)])


def test_num_blocks_for() -> None:
    lay = make_layout("granite")  # page 1024, slot 14016
    assert lay.num_blocks_for(100_000, 2) == (100_000 - 2 * 14016) // 1024 == 70
    assert lay.num_blocks_for(10 * 1024, 0) == 10
    assert lay.num_blocks_for(1000, 1) == 0
    assert make_layout("full").num_blocks_for(10 * 1024 + 1023, 5) == 10


def test_layer_placement() -> None:
    lay = make_layout("gemma3")
    assert lay.layer_placement(5) == (0, 0)
    assert lay.layer_placement(11) == (0, 1)
    assert lay.layer_placement(6) == (3, 1)
    assert lay.layer_placement(10) == (5, 1)
    g = make_layout("granite")
    assert g.layer_placement(4) == (1, 3)
    assert g.layer_placement(7) == (0, 1)
    with_mlp = create_layout([full(), None, mamba()])
    assert with_mlp.layer_placement(1) is None
    assert with_mlp.num_layers == 3


def test_fingerprint_stability() -> None:
    a, b = make_layout("qwen35"), make_layout("qwen35")
    assert a.fingerprint("m") == b.fingerprint("m") == "7d0e1d9365583bfd9e7faa728c94e0b6"
    assert make_layout("gemma3").fingerprint("m") == "04ebd8c82c0aeacb428b06a5fb2e6e63"
    assert a.fingerprint("other") != a.fingerprint("m")
    assert make_layout("qwen35", block_size=8).fingerprint("m") != a.fingerprint("m")
    assert make_layout("gemma3", window=16).fingerprint("m") != make_layout("gemma3").fingerprint(
        "m"
    )
    bf16 = create_layout([FullAttentionSpec(4, 2, 8, "bfloat16")] * 2)
    assert bf16.fingerprint("m") != make_layout("full").fingerprint("m")


def test_bad_dtype() -> None:
    with pytest.raises(ValueError, match="unsupported KV dtype"):
        _ = FullAttentionSpec(4, 2, 8, "int3").page_bytes
    with pytest.raises(ValueError):
        StateSpec("mamba2", ((1,),), ())
