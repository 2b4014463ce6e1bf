# streamrank: `make demo` runs the pipeline on the embedded stack, `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
TORCH_VERSION = 2.13.0

.PHONY: setup demo test test-slow test-quarantined test-cluster lint typecheck unit stack-up stack-down clean docs

setup: $(STAMP)

# Idempotent: re-runs only when pyproject.toml changes. torch is pinned first (a CPU build);
# an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "streamrank needs Python >= 3.11 (set PYTHON=python3.11)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install --quiet -e ".[test,tools,onnx]" "torch==$(TORCH_VERSION)"
	touch $(STAMP)

demo: setup
	$(BIN)/streamrank demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest -q tests/unit

# Test files run in parallel worker processes (pytest-xdist), each worker with an embedded stack
# of its own; a file stays on one worker (its tests share module fixtures and are ordered).
# Two: the CI host's cores.
TEST_WORKERS ?= 2
PARALLEL = -n $(TEST_WORKERS) --dist loadfile

# Every test on a single Redis, then the tests marked cluster (key placement, hash slots,
# scripts, pipelines, the cluster client) again on a local Redis Cluster (3 masters, 3
# replicas, started by the session fixture).
test: setup lint typecheck
	$(BIN)/pytest -q -m "not slow" $(PARALLEL)
	STREAMRANK_TEST_REDIS=cluster $(BIN)/pytest -q -m "cluster and not slow" $(PARALLEL) tests/integration

# Tests marked slow (minutes each: faults under load, hostile input, the short soak, the
# consumer-group scale test, the Redis Cluster failover and resharding tests, ...); CI runs
# them too (see docs/reliability.md). One at a time: most judge latency or degraded replies
# under load, which a test running beside them on a small host would skew.
test-slow: setup
	$(BIN)/pytest -q -m "slow and not quarantined"

# Tests whose failure is being investigated (each marker says what); not run by CI.
test-quarantined: setup
	$(BIN)/pytest -q -m quarantined || test $$? -eq 5  # 5: none quarantined now

# Every integration test, the slow ones too, on a local Redis Cluster (`make test` runs there
# only the tests marked cluster).
test-cluster: setup
	STREAMRANK_TEST_REDIS=cluster $(BIN)/pytest -q tests/integration

docs: setup
	$(BIN)/python -m workbench.cli.docs README.md

stack-up: setup
	$(BIN)/streamrank stack up

stack-down: setup
	$(BIN)/streamrank stack down

clean:
	-$(BIN)/streamrank stack down
	rm -rf .run .pytest_cache .mypy_cache .ruff_cache
