"""One process trains a run directory at a time.

Two trainers appending to one run's ``metrics.jsonl``, ``transcripts.jsonl`` and checkpoints (a
second ``--resume`` started while the first still runs, a study run left behind by a killed study)
interleave two trajectories in one history, and each one's resume cuts the other's lines. So rank 0
takes an exclusive ``flock`` on ``.NAME.lock`` beside the run directory (beside, not inside: it
survives ``--overwrite`` moving the directory aside, and a new run's directory stays empty) before
it touches the directory, and a second process is refused with the holder's pid and command. The
kernel drops the lock when its process ends, however it ends (SIGKILL included), so a lock is never
stale. Within one process the lock is shared: a second trainer on the same directory (tests, a study
run's evaluation) takes it again and the last one out lets it go.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from pathlib import Path

from agentrl.config import ConfigError

_held: dict[str, list[int]] = {}  # lock file -> [fd, holders in this process]
_guard = threading.Lock()


class RunInUse(ConfigError):
    """The run directory is being trained by another process."""


def lock_path(run_dir: Path) -> Path:
    run_dir = Path(run_dir).resolve()
    return run_dir.parent / f".{run_dir.name}.lock"


class RunLock:
    """This process's hold on a run directory; ``release`` (idempotent) lets go of it."""

    def __init__(self, run_dir: Path) -> None:
        self.path = str(lock_path(run_dir))
        self._released = False
        with _guard:
            entry = _held.get(self.path)
            if entry is not None:
                entry[1] += 1
                return
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise RunInUse(
                    f"run directory {Path(run_dir)} is being trained by another process ({holder}); "
                    "two trainers would interleave their steps in one run. Wait for it, stop it, or "
                    "give this run another run.output_dir"
                ) from None
            os.ftruncate(fd, 0)
            command = " ".join(sys.argv)[:300]
            os.pwrite(fd, f"pid {os.getpid()}, since {time.strftime('%H:%M:%S')}: {command}\n".encode(), 0)
            _held[self.path] = [fd, 1]

    def release(self) -> None:
        with _guard:
            if self._released:
                return
            self._released = True
            entry = _held.get(self.path)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del _held[self.path]
                os.close(entry[0])  # closing the descriptor drops the flock

    def __del__(self) -> None:  # a trainer that never trained
        with contextlib.suppress(Exception):  # at interpreter shutdown
            self.release()
