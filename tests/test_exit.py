"""Nothing a user's code does can keep ``agentrl`` running after its work is done.

A tool, a reward, an environment's ``reset``/``step`` that never return, and a thread the user's code
started and never ended, under ``agentrl train``, ``eval`` and ``rollout`` (tests/helpers/hanging_env.py);
and ``agentrl serve`` stopped while a client holds a request half sent. Each command must exit by
itself, with the status that says how its own work ended (0 done, 3 training failed). Before the
fix, the first case printed its training summary and then never exited: CPython joined the tool's
``ThreadPoolExecutor`` thread at exit, and that thread was still inside the tool.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT
from tests.helpers.configs import hanging_config

LIMIT_S = 120  # the process must be gone by then (it takes ~10-20 s); the old code never ended


def _agentrl(*args: str) -> subprocess.CompletedProcess:
    """The command, which must end by itself within LIMIT_S (``TimeoutExpired`` fails the test)."""
    env = {**os.environ, "AGENTRL_EXIT_GRACE_S": "2"}
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=LIMIT_S,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("hang", "status", "said"),
    [
        # the tool times out every call (fed back to the model), the reward then hangs: every
        # episode fails at the reward boundary and training reports it (exit 3), then exits
        ("tool,reward", 3, "reward 'correct' did not return"),
        ("step", 3, "environment 'hanging' step: no answer"),
    ],
)
@pytest.mark.slow
def test_train_exits_whatever_user_code_hangs(tmp_path, tiny_model_dir, hang, status, said):
    proc = _agentrl("train", str(hanging_config(tmp_path, tiny_model_dir, hang, data={"num_train": 4})))
    out = proc.stdout + proc.stderr
    assert proc.returncode == status, out[-3000:]
    assert said in out or said in (tmp_path / "run" / "transcripts.jsonl").read_text(), out[-3000:]


@pytest.mark.slow
def test_a_thread_user_code_never_ends_delays_the_exit_by_the_grace_only(tmp_path, tiny_model_dir):
    """The tool starts a non-daemon thread that runs forever: the run trains (exit 0), says which
    thread it left behind, and exits after the grace (2 s here)."""
    proc = _agentrl("train", str(hanging_config(tmp_path, tiny_model_dir, "thread", data={"num_train": 4})))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(
        r"exiting with status 0 although 4 thread\(s\) of user code still run \(user-thread, ", out
    )


@pytest.mark.slow
@pytest.mark.parametrize(("command", "hang"), [("eval", "tool,reward"), ("rollout", "reset")])
def test_eval_and_rollout_exit_whatever_user_code_hangs(tmp_path, tiny_model_dir, command, hang):
    """With train's cases above: every hang point (tool, reward, step, reset, a user thread) and every command."""
    args = ["--tasks", "2"] if command == "rollout" else []
    proc = _agentrl(
        command, str(hanging_config(tmp_path, tiny_model_dir, hang, data={"num_train": 4})), *args
    )
    out = proc.stdout + proc.stderr
    # every episode failed: both commands did their work, and their status says nothing succeeded
    assert proc.returncode == 3, out[-3000:]
    assert "failed" in out, out[-3000:]


@pytest.mark.slow
def test_serve_stops_while_a_client_holds_a_request_half_sent(tmp_path, tiny_model_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "serve", str(ROOT / "configs" / "quickstart.yaml"),
         f"model.path={tiny_model_dir}", "sft.enabled=false", f"run.output_dir={tmp_path / 'run'}", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        env={**os.environ, "AGENTRL_EXIT_GRACE_S": "2"},
    )  # fmt: skip
    try:
        while not (m := re.search(r"at http://127\.0\.0\.1:(\d+)/v1", proc.stdout.readline())):
            pass
        port = int(m[1])
        stuck = socket.create_connection(("127.0.0.1", port))
        stuck.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{"
        )  # never finished
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    stuck.close()
