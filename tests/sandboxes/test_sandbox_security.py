"""The security suite, run against every backend available here.

bwrap runs by default (fast); Docker needs the engine of .ci/docker_setup.sh (marker ``docker``); the
E2B backend runs the real SDK against a local server backed by bwrap (marker ``slow``: every cell is an
HTTP round trip). A backend that cannot run here skips with the reason.
"""

from __future__ import annotations

import os
import socket

import pytest

from sandboxes import Limits
from sandboxes.e2b_local import LocalCodeInterpreterServer
from tests.helpers.sandbox_fixtures import (
    FAST,
    assert_nothing_left,
    make_or_skip,
    our_cgroups,
    our_children,
    our_containers,
)

BACKENDS = [
    pytest.param("bwrap", id="bwrap"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
    pytest.param("e2b", id="e2b-local", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=BACKENDS)
def sandbox(request):
    os.environ["AGENTRL_TEST_SECRET"] = "hunter2-parent-secret"  # must not reach the sandbox
    if request.param == "e2b":
        inner = make_or_skip("bwrap")
        server = LocalCodeInterpreterServer(inner)
        sb = make_or_skip("e2b", debug=True, sandbox_url=server.url)
        yield sb
        sb.close()
        assert server.contexts == {}, "E2B contexts left open"
        server.close()
        inner.close()
    else:
        sb = make_or_skip(request.param)
        yield sb
        sb.close()
    assert_nothing_left()


def test_network_is_unreachable(sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = f"""
import socket
out = []
for host, port in [("127.0.0.1", {port}), ("1.1.1.1", 443), ("pypi.org", 443)]:
    try:
        socket.create_connection((host, port), timeout=1).close()
        out.append("open")
    except OSError:
        out.append("blocked")
out"""
    r = sandbox.run(code)
    assert r.error is None, r
    assert r.value == "['blocked', 'blocked', 'blocked']"
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing ever connected to the host's loopback
    listener.close()


def test_host_files_are_invisible(sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-VALUE")
    r = sandbox.run(f"open({str(secret)!r}).read()")
    assert r.error is not None and r.error.name in ("FileNotFoundError", "PermissionError"), r
    assert "TOP-SECRET-VALUE" not in r.stdout + r.stderr + (r.value or "")


def test_writes_outside_scratch_fail(sandbox, tmp_path):
    target = tmp_path / "written-by-sandbox"
    code = f"""
res = []
for p in [{str(target)!r}, "/usr/pwned", "/etc/pwned", "/pwned", "/scratch/ok.txt", "/tmp/ok.txt"]:
    try:
        with open(p, "w") as f:
            f.write("x")
        res.append("ok")
    except OSError:
        res.append("denied")
res"""
    r = sandbox.run(code)
    assert r.value == "['denied', 'denied', 'denied', 'denied', 'ok', 'ok']", r
    assert not target.exists()
    assert not os.path.exists("/usr/pwned") and not os.path.exists("/pwned")


def test_parent_environment_is_not_visible(sandbox):
    r = sandbox.run("import os; dict(os.environ)")
    assert r.error is None, r
    assert "hunter2" not in (r.value or "") and "AGENTRL_TEST_SECRET" not in (r.value or "")


def test_runs_unprivileged(sandbox):
    r = sandbox.run(
        "import os; (os.getuid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])"
    )
    assert r.value == "(65534, '0000000000000000')", r


def test_fork_bomb_is_contained(sandbox):
    code = """
import os
n = 0
while True:
    try:
        if os.fork() == 0:
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        n += 1
    except OSError:
        pass
"""
    with sandbox.session() as s:
        r = s.run(code, FAST.replace(wall_s=1.5))
        assert r.timed_out
    _assert_no_leftovers(sandbox)


def test_memory_bomb_is_contained(sandbox):
    with sandbox.session() as s:
        s.run("keep = 7")
        r = s.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))")
        assert r.error is not None and r.error.name == "MemoryError", r
        # an in-process MemoryError (RLIMIT_DATA / container limit) leaves the session usable; if the
        # interpreter was killed instead, the bomb's result must say so: ``restarted`` is true
        # exactly when the variables are gone (for every backend, E2B included)
        r2 = s.run("chunks = None\nkeep")
        assert (r2.value == "7") == (not r.restarted), (r, r2)
        assert not r2.restarted, r2
        # a child process blowing the limit is contained too
        r3 = s.run(
            "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'b = bytearray(2 << 30)']).returncode"
        )
        assert r3.value not in (None, "0"), r3
    _assert_no_leftovers(sandbox)


def test_infinite_loop_times_out_and_session_survives(sandbox):
    with sandbox.session() as s:
        assert s.run("x = 41").ok
        r = s.run("while True:\n    pass", FAST.replace(wall_s=1.0))
        assert r.timed_out and r.error is not None and r.error.name == "TimeoutError", r
        after = s.run("x + 1")
        # bwrap/docker interrupt the cell and keep the variables (or, if the interrupt cannot land,
        # kill the worker); E2B always restarts the context. Either way ``restarted`` must tell the
        # truth: set exactly when the variables are gone.
        if r.restarted:
            assert after.error is not None and after.error.name == "NameError", after
        else:
            assert after.value == "42", after
        if sandbox.name == "e2b":
            assert r.restarted, r


def test_a_dead_interpreter_is_reported_on_the_cell_that_killed_it(sandbox):
    with sandbox.session() as s:
        assert s.run("x = 41").ok
        r = s.run("import os\nos._exit(3)")
        assert r.restarted and not r.ok, r  # the model is told its variables are gone
        after = s.run("x + 1")
        assert after.error is not None and after.error.name == "NameError" and not after.restarted, after
        assert s.run("y = 1\ny + 1").value == "2"  # and the session works on


def test_huge_print_is_truncated(sandbox):
    with sandbox.session() as s:
        r = s.run(
            "import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))",
            FAST.replace(wall_s=5.0),
        )
        assert r.truncated, r
        assert len(r.stdout.encode()) <= FAST.output_bytes
        assert s.run("1 + 1").value == "2"
    _assert_no_leftovers(sandbox)


@pytest.mark.slow
def test_cpu_limit_is_a_timeout(sandbox):
    if sandbox.name == "e2b":
        pytest.skip("E2B has no per-cell CPU limit (the template's)")
    with sandbox.session() as s:
        r = s.run("while True:\n    pass", Limits(wall_s=10, cpu_s=1))
        assert r.timed_out and r.error is not None and "CPU time limit" in r.error.value, r


def test_state_persists_across_cells_and_reset_clears(sandbox):
    with sandbox.session() as s:
        s.run("import math\ndef f(n):\n    return math.factorial(n)")
        assert s.run("f(10)").value == "3628800"
        s.reset()
        r = s.run("f(10)")
        assert r.error is not None and r.error.name == "NameError"


def _assert_no_leftovers(sandbox) -> None:
    if sandbox.name == "bwrap":
        assert our_children() == [] and our_cgroups() == []
    if sandbox.name == "docker":
        assert our_containers() == []
