# One-command entry points. Each creates .venv when missing and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-slow test-cuda demo docs bench lint clean venv FORCE

$(PY):
	$(PYTHON) -m venv $(VENV)

# CPU torch first (a pinned wheel; never a CUDA build), then the package with its extras, every resolve
# constrained to that torch (lightning, torchmetrics & co. must never replace it by a CUDA build).
CONSTRAINTS := $(VENV)/constraints.txt
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

$(STAMP): pyproject.toml Makefile $(PKG_LIST) | $(PY)
	$(PY) -m pip install -q --upgrade pip
	echo "$(TORCH)" > $(CONSTRAINTS)
	$(PIP) "$(TORCH)"
	$(PIP) -e ".[test,docs]" $(EDITABLE)
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests torchmetrics_diff

# the property-based soak run (large hypothesis budgets; about 15 minutes here)
test-slow: $(STAMP)
	HYPOTHESIS_PROFILE=slow $(PY) -m pytest -q -m slow tests/unittests/property

# the GPU check (benchmarks/device_check.sh, under 8 minutes): the tests marked `cuda`, the host-round-trip counter
# and the loss benchmark against open_clip on the GPU. It needs the venv's torch built with CUDA (TORCH= a CUDA
# wheel where the default is not one); without a CUDA device it prints one line and exits 0.
test-cuda: $(STAMP)
	@if $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then \
		$(PIP) --no-deps open_clip_torch; fi
	@PY=$(PY) bash benchmarks/device_check.sh

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

# mypy's settings are in pyproject.toml ([tool.mypy]; the package must have no error)
lint: $(STAMP)
	$(PIP) ruff mypy
	$(PY) -m ruff check torchmetrics_diff tests benchmarks examples
	$(PY) -m mypy torchmetrics_diff

# (build/ holds the editable install's links: the stamp goes with it, so the next target reinstalls)
clean:
	rm -rf docs/_build .pytest_cache build *.egg-info $(STAMP)

FORCE:
