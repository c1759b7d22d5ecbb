"""The test tiers (``tests/conftest.py``): which folder gets which marker, and which folders
an ``-m`` expression lets pytest skip without importing them."""

from __future__ import annotations

import pytest

from tests.conftest import TESTS, can_select, folder_tier

FAST = "not slow and not model and not e2e and not bench"  # make test-fast


@pytest.mark.parametrize(
    ("folder", "tier"),
    [("benchmarks", "bench"), ("model", "model"), ("engine", "model"), ("cli", "e2e"),
     ("e2e_pd", "e2e"), ("e2e_offload/helpers.py", "e2e"), ("kv", None), ("server", None),
     ("connectors/nixl", None), ("conftest.py", None), ("", None)],
)  # fmt: skip
def test_folders_have_their_tier(folder: str, tier: str | None) -> None:
    assert folder_tier(TESTS / folder) == tier


@pytest.mark.parametrize(
    ("markexpr", "tier", "selectable"),
    [
        (FAST, "model", False),
        (FAST, "e2e", False),
        (FAST, "bench", False),
        ("not (model or e2e)", "e2e", False),
        ("slow", "model", True),  # a hand-marked slow test in tests/model
        ("model and not slow", "model", True),
        ("e2e or bench", "model", True),  # a test there may be marked e2e by hand
        ("foo-bar and model", "model", True),  # names pytest allows but Python does not
        ("timeout(30)", "model", True),  # marker arguments: never skipped unseen
    ],
)
def test_a_folder_is_skipped_only_when_no_test_in_it_can_be_selected(
    markexpr: str, tier: str, selectable: bool
) -> None:
    assert can_select(markexpr, tier) is selectable
