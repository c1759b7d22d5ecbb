# make test: set up .venv if needed, then ruff, mypy and the whole pytest suite.
# make test-fast: the fast tier only (no model, end-to-end, benchmark or slow test; tests/conftest.py).
# make run:  set up if needed, then run the project's main job.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup test test-fast lint run bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build this machine holds; an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,eval]'
	touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# --durations: the slowest tests in every log, so a test that eats the budget shows.
# -n 2: two pytest workers (pytest-xdist); the suite waits on engines and subprocesses far more
# than it computes, so two workers on two cores halve its time (docs/status.md, issue 27).
# tests/conftest.py sets OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep, not spin, and
# schedules the workers (tests/support/scheduling.py): a module whose tests share a module-scoped
# server or fleet runs whole on one worker (built once), the longest units first.
# PYTHONDONTWRITEBYTECODE= (empty: off): where the environment turns bytecode caching off, each
# of the suite's ~175 Python processes (workers, `hybridkv serve`, benchmark scripts) compiled
# hybridkv again, and each worker re-rewrote every test module's asserts (~6 s of CPU a worker);
# the caches go to the git-ignored __pycache__ dirs (docs/benchmarks.md, "Test suite CPU").
# test-fast runs -n 2 too: 83 s vs 95 s in one process, quiet (issue 27).
test: lint
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n 2 --durations=20

test-fast: setup
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n 2 -m "not slow and not model and not e2e and not bench" --durations=10

# Serves the embedded default model at http://127.0.0.1:8000 with the CPU and disk offload
# tiers on (disk tier in ./kv-cache, kept across restarts), and prints a curl example.
OFFLOAD := {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"cpu_bytes": "1GiB", "disk_path": "./kv-cache", "disk_bytes": "4GiB", "chunk_tokens": 64}}
run: setup
	$(VENV)/bin/hybridkv serve --kv-transfer-config '$(OFFLOAD)'

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
