# tensor-server developer commands. A fresh clone needs only `make run` or `make test`:
# both create .venv first when it is missing (or when pyproject.toml changed).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# ROOT: what `make run` serves; empty = a small generated demo dataset.
ROOT ?=
PYTEST_ARGS ?=

.PHONY: setup run test test-nojit bench bench-kernels asv clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m tensor_server run $(ROOT)

# The whole suite, then the kernel tests once more on the pure-Python path so the
# oracle-equivalent interpreter path of every kernel stays correct (NUMBA_DISABLE_JIT=1).
# pytest exits 5 when it collected no tests; that is non-zero, so make fails on it.
test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-nojit

test-nojit: $(STAMP)
	NUMBA_DISABLE_JIT=1 $(PY) -m pytest -q tests/kernels/downsample_test.py

bench: bench-kernels

bench-kernels: $(STAMP)
	$(PY) -m tensor_server.bench kernels

asv: $(STAMP)
	cd asv_bench && ../$(PY) -m asv run --python=same --quick --show-stderr

clean:
	rm -rf $(VENV) .asv build *.egg-info .pytest_cache
