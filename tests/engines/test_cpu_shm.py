"""Stale vLLM CPU shared-memory segments (agentrl/engines/cpu_shm.py): a second tensor-parallel
engine on one machine failed with errno 17 on the segments the first left behind."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys

import pytest

from agentrl.engines.cpu_shm import remove_stale_segments

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc (Linux)")
HOLD = "import sys; f = open(sys.argv[1], 'rb'); print('open', flush=True); sys.stdin.read()"


@pytest.mark.parametrize("via_link", [False, True])
def test_only_segments_no_process_holds_are_removed(tmp_path, via_link):
    """A segment left by an ended run goes; one open in a live process, one only mapped (its file
    closed) and a file of another name stay; also when the folder is named through a symbolic link
    (``/proc`` shows the real path)."""
    names = ["-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "x-[0-1]-cpushm_0", "other"]
    real = tmp_path / "shm"
    real.mkdir()
    if via_link:
        (tmp_path / "link").symlink_to(real)
    root = tmp_path / "link" if via_link else real
    for name in names:
        (real / name).write_bytes(b"\0" * 4096)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(real / names[1])], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    with open(real / names[2], "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 4096)  # the file is closed below; the mapping stays
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        removed = remove_stale_segments(root)
    finally:
        holder.communicate(b"")
        mapped.close()
    assert removed == [names[0]]
    assert sorted(p.name for p in real.iterdir()) == sorted(names[1:])
    assert sorted(remove_stale_segments(root)) == sorted(names[1:3])  # released since


def test_nothing_to_do_without_the_folder(tmp_path):
    assert remove_stale_segments(tmp_path / "absent") == []
