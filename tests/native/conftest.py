"""Every kernel test that takes ``isa`` runs once per instruction-set variant
(``hybridkv.native.isa``) this CPU can execute, so an AVX-512 machine also checks the AVX2 and
scalar paths; the variants it cannot run are skipped with the flags they need."""

from __future__ import annotations

import pytest

from hybridkv.native import PageCopy, load_pagecopy
from hybridkv.native.isa import VARIANTS, missing_flags
from hybridkv.native.runner import ProgramRunner, load_runner
from tests.native.no_compiler import built_or_skip


@pytest.fixture(scope="module", params=list(VARIANTS))
def isa(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    missing = missing_flags(VARIANTS[name])
    if missing:
        pytest.skip(f"this CPU cannot run the {name} build (it lacks {', '.join(missing)})")
    return name


@pytest.fixture(scope="module")
def native(isa: str) -> PageCopy:
    """The page-copy kernels of variant ``isa`` (overrides the suite-wide ``native``)."""
    return built_or_skip(load_pagecopy(isa))


@pytest.fixture(scope="module")
def runner(isa: str) -> ProgramRunner:
    """The decode program runner of variant ``isa`` (``test_runner*.py``)."""
    return built_or_skip(load_runner(isa))
