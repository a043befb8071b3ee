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
# ROOT: what `make run` serves; empty = a small generated demo dataset. PORT / HTTP_PORT /
# METRICS_PORT: the Flight, OME-Zarr HTTP and Prometheus ports of `make run` (empty = 8815 /
# 8816 / 8817; 0 picks a free one).
ROOT ?=
PORT ?=
HTTP_PORT ?=
METRICS_PORT ?=
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (auto = one per core; 0 = in one process)
TEST_WORKERS ?= auto
# perf-gate (python -m tensor_server.bench gate): PERF_BASE is the commit HEAD is compared with
# (gate 1); PERF_BENCH an asv regex replacing the gated set (GATED_BENCHMARKS in
# tensor_server/bench/gate.py); PERF_FLOORS the gate-2 floors (all, none, or names);
# PERF_SKIP_COMMITS=1 runs gate 2 only; PERF_ASV_ARGS adds asv continuous arguments (e.g.
# "-a processes=1": one round per commit, quicker, noisier); PERF_CONFIRM_S the seconds of
# interleaved calls per confirmation pair (empty = 10). Exported, so a regex reaches the gate
# unmangled.
PERF_BASE ?= HEAD~1
PERF_BENCH ?=
PERF_FLOORS ?= all
PERF_SKIP_COMMITS ?=
PERF_ASV_ARGS ?=
PERF_CONFIRM_S ?=
export PERF_BASE PERF_BENCH PERF_FLOORS PERF_SKIP_COMMITS PERF_ASV_ARGS PERF_CONFIRM_S
# bench-record: the machine name its results are filed under in asv_bench/results/, and an
# optional asv --bench regex (default: the whole suite)
BENCH_MACHINE ?= $(shell hostname)
BENCH_RECORD ?=
export BENCH_RECORD
SHELL := /bin/bash

.PHONY: setup run url test lint test-load test-nojit browser nginx viewer-assets warm bench bench-kernels bench-small asv perf-gate bench-record bench-publish clean

setup: $(STAMP)

# Two installs. `make run` and `make url` need only the serving install (BASE_STAMP: the package
# and its dependencies, 84 packages, 1 GB); `make setup`, `make test` and the benches add the
# test and bench extras, the Tensor Browser's data layer and luxar (STAMP, 259 packages, 2.1 GB).
# pip prints one line per package it fetches (progress). pip installs without compiling bytecode
# (--no-compile) and tools/bytecode.py then compiles the environment on every core, counting:
# pip compiles in one process, about 90 s of a 151-174 s install with a warm pip cache, against
# 50 s for the parallel compile on 2 cores. The bytecode must exist: where PYTHONDONTWRITEBYTECODE
# is set (as on this project's machines) Python never writes it, and every process compiled what
# it imported (pytest 342 -> 406 s without it). A file that does not compile (luxar's Python
# 3.12-only tests) is left out, as pip leaves it. Sizes: docs/getting-started.md.
BASE_STAMP := $(VENV)/.installed-base
PURELIB = "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

$(BASE_STAMP): pyproject.toml
	@echo "setup 1/3: the virtual environment in $(VENV) ($(PYTHON) -m venv)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@echo "setup 2/3: tensor-server and what serving needs (84 packages, 1 GB: numpy, numba,"
	@echo "           zarr, pyarrow, duckdb, the format libraries, ...; a few minutes on a fresh machine)"
	@set -o pipefail; $(PY) -m pip install --no-compile --progress-bar off -e . | \
		{ grep --line-buffered -E '^(Collecting|Successfully)' || true; }
	@echo "setup 3/3: bytecode of the environment, on every core"
	@$(PY) tools/bytecode.py $(PURELIB)
	@touch $(BASE_STAMP)
	@echo "setup done: $(VENV) can serve (make test adds the test and bench extras)"

$(STAMP): $(BASE_STAMP)
	@echo "test setup 1/4: the test and bench extras (175 more packages, 1.1 GB more: napari, dask's"
	@echo "                distributed, moto, asv, tensorstore, selenium, ...; several minutes on a fresh machine)"
	@set -o pipefail; $(PY) -m pip install --no-compile --progress-bar off -e '.[test,bench]' | \
		{ grep --line-buffered -E '^(Collecting|Successfully)' || true; }
	@# the Tensor Browser's Qt-free data layer, for tests/flight/sdk_tensor_browser_test.py;
	@# --no-deps: its other requirements are the Qt widget's (qtpy, magicgui, opencv)
	@echo "test setup 2/4: biopb-napari-widget (the Tensor Browser's data layer, without Qt)"
	@$(PY) -m pip install --quiet --no-compile --no-deps 'biopb-napari-widget>=0.2.1'
	@echo "test setup 3/4: $(LUXAR) (the encoded-zarr reference codec, without its dependencies)"
	@$(PY) -m pip install --quiet --no-compile --no-deps --ignore-requires-python '$(LUXAR)'
	@echo "test setup 4/4: bytecode of the environment, on every core"
	@$(PY) tools/bytecode.py $(PURELIB)
	@touch $(STAMP)
	@echo "test setup done: $(VENV) is ready"

# the demo dataset, chunk cache and annotations of `make run` live in .tensor-server/ here,
# so `make clean` removes them
run: $(BASE_STAMP) viewer-assets
	TENSOR_SERVER_HOME=$(CURDIR)/.tensor-server $(PY) -m tensor_server run $(ROOT) \
		$(if $(PORT),--port $(PORT)) $(if $(HTTP_PORT),--http-port $(HTTP_PORT)) \
		$(if $(METRICS_PORT),--metrics-port $(METRICS_PORT))

# the viewer URL (with the access token) of a file or array id served by `make run`
url: $(BASE_STAMP)
	TENSOR_SERVER_HOME=$(CURDIR)/.tensor-server $(PY) -m tensor_server url $(TARGET)

# The whole suite, then the kernel tests once more on the pure-Python path so the
# oracle-equivalent interpreter path of every kernel stays correct (NUMBA_DISABLE_JIT=1).
# pytest exits 5 when it collected no tests; that is non-zero, so make fails on it. Tests run
# on TEST_WORKERS pytest-xdist workers; the 25 slowest are listed at the end. First, side by
# side: Chromium, OpenSeadragon, and the bytecode and numba caches filled once on every core
# (warm), so the workers do not each compile the same kernels. Their lines appear as they come
# (each names its target): with make's --output-sync a target said nothing until it had
# finished, and the numba warm-up is about 2 minutes on a fresh clone. Then nginx (apt, after
# Chromium's). Before all of it, the lint (make lint), so a finding fails the run at once.
test: $(STAMP)
	@echo "test: make lint first (ruff check, mypy), then pytest"
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory -j3 browser viewer-assets warm
	@$(MAKE) --no-print-directory nginx
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-nojit

# ruff's lint rules and mypy over the packages pyproject.toml lists ([tool.ruff], [tool.mypy]);
# any finding exits non-zero. Both keep a cache (.ruff_cache, .mypy_cache): a warm re-run takes
# a few seconds.
lint: $(STAMP)
	@echo "lint: ruff check . (the rules of [tool.ruff.lint] in pyproject.toml), ruff format --check ."
	@$(PY) -m ruff check .
	@$(PY) -m ruff format --check --quiet . || { echo "lint: run \`$(PY) -m ruff format .\` to format"; exit 1; }
	@echo "lint: mypy (the packages of [tool.mypy] files in pyproject.toml)"
	@$(PY) -m mypy

# The neuroglancer test (tests/http) drives Debian's Chromium; install it where apt can (CI
# runs as root). Where it cannot, that one test skips and says why.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { echo "browser: installing Debian's chromium and chromium-driver with apt-get (about 300 MB; only the"; \
	    echo "         neuroglancer test uses them; skipped when apt cannot)"; \
	    (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 && \
	    echo "browser: chromium installed" || \
	    echo "note: chromium could not be installed; the neuroglancer test will skip"; }

# The replicas-behind-nginx test (tests/deploy) runs Debian's nginx unprivileged on loopback; install
# it where apt can (make test runs this after the browser step: one apt at a time, both take
# dpkg's lock). Where it cannot, that test skips and says why. (On a host with systemd, Debian's package also starts the
# system nginx on port 80; the test does not use it.)
nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || \
	  { echo "nginx: installing Debian's nginx with apt-get (a few MB; only the replicas-behind-nginx test"; \
	    echo "       uses it; skipped when apt cannot)"; \
	    (apt-get update -qq && apt-get install -y -qq nginx) >/dev/null 2>&1 && \
	    echo "nginx: nginx installed" || \
	    echo "note: nginx could not be installed; the replicas-behind-nginx test will skip"; }

# OpenSeadragon (npm package) for the catalog page's viewer and tests/viewers, into the
# git-ignored .viewer-assets/ (never committed); node/npm come from apt where missing.
OSD := openseadragon@6.1.1
viewer-assets:
	@command -v npm >/dev/null || { echo "viewer assets: installing node and npm with apt-get (a minute or two)" && \
	  (apt-get update -qq && apt-get install -y -qq nodejs npm) >/dev/null 2>&1 || \
	  echo "note: npm could not be installed; the viewer page will say how to get OpenSeadragon"; }
	@test -f .viewer-assets/node_modules/openseadragon/build/openseadragon/openseadragon.min.js || \
	  { command -v npm >/dev/null && echo "viewer assets: npm install $(OSD) into .viewer-assets/ (the viewer page's OpenSeadragon)" && \
	    npm install --silent --no-save --prefix .viewer-assets '$(OSD)'; } || \
	  echo "note: OpenSeadragon could not be installed; the OpenSeadragon tests will skip"

# Caches every test process reads: the project's bytecode (set-up compiles the installed
# packages, not this editable project, and with PYTHONDONTWRITEBYTECODE each of the suite's
# Python processes, 64 or more, compiled the ~0.3 s of our modules it imports), and numba's
# on-disk cache filled with the case table's kernels (tensor_server_kernels/warm.py says why and
# what it saves; it counts the kernels as they compile). Seconds when both are already warm.
warm: $(STAMP)
	@$(PY) tools/bytecode.py tensor_server kernels/tensor_server_kernels
	@$(PY) -m tensor_server_kernels.warm

# The load test of `serve --workers 2` (issue 41: 8 HTTP + 6 Flight clients for 60 s, a worker
# SIGKILLed mid-run). Off in `make test`, whose ten minutes it would take a tenth of with both
# cores busy; .ci/run runs it after `make test`.
test-load: $(STAMP)
	@echo "test-load: 8 HTTP + 6 Flight clients against serve --workers 2 for 60 s (tests/cli_workers_load_test.py)"
	TENSOR_SERVER_LOAD_TEST=1 $(PY) -m pytest -q -n 0 tests/cli_workers_load_test.py

test-nojit: $(STAMP)
	NUMBA_DISABLE_JIT=1 $(PY) -m pytest -q tests/kernels/downsample_test.py tests/kernels/decode_test.py tests/kernels/composite_test.py

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

# The performance gate CI runs after the tests: gate 1 against PERF_BASE (asv continuous,
# factor 1.5, a flagged benchmark confirmed by an interleaved re-run), gate 2 floors against
# peers measured in the same run. Prints "PERF GATE PASSED" or "PERF GATE FAILED" with each
# failure's timings, ratio and reproducing command; exits non-zero on failure.
perf-gate: $(STAMP)
	$(PY) -m tensor_server.bench gate --base "$$PERF_BASE" --floors "$$PERF_FLOORS" \
		$${PERF_BENCH:+--bench "$$PERF_BENCH"} $${PERF_SKIP_COMMITS:+--skip-commits} \
		$${PERF_ASV_ARGS:+--asv-args "$$PERF_ASV_ARGS"} $${PERF_CONFIRM_S:+--confirm-seconds "$$PERF_CONFIRM_S"}

# Append this machine's results for HEAD to the history kept in the repository
# (asv_bench/results/, asv's format, one machine file per BENCH_MACHINE); commit them.
bench-record: $(STAMP)
	cd asv_bench && $(abspath $(PY)) -m asv machine --yes --machine "$(BENCH_MACHINE)" > /dev/null
	cd asv_bench && TENSOR_SERVER_BENCH_SITE="$$($(abspath $(PY)) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
		$(abspath $(PY)) -m asv run --machine "$(BENCH_MACHINE)" --show-stderr --skip-existing-commits \
		$${BENCH_RECORD:+--bench "$$BENCH_RECORD"} HEAD^!

# Render the recorded history (asv_bench/results/) as HTML in .asv/html; `asv preview` serves it.
bench-publish: $(STAMP)
	cd asv_bench && $(abspath $(PY)) -m asv publish
	@echo "open .asv/html/index.html, or: cd asv_bench && $(abspath $(PY)) -m asv preview"

clean:
	rm -rf $(VENV) .asv build *.egg-info .pytest_cache .ruff_cache .mypy_cache .tensor-server
	@echo "servers started outside make keep their files in ~/.cache/tensor-server (demo data, chunk"
	@echo "caches, bench data) and ~/.local/share/tensor-server (annotations); remove those by hand"
