# One-command entry points. Each creates .venv when missing and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# torch, pinned: the CPU build by default (docs/install.rst). The `+cpu` label matches only PyTorch's CPU wheels,
# so no index can hand over a CUDA build for it; macOS wheels carry no label (they are CPU builds already).
# TORCH_INDEX is the index the torch install reads instead of PyPI (pip's --index-url): PyTorch's
# CPU index by default, unless pip's configuration already names its own package sources (index-url,
# extra-index-url or find-links in a pip.conf or a PIP_* variable: a mirror, a local wheelhouse), which then choose
# alone. `TORCH_INDEX=` (empty) never adds one. For a CUDA build: `TORCH=torch==2.13.0+cuXYZ
# TORCH_INDEX=https://download.pytorch.org/whl/cuXYZ` with a CUDA version PyTorch publishes for that release.
ifeq ($(shell uname -s),Darwin)
TORCH ?= torch==2.13.0
else
TORCH ?= torch==2.13.0+cpu
endif
PIP_SOURCES = $(shell $(PYTHON) -m pip config list 2>/dev/null | grep -E '[.](index-url|extra-index-url|find-links)=')
TORCH_INDEX ?= $(if $(PIP_SOURCES),,https://download.pytorch.org/whl/cpu)

.PHONY: test test-fast test-slow test-cuda test-torchmetrics-oldest demo docs bench lint clean venv FORCE

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first (the pinned wheel), then the package with its extras, every resolve constrained to that torch
# (lightning, torchmetrics & co. must never replace it by another build). A change of TORCH or TORCH_INDEX
# rewrites $(TORCH_SPEC), which reinstalls.
CONSTRAINTS := $(VENV)/constraints.txt
TORCH_SPEC  := $(VENV)/.torch
PIP := $(PY) -m pip install -q -c $(CONSTRAINTS)

# The package goes in as a *strict* editable install: a tree of links to the sources under build/ that type checkers
# follow (the default editable mode is an import hook that mypy and pyright cannot see, so users' scripts would
# find no types; setuptools' `compat` mode works too but is deprecated and puts the whole checkout on sys.path).
# Edits to existing files show at once; a module added or removed needs a reinstall, so the stamp depends on the
# list of the package's files ($(PKG_LIST), rewritten only when that list changes).
EDITABLE := --config-settings editable_mode=strict
PKG_LIST := $(VENV)/.package_files
PACKAGE_FILES := $(sort $(shell find torchmetrics_diff -name '*.py' -o -name py.typed))

$(PKG_LIST): FORCE | $(PY)
	@echo "$(PACKAGE_FILES)" | cmp -s - $@ || echo "$(PACKAGE_FILES)" > $@

$(TORCH_SPEC): FORCE | $(PY)
	@echo "$(TORCH) $(TORCH_INDEX)" | cmp -s - $@ || echo "$(TORCH) $(TORCH_INDEX)" > $@

$(STAMP): pyproject.toml Makefile $(PKG_LIST) $(TORCH_SPEC) | $(PY)
	$(PY) -m pip install -q --upgrade pip
	echo "$(TORCH)" > $(CONSTRAINTS)
	$(PIP) "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) -e ".[test,docs]" $(EDITABLE)
	touch $(STAMP)

venv: $(STAMP)

# two pytest workers: every test that starts processes (marked `distributed` by tests/conftest.py) runs on one of
# them, one at a time as before; the in-process tests (unit tests, doctests, torch.compile) a module at a time on
# the other core (stock pytest-xdist groups, set by tests/conftest.py)
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow" tests torchmetrics_diff

# the developer's tier (under a minute): single-process unit tests and the package's doctests. The markers
# `distributed` (spawns processes) and `compile` (torch.compile) are set by tests/conftest.py from what each test
# calls; `soak` is declared by tests/unittests/test_soak.py.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not distributed and not compile and not soak" tests torchmetrics_diff

# the property-based soak run (large hypothesis budgets; about 15 minutes here)
test-slow: $(STAMP)
	HYPOTHESIS_PROFILE=slow $(PY) -m pytest -q -m slow tests/unittests/property

# the GPU check (benchmarks/device_check.sh, under 8 minutes): the tests marked `cuda`, the host-round-trip counter
# and the loss benchmark against open_clip on the GPU. It needs the venv's torch built with CUDA (TORCH= and
# TORCH_INDEX= of a CUDA wheel, see above); without a CUDA device it prints one line and exits 0.
test-cuda: $(STAMP)
	@if $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then \
		$(PIP) --no-deps open_clip_torch; fi
	@PY=$(PY) bash benchmarks/device_check.sh

# the adapter's tests (tests/unittests/adapter) against the oldest torchmetrics it supports, installed without its
# dependencies into a folder of its own that shadows the venv's torchmetrics for this run only
TM_OLDEST ?= 1.3.2
test-torchmetrics-oldest: $(STAMP)
	$(PIP) --no-deps --upgrade --target $(VENV)/torchmetrics-$(TM_OLDEST) "torchmetrics==$(TM_OLDEST)"
	PYTHONPATH=$(VENV)/torchmetrics-$(TM_OLDEST) $(PY) -m pytest -q tests/unittests/adapter

demo: $(STAMP)
	$(VENV)/bin/torchrun --standalone --nproc-per-node=2 examples/train_clip_ddp.py $(ARGS)

docs: $(STAMP)
	$(PY) -m sphinx -W -n --keep-going -b html docs docs/_build/html

# open_clip_torch without its dependencies: it requires torchvision, which cannot be imported beside the pinned CPU
# torch (and breaks `import torchmetrics`); bench_anchors loads only its loss module, which needs torch alone.
bench: $(STAMP)
	$(PIP) -e ".[bench]" $(EDITABLE)
	$(PIP) --no-deps open_clip_torch
	$(PY) benchmarks/run_all.py

# ruff's and mypy's settings are in pyproject.toml ([tool.ruff], [tool.mypy]; the package must have no mypy error).
# The `lint` extra brings ruff and mypy, so a fresh machine needs nothing else.
LINT_PATHS := torchmetrics_diff tests benchmarks examples
lint: $(STAMP)
	$(PIP) -e ".[lint]" $(EDITABLE)
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)
	$(PY) -m mypy torchmetrics_diff

# (build/ holds the editable install's links: the stamp goes with it, so the next target reinstalls)
clean:
	rm -rf docs/_build .pytest_cache build *.egg-info $(STAMP)

FORCE:
