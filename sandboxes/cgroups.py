"""Memory and pids cgroups for sandboxes, where the host lets us write them (v1 or v2).

Why cgroups and not only rlimits: RLIMIT_NPROC does not apply to processes whose user is root on the
host (a user namespace maps the sandbox's uid to ours, and we are often root), and RLIMIT_DATA/AS are
per process, so ``fork()`` multiplies them. A cgroup bounds the whole tree, and it lists every process
of a sandbox, which makes "kill everything, leave nothing behind" checkable.

Group names are ``agentrl/<owner pid>-<owner start time>-<n>``, so start-up reaping can remove the
groups (and kill the processes) of an owner that crashed.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import threading
import time
from pathlib import Path

from sandboxes.base import owner_alive, process_start_time

log = logging.getLogger(__name__)
BASE = "agentrl"
FINISH_S = 120.0
"""How long a teardown that its own limit could not finish goes on in the background."""
_counter = itertools.count()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class Cgroup:
    """One sandbox's groups (one directory per controller on v1, a single directory on v2)."""

    def __init__(self, dirs: dict[str, Path], v2: bool) -> None:
        self.dirs = dirs
        self.v2 = v2

    def _file(self, controller: str, name: str) -> Path:
        return self.dirs["unified" if self.v2 else controller] / name

    def set_limits(self, memory_bytes: int, pids: int) -> None:
        if self.v2:
            _write(self._file("memory", "memory.max"), str(memory_bytes))
            with contextlib.suppress(OSError):
                _write(self._file("memory", "memory.swap.max"), "0")
            _write(self._file("pids", "pids.max"), str(pids))
            return
        mem = self._file("memory", "memory.limit_in_bytes")
        memsw = self._file("memory", "memory.memsw.limit_in_bytes")
        _write(mem, str(memory_bytes))
        if memsw.exists():  # only present with swap accounting; must not be below the memory limit
            _write(memsw, str(memory_bytes))
        _write(self._file("pids", "pids.max"), str(pids))

    def add(self, pid: int) -> None:
        """Move ``pid`` (a whole thread group) into the groups; its future children follow."""
        for d in {*self.dirs.values()}:
            _write(d / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in {*self.dirs.values()}:
            with contextlib.suppress(OSError), open(d / "cgroup.procs") as f:
                out.update(int(x) for x in f.read().split())
        return sorted(out)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the memory limit."""
        name = "memory.events" if self.v2 else "memory.oom_control"
        try:
            text = self._file("memory", name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, val = line.partition(" ")
            if key == "oom_kill":
                return int(val)
        return 0

    def kill_all(self) -> list[int]:
        """SIGKILL every process of the groups at once where the kernel can (cgroup v2's
        ``cgroup.kill``: a process forking meanwhile cannot escape it), and each listed one by pid as
        well (v1, or an older kernel). Returns the pids that were listed."""
        if self.v2:
            with contextlib.suppress(OSError):
                _write(self._file("pids", "cgroup.kill"), "1")
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def _remove(self) -> bool:
        """Remove the (empty) group directories; True when none is left."""
        removed = True
        for d in {*self.dirs.values()}:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                removed = False
        return removed

    def destroy(self, timeout_s: float = 3.0, finish_s: float = FINISH_S) -> bool:
        """Kill every process in the groups and remove them; True when nothing was left behind within
        ``timeout_s``. A group still busy then (on a loaded machine killed processes take a while to
        exit) is not abandoned: a background thread keeps killing and removing it for up to
        ``finish_s`` more seconds, and what even that leaves is reaped at the next start
        (``CgroupManager.reap_orphans``)."""
        if self._until_removed(time.monotonic() + timeout_s):
            return True
        log.info(
            "cgroup %s still busy after %.1fs: its removal goes on in the background", self.dirs, timeout_s
        )
        threading.Thread(
            target=self._finish, args=(finish_s,), name="agentrl-cgroup-teardown", daemon=True
        ).start()
        return False

    def _until_removed(self, deadline: float) -> bool:
        while True:
            if not self.kill_all() and self._remove():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def _finish(self, finish_s: float) -> None:
        if not self._until_removed(time.monotonic() + finish_s):
            log.warning(
                "cgroup %s still busy %.0fs after its teardown (pids %s)", self.dirs, finish_s, self.pids()
            )


class CgroupManager:
    """Creates per-sandbox groups under ``agentrl/`` in the memory and pids hierarchies."""

    def __init__(self, roots: dict[str, Path], v2: bool) -> None:
        self.roots = roots
        self.v2 = v2
        self.tag = f"{os.getpid()}-{process_start_time(os.getpid())}"

    def create(self, memory_bytes: int, pids: int) -> Cgroup:
        name = f"{self.tag}-{next(_counter)}"
        dirs = {c: r / BASE / name for c, r in self.roots.items()}
        for d in {*dirs.values()}:
            d.mkdir()
        cg = Cgroup(dirs, self.v2)
        try:
            cg.set_limits(memory_bytes, pids)
        except OSError:
            cg.destroy()
            raise
        return cg

    def reap_orphans(self) -> int:
        """Remove groups left by owners that are gone (a crashed run); returns how many."""
        n = 0
        for root in {*self.roots.values()}:
            with contextlib.suppress(OSError):
                for d in (root / BASE).iterdir():
                    parts = d.name.split("-")
                    if len(parts) != 3 or not d.is_dir():
                        continue
                    if owner_alive(f"{os.uname().nodename}:{parts[0]}:{parts[1]}"):
                        continue
                    cg = Cgroup({"x": d}, self.v2)
                    n += cg.destroy(timeout_s=1.0)
        return n


def detect() -> CgroupManager | None:
    """A manager if memory and pids cgroups are writable here (v1 first, then v2), else None."""
    v1 = {c: Path("/sys/fs/cgroup") / c for c in ("memory", "pids")}
    if all((p / "cgroup.procs").exists() for p in v1.values()):
        mgr = _try(v1, v2=False)
        if mgr:
            return mgr
    root = Path("/sys/fs/cgroup")
    ctl = root / "cgroup.controllers"
    if ctl.exists() and {"memory", "pids"} <= set(ctl.read_text().split()):
        with contextlib.suppress(OSError):
            _write(root / "cgroup.subtree_control", "+memory +pids")
        base = root / BASE
        with contextlib.suppress(OSError):
            base.mkdir(exist_ok=True)
            _write(base / "cgroup.subtree_control", "+memory +pids")
        return _try({"unified": root}, v2=True)
    return None


def _try(roots: dict[str, Path], v2: bool) -> CgroupManager | None:
    try:
        for r in roots.values():
            (r / BASE).mkdir(exist_ok=True)
        mgr = CgroupManager(roots, v2)
        mgr.create(64 << 20, 16).destroy()
        mgr.reap_orphans()
        return mgr
    except OSError as e:
        log.info("cgroups not usable (%s); falling back to rlimits", e)
        return None
