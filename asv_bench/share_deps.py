"""asv install step: let a benchmark environment import the project venv's packages.

Why: asv builds one virtualenv and installs each benchmarked commit's wheel into it. Letting
pip resolve the dependencies there downloads ~1 GB (numba, pyarrow, tensorstore, ...) into
every fresh CI clone, and lets base and head run on different dependency versions. Instead
the environment gets a ``.pth`` line naming the site-packages of the interpreter that runs
asv (``TENSOR_SERVER_BENCH_SITE``, set by ``python -m tensor_server.bench gate`` and
``make bench-record``), and the commit's own wheel is installed with ``--no-deps``. The
environment's own site-packages comes first on ``sys.path``, so the commit's wheel, not the
project venv's editable install, is what the benchmarks import.
"""

import os
import site
import sys
from pathlib import Path

deps = os.environ.get("TENSOR_SERVER_BENCH_SITE", "")
if not deps or not Path(deps).is_dir():
    sys.exit(
        f"share_deps.py: TENSOR_SERVER_BENCH_SITE={deps!r} is not a directory; run asv through "
        "`make perf-gate` or `make bench-record`, which set it"
    )
(Path(site.getsitepackages()[0]) / "tensor_server_bench_deps.pth").write_text(deps + "\n")
