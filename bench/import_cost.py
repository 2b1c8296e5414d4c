"""What a fresh Python process pays to import what ``agentrl train`` imports (torch, transformers,
agentrl's training floor), with and without bytecode on disk.

    .venv/bin/python bench/import_cost.py --rounds 3

Every torchrun rank, Ray worker and CLI subprocess of the test suite pays this once. With
``PYTHONDONTWRITEBYTECODE`` set (this machine's shell sets it), Python never writes bytecode, so
every process compiles each imported module from source; ``scripts/test.sh`` unsets it. Two modes,
each in fresh subprocesses, interleaved round by round:

- ``source``: no bytecode to read (an empty ``PYTHONPYCACHEPREFIX``, none written), as under
  ``PYTHONDONTWRITEBYTECODE`` in a fresh install (``setup.sh`` installs with ``--no-compile``);
- ``bytecode``: the bytecode a first import wrote (a warmed ``PYTHONPYCACHEPREFIX``).

Reported: the median CPU seconds (user + system) and wall seconds of one process per mode, and
their ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

IMPORTS = "import agentrl.cli.main, agentrl.config, agentrl.training.run_state, agentrl.training.trainer"


def one_process(env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one interpreter that runs ``IMPORTS`` and exits."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], env=env, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as warm:
        bytecode = {**base, "PYTHONPYCACHEPREFIX": warm}
        one_process(bytecode)  # writes the bytecode the mode reads
        times: dict[str, list[tuple[float, float]]] = {"source": [], "bytecode": []}
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as empty:
                source = {**base, "PYTHONPYCACHEPREFIX": empty, "PYTHONDONTWRITEBYTECODE": "1"}
                times["source"].append(one_process(source))
            times["bytecode"].append(one_process(bytecode))
    med = {
        m: (statistics.median(c for c, _ in t), statistics.median(w for _, w in t)) for m, t in times.items()
    }
    for mode, (cpu, wall) in med.items():
        print(f"{mode:9s} CPU {cpu:6.2f} s   wall {wall:6.2f} s   (median of {args.rounds})")
    print(f"source / bytecode: CPU {med['source'][0] / med['bytecode'][0]:.2f}x")


if __name__ == "__main__":
    main()
