# One-command entry points. Each creates .venv when missing and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-slow test-cuda demo docs bench lint clean venv

$(PY):
	$(PYTHON) -m venv $(VENV)

# CPU torch first (a pinned wheel; never a CUDA build), then the package with its extras, every resolve
# constrained to that torch (lightning, torchmetrics & co. must never replace it by a CUDA build).
CONSTRAINTS := $(VENV)/constraints.txt
PIP := $(PY) -m pip install -q -c $(CONSTRAINTS)

$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -m pip install -q --upgrade pip
	echo "$(TORCH)" > $(CONSTRAINTS)
	$(PIP) "$(TORCH)"
	$(PIP) -e ".[test,docs]"
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
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

# open_clip_torch without its dependencies: it requires torchvision, which cannot be imported beside the pinned CPU
# torch (and breaks `import torchmetrics`); bench_anchors loads only its loss module, which needs torch alone.
bench: $(STAMP)
	$(PIP) -e ".[bench]"
	$(PIP) --no-deps open_clip_torch
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(PIP) ruff
	$(PY) -m ruff check torchmetrics_diff tests benchmarks examples

clean:
	rm -rf docs/_build .pytest_cache build *.egg-info
