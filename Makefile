# tensor-server developer commands. A fresh clone needs only `make run` or `make test`:
# both create .venv first when it is missing (or when pyproject.toml changed).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# luxar's encoder/decoder are the reference the encoded-zarr tests and bench compare against.
# It declares Python >= 3.12 and a large tree; its encoding modules need only the `test`
# extra's arbol/hilbertcurve/numcodecs (+ xxhash, a runtime dep), so it is installed alone.
LUXAR := luxar==2026.10.22
# ROOT: what `make run` serves; empty = a small generated demo dataset.
ROOT ?=
PYTEST_ARGS ?=
# perf-gate: compare this commit against the merge base (or HEAD~1) on a quick subset.
PERF_BASE ?= $(shell git merge-base HEAD origin/main 2>/dev/null || echo HEAD~1)
# only time_/timeraw_ benchmarks: asv reads any increase as a slowdown, so a higher-is-better
# track_ metric (GB/s) must not be gated
PERF_BENCH ?= ^(kernels|read_path)\..*\.time_|^imports\.timeraw_
SHELL := /bin/bash

.PHONY: setup run test test-nojit browser bench bench-kernels bench-small asv perf-gate clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	# the Tensor Browser's Qt-free data layer, for tests/flight/sdk_tensor_browser_test.py;
	# --no-deps: its other requirements are the Qt widget's (qtpy, magicgui, opencv)
	$(PY) -m pip install --quiet --no-deps 'biopb-napari-widget>=0.2.1'
	$(PY) -m pip install --quiet --no-deps --ignore-requires-python '$(LUXAR)'
	touch $(STAMP)

# the demo dataset, chunk cache and annotations of `make run` live in .tensor-server/ here,
# so `make clean` removes them
run: $(STAMP)
	TENSOR_SERVER_HOME=$(CURDIR)/.tensor-server $(PY) -m tensor_server run $(ROOT)

# The whole suite, then the kernel tests once more on the pure-Python path so the
# oracle-equivalent interpreter path of every kernel stays correct (NUMBA_DISABLE_JIT=1).
# pytest exits 5 when it collected no tests; that is non-zero, so make fails on it.
test: $(STAMP) browser
	$(PY) -m pytest -q $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-nojit

# The neuroglancer test (tests/http) drives Debian's Chromium; install it where apt can (CI
# runs as root). Where it cannot, that one test skips and says why.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 || \
	    echo "note: chromium could not be installed; the neuroglancer test will skip"; }

test-nojit: $(STAMP)
	NUMBA_DISABLE_JIT=1 $(PY) -m pytest -q tests/kernels/downsample_test.py tests/kernels/decode_test.py

bench: bench-kernels

bench-kernels: $(STAMP)
	$(PY) -m tensor_server.bench kernels

bench-small: $(STAMP)
	$(PY) -m tensor_server.bench plane-latency --size small --json .asv/plane-latency.json
	$(PY) -m tensor_server.bench peers --size small --json .asv/peers.json

asv: $(STAMP)
	mkdir -p .asv
	cd asv_bench && ../$(PY) -m asv machine --yes > /dev/null
	cd asv_bench && ../$(PY) -m asv run --python=same --quick --show-stderr

# Fails on "PERFORMANCE DECREASED" (factor 1.5), on benchmark errors and on tracebacks.
# pipefail keeps asv's own exit code visible through tee. Builds two environments, so it
# takes longer than CI's test budget allows: CI would call it as a separate job
# (`make perf-gate PERF_BASE=<base sha>`), not from .ci/run.
perf-gate: $(STAMP)
	mkdir -p .asv
	cd asv_bench && ../$(PY) -m asv machine --yes > /dev/null
	set -o pipefail; cd asv_bench && ../$(PY) -m asv continuous --factor 1.5 --split --show-stderr \
		--bench '$(PERF_BENCH)' $(PERF_BASE) HEAD 2>&1 | tee ../.asv/perf-gate.log
	! grep -qE "PERFORMANCE DECREASED|Traceback|failed" .asv/perf-gate.log

clean:
	rm -rf $(VENV) .asv build *.egg-info .pytest_cache .tensor-server
	@echo "servers started outside make keep their files in ~/.cache/tensor-server (demo data, chunk"
	@echo "caches, bench data) and ~/.local/share/tensor-server (annotations); remove those by hand"
