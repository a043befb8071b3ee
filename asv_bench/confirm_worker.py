"""One side (base or head) of the perf gate's confirmation of a flagged benchmark.

Started by ``tensor_server.bench.gate_confirm`` with ``PYTHONPATH`` naming one commit's source
tree, as ``python asv_bench/confirm_worker.py <module.Class.method> <param index>``. It lives
beside the benchmarks, not in the package, because the package it measures may be an older
commit that has no gate code at all; and it imports the benchmark suite from here, as asv does
(one suite, every commit).

Protocol (one line each, on stdin/stdout): after setup and one untimed call it prints
``ready``; each ``run`` line is answered with the seconds of one call; ``quit`` runs teardown
and exits. ``timeraw_`` benchmarks return code; one call is a fresh interpreter running it, timed from
inside (start-up excluded, as asv does).
"""

import importlib
import itertools
import os
import subprocess
import sys
import time

#: A timeraw benchmark's code, timed inside the fresh interpreter as asv does: interpreter start-up
#: is the same for every commit and would only dilute a slowdown of the code itself.
_TIMERAW = (
    "import sys, time\n"
    "t0 = time.perf_counter()\n"
    "exec(compile(sys.argv[1], '<timeraw>', 'exec'), {'__name__': '__main__'})\n"
    "print(time.perf_counter() - t0)\n"
)


def _resolve(name: str, param_index: int):
    parts = name.split(".")
    module = importlib.import_module("benchmarks." + parts[0])
    owner, obj = None, module
    for attr in parts[1:]:
        owner, obj = obj, getattr(obj, attr)
    if owner is module:  # a module-level function benchmark
        instance, params = None, list(getattr(obj, "params", []) or [])
    else:
        instance = owner()
        params = list(getattr(owner, "params", []) or [])
    if params and not isinstance(params[0], (list, tuple)):
        params = [params]
    combo = list(itertools.product(*params))[param_index] if params else ()
    return instance, obj, combo


def main() -> int:
    name, param_index = sys.argv[1], int(sys.argv[2])
    instance, method, combo = _resolve(name, param_index)
    call = (lambda: method(instance, *combo)) if instance is not None else (lambda: method(*combo))
    if instance is not None and hasattr(instance, "setup"):
        instance.setup(*combo)
    if method.__name__.startswith("timeraw_"):
        code = call()

        def measure() -> float:
            out = subprocess.run(
                [sys.executable, "-c", _TIMERAW, code],
                check=True,
                env=dict(os.environ),
                stdout=subprocess.PIPE,
                text=True,
            ).stdout
            return float(out.split()[-1])
    else:

        def measure() -> float:
            t0 = time.perf_counter()
            call()
            return time.perf_counter() - t0

    measure()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        print(measure(), flush=True)
    if instance is not None and hasattr(instance, "teardown"):
        instance.teardown(*combo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
