# resurge: `make demo` and `make test` work on a fresh machine with Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?=
TORCH_SPEC ?= torch>=2.4,<3

.PHONY: install demo test test-fast lint typecheck pytest pytest-fast bench schemas clean

# torch first, so the project's `train` extra finds it installed: the CPU build on a
# machine without an NVIDIA GPU (see scripts/install-torch). Then the project with every
# extra the tests and checks need, and the custom-detector example, whose end-to-end test
# expects it installed (tests never install packages themselves).
$(INSTALLED): pyproject.toml scripts/install-torch examples/custom-detector/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	TORCH_SPEC="$(TORCH_SPEC)" sh scripts/install-torch $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,lint,train,kubernetes,simulate,report]"
	$(BIN)/python -m pip install --quiet --no-deps -e examples/custom-detector
	touch $(INSTALLED)

install: $(INSTALLED)

demo: $(INSTALLED)
	$(BIN)/resurge demo

# Everything, as CI runs it.
test: lint typecheck pytest

# The edit loop: the same checks, and every test but the end-to-end ones (whole services
# as processes); `make test` before pushing.
test-fast: lint typecheck pytest-fast

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(INSTALLED)
	$(BIN)/mypy

# pytest exits 5 when it collects no test; make treats that as a failure too. The suite
# runs in two pytest-xdist workers that steal work from each other (the slowest
# end-to-end tests are collected first, see tests/conftest.py); PYTEST_WORKERS=0 runs
# it in one process.
PYTEST_WORKERS ?= 2

pytest: $(INSTALLED)
	$(BIN)/pytest -n $(PYTEST_WORKERS) $(if $(filter 0,$(PYTEST_WORKERS)),,--dist worksteal) $(PYTEST_ARGS)

pytest-fast: $(INSTALLED)
	$(BIN)/pytest -n 2 -m "not e2e" $(PYTEST_ARGS)

bench: $(INSTALLED)
	$(BIN)/python bench/restart_latency.py
	$(BIN)/python bench/forkserver.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/detector_throughput.py --rate 40000
	$(BIN)/python bench/scaler.py
	$(BIN)/python bench/resize_pause.py
	$(BIN)/python bench/chaos.py
	$(BIN)/python bench/kube_api.py

schemas: $(INSTALLED)
	$(BIN)/resurge schema --out docs/schemas --crd deploy/crds/trainingjobs.yaml
	$(BIN)/resurge schema | $(BIN)/python -m resurge.contract.reference events docs/events.md
	$(BIN)/resurge schema | $(BIN)/python -m resurge.contract.reference asyncapi docs/asyncapi.yaml

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
