"""How the ``agentrl`` command ends: its exit status, and an exit that threads left running by user
code cannot delay."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback

from agentrl.cli.main import main

EXIT_GRACE_S = float(os.environ.get("AGENTRL_EXIT_GRACE_S", "10"))
"""How long ``agentrl`` waits, once its command has returned, for threads it did not start as
daemons (user code: a tool's own thread pool, a library's worker) before exiting without them
(environment variable ``AGENTRL_EXIT_GRACE_S``, default 10)."""


def entry() -> None:
    """The ``agentrl`` command (and ``python -m agentrl.cli``): ``main``, then an exit that no
    thread left running by user code can delay past ``EXIT_GRACE_S`` (``exit_past_stuck_threads``).
    The exit status says how the command itself ended: 0 done, 2 bad input, 3 training failed,
    130 interrupted, 1 an unexpected error (its traceback printed)."""
    code = 1
    try:
        code = main()
    except SystemExit as e:  # argparse's errors and --help
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_past_stuck_threads(code)
    sys.exit(code)


def exit_past_stuck_threads(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """Exit with ``code`` within ``grace_s`` even when user code still runs in a thread Python would
    wait for at exit. agentrl runs tools, rewards, environment calls and agents in daemon threads,
    which end with the process; a thread the user's code started itself is not a daemon, and
    CPython joins it before exiting, so one that never returns would hold the process (and a rented
    GPU node) forever. Such threads get ``grace_s`` to finish; then the exit handlers run, the
    streams are flushed and the process ends with ``code``, saying which threads it left."""
    stuck = [t for t in threading.enumerate() if not t.daemon and t is not threading.current_thread()]
    deadline = time.monotonic() + grace_s
    for t in stuck:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t for t in stuck if t.is_alive()]
    if not stuck:
        return
    names = ", ".join(sorted(t.name for t in stuck))
    print(
        f"agentrl: exiting with status {code} although {len(stuck)} thread(s) of user code still run "
        f"({names}): they did not end within {grace_s:g}s of the command's end",
        file=sys.stderr,
    )
    try:
        atexit._run_exitfuncs()  # what a normal exit would run: sandboxes reaped, servers stopped
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
