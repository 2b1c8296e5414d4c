"""Configs and launch commands shared by several test files."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from pathlib import Path

from agentrl.config import load_config
from tests.helpers import HELPERS
from tests.helpers import envs as _envs  # noqa: F401  (registers test_chatter and test_all_correct)

ENVS = HELPERS / "distributed_envs.py"
TORCHRUN_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
"""``test_crashy`` and the other environments the subprocess and Ray tests load with ``env.module``."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def small_config(tmp_path: Path, model_dir: Path, *extra: str):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "env.name=test_chatter",
            f"run.output_dir={tmp_path / 'run'}",
            "run.device=cpu",
            "rollout.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.max_tokens_per_turn=8",
            "rollout.max_episode_tokens=64",
            "trainer.total_steps=2",
            "trainer.micro_batch_size=4",
            "trainer.lr=1e-3",
            "trainer.weight_decay=0.0",
            "logging.tensorboard=false",
            "logging.plots=false",
            "data.num_test=4",
            *extra,
        ],
    )


def cli_args(run, model_dir, *extra: str) -> list[str]:
    """``agentrl train`` overrides for the subprocess tests: the tiny model on ``test_crashy`` (its
    reward varies under a random policy), 2 × 2 episodes of up to 8 tokens per step, no plots."""
    return [
        f"model.path={model_dir}",
        "env.name=test_crashy",  # rewards vary with a random policy, so every step trains
        f"env.module={ENVS}",
        f"run.output_dir={run}",
        "run.device=cpu",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_tokens_per_turn=8",
        "algorithm.name=grpo",
        "logging.tensorboard=false",
        "logging.plots=false",
        "sft.enabled=false",
        *extra,
    ]


def ray_config(tmp_path: Path, model_dir: Path, *extra: str):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "env.name=test_crashy",
            f"env.module={ENVS}",
            f"run.output_dir={tmp_path / 'run'}",
            "run.device=cpu",
            "rollout.workers=2",
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_tokens_per_turn=8",
            "rollout.max_episode_tokens=64",
            "trainer.total_steps=1",
            "trainer.micro_batch_size=4",
            "trainer.lr=1e-2",
            "logging.tensorboard=false",
            "logging.plots=false",
            "logging.transcripts=false",
            *extra,
        ],
    )


def torchrun_prefix(procs: int = 2) -> list[str]:
    """``torch.distributed.run`` with ``procs`` ranks on this machine, on a free loopback port."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc_per_node={procs}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
    ]


def torchrun_cli(*args: str) -> list[str]:
    """``agentrl`` on two ranks under torchrun."""
    return [*torchrun_prefix(2), "-m", "agentrl.cli", *args]


def colocated_tp_overrides(tmp_path: Path, model_dir: Path, *extra: str) -> list[str]:
    """A run whose colocated vLLM engine has tensor_parallel_size 2 (two torchrun ranks), on
    ``test_crashy`` with 2 × 2 short episodes, for the drivers ``colocated_tp.py`` and
    ``colocated_vllm.py``."""
    return [
        f"model.path={model_dir}",
        "env.name=test_crashy",
        f"env.module={ENVS}",
        f"run.output_dir={tmp_path / 'run'}",
        "run.device=cpu",
        "rollout.engine=vllm",
        "rollout.vllm.tensor_parallel_size=2",
        "rollout.sync.verify=off",  # an engine with tensor parallelism cannot be fingerprinted
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "trainer.micro_batch_size=2",
        "logging.tensorboard=false",
        "logging.plots=false",
        *extra,
    ]


def exit_driver() -> None:
    """End a torchrun driver whose results are written, skipping interpreter finalization: in CI a
    rank intermittently aborted there after a correct run ("terminate called without an active
    exception", SIGABRT, seen 5 times in 3 runs on 2026-11-24, never reproduced alone); the drivers
    test what they wrote, not the exit (the CLI's exit under torchrun is tested by
    tests/parallel/test_ddp.py). Call it at the end of the driver's ``main``, before its objects are
    freed: rank 1 of colocated_tp.py hung freeing them once its process group was destroyed (2 of
    about 30 launches on 2 loaded cores, 2026-12-02; its stack: ``main()``'s call line, in no Python
    frame)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def torchrun_record(driver: str, out: Path, args: list[str], timeout_s: float = 300, **env: str) -> object:
    """Run ``tests/helpers/<driver>`` on two torchrun ranks with ``out`` and ``args`` (its overrides),
    and return the JSON its rank 0 wrote to ``out``; a failed launch fails with the ranks' stderr. A
    launch that has not finished in ``timeout_s`` (the drivers take 15-30 s) fails with every rank's
    Python stacks: each rank gets SIGABRT, which faulthandler answers with all its threads'
    tracebacks (the TP engine-group test has hung in CI twice, without a trace)."""
    import json
    import signal
    import subprocess

    proc = subprocess.Popen(
        [*torchrun_prefix(2), str(HELPERS / driver), str(out), *args],
        env={**TORCHRUN_ENV, "PYTHONFAULTHANDLER": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for pid in _descendants(proc.pid):  # the ranks (torchrun's agent is proc itself)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        raise AssertionError(
            f"torchrun {driver} did not finish in {timeout_s:g} s; the ranks' stacks:\n{err[-12000:]}"
        ) from None
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.read_text())


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def hanging_config(tmp_path: Path, model_dir: Path, hang: str, **sections: dict) -> str:
    """A config file for the tiny model on ``hanging`` (``hang``: where its code hangs): 2 tasks × 2
    samples of up to 8 tokens, one step, ``timeouts.env_step_s=1``; ``sections`` update its sections
    (tests/env/test_bounded_user_code.py, tests/test_exit.py)."""
    import yaml

    cfg = {
        "run": {"name": "hang", "output_dir": str(tmp_path / "run"), "device": "cpu"},
        "model": {"path": str(model_dir)},
        "env": {"name": "hanging", "module": str(HELPERS / "hanging_env.py"), "options": {"hang": hang}},
        "data": {"num_train": 2, "num_test": 2},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_turns": 1, "max_tokens_per_turn": 8,
                    "max_episode_tokens": 512},
        "trainer": {"total_steps": 1, "max_failed_fraction": None},
        "timeouts": {"env_step_s": 1.0},
        "eval": {"k": 1},
        "sft": {"enabled": False},
        "logging": {"plots": False, "tensorboard": False},
    }  # fmt: skip
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    path = tmp_path / "hang.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def header_plans(path: Path) -> list[list[str]]:
    """The ``agentrl plan`` commands a config's header names, as argument lists (``plan CONFIG ...``);
    a command goes on over the header's next lines when they are indented further and set keys."""
    lines = [line.removeprefix("#") for line in path.read_text().splitlines() if line.startswith("#")]
    commands: list[list[str]] = []
    for line in lines:
        if line.strip().startswith("agentrl plan "):
            commands.append(line.split()[1:])
        elif commands and line.startswith("     ") and "=" in line:
            commands[-1] += line.split()
    return commands
