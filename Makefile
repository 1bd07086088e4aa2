# Two entry points, each safe on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trainwise-installed
# torchao beside the virtualenv, on the path only for the float8 tests' pass of `make test`:
# installed in it, transformers would import it in every process (tests/float8_package.py).
TORCHAO := $(VENV)/torchao
TORCHAO_STAMP := $(TORCHAO)/.installed

.PHONY: setup demo test test-fast clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Keep a torch that is already installed; otherwise take the pinned CPU-capable release
# (an open range could pull a multi-GB CUDA build).
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

$(TORCHAO_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps --target $(TORCHAO) "torchao>=0.12,<0.19"
	touch $(TORCHAO_STAMP)

# The default ladder for this machine: bert-large-uncased on a GPU, the quick CPU ladder otherwise.
demo: setup
	$(VENV)/bin/trainwise bench --out bench-results

# Then the float8 estimate's tests, which need torchao: there a missing torchao fails them.
# That pass collects only the files that mark a float8 test (collecting all 110 files costs
# ~15 s on 2 cores to select a handful).
FLOAT8_FILES = $(shell grep -l "mark.float8" tests/test_*.py)
# Two workers, each test file whole on one (its module fixtures run once): much of the suite
# is single-threaded Python (tracing on fake tensors, process start-up), which leaves a
# core idle; the distributed tests' ranks share the cores either way.
test: setup $(TORCHAO_STAMP)
	$(PY) -m pytest -n 2 --dist loadfile
	TRAINWISE_FLOAT8_PASS=1 PYTHONPATH=$(TORCHAO) $(PY) -m pytest -m float8 -p no:cacheprovider $(FLOAT8_FILES)

# Local iteration: leaves out the tests marked slow (over ~10 s) or distributed (torchrun/gloo).
test-fast: setup
	$(PY) -m pytest -m "not slow and not distributed"

clean:
	rm -rf $(VENV) *.egg-info
