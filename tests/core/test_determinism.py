"""``run.deterministic`` (``seeds.deterministic_kernels``): on CUDA, what cuBLAS needs is set before
CUDA starts (before torchrun's rank takes its GPU), and a process whose CUDA already started without
it is told how to launch instead. The CUDA side runs here without a GPU: nothing it does touches one."""

from __future__ import annotations

import pytest
import torch

from agentrl.assembly import build
from agentrl.config import load_config
from agentrl.parallel import ranks
from agentrl.seeds import CUBLAS_WORKSPACE, deterministic_kernels


@pytest.fixture
def restore_torch(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    flags = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags


def test_cuda_settings_are_made_before_cuda_starts(restore_torch, monkeypatch):
    import os

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    notes = deterministic_kernels(torch.device("cuda", 0))
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert any("32 MiB of cuBLAS workspace per stream" in n for n in notes)
    # a value the user set is kept
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert any(":16:8" in n for n in deterministic_kernels(torch.device("cuda", 0)))
    # too late: CUDA started without it
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="set CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment"):
        deterministic_kernels(torch.device("cuda", 0))


def test_on_cpu_only_torchs_switch(restore_torch):
    import os

    notes = deterministic_kernels(torch.device("cpu"))
    assert torch.are_deterministic_algorithms_enabled() and len(notes) == 1
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_a_run_sets_them_before_its_rank_takes_a_gpu(restore_torch, monkeypatch):
    """``join_run`` (the trainer's first step) makes the settings before ``ranks.init_from_env``,
    which under torchrun calls ``torch.cuda.set_device``: the variable is there when it runs."""
    import os

    seen = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(
        ranks,
        "init_from_env",
        lambda timeout_s=None: seen.append(os.environ.get("CUBLAS_WORKSPACE_CONFIG")) or (0, 1),
    )
    logged = []
    cfg = load_config(None, ["run.device=cuda", "run.deterministic=true"])
    device, rank, world, _ = build.join_run(cfg, log=logged.append)
    assert (device, rank, world) == (torch.device("cuda", 0), 0, 1)
    assert seen == [":4096:8"] and any("CUBLAS_WORKSPACE_CONFIG" in line for line in logged)
