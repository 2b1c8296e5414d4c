"""Seeds: every random draw of a run derives from ``run.seed`` and where it happens (step, round,
purpose), so a seeded run reproduces and a step re-run after a resume draws what it drew before."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def mix_seed(*xs: int) -> int:
    """A seed in [0, 2^31) from several integers (FNV-style mixing): ``mix_seed(run_seed, step, k)``."""
    h = 1469598103934665603
    for x in xs:
        h = ((h ^ (x & 0xFFFFFFFF)) * 1099511628211) % 2**61
    return h % 2**31


CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's deterministic workspace setting: 8 buffers of 4 MiB per stream (NVIDIA's documented
values are ``:4096:8`` and ``:16:8``; the first keeps cuBLAS's speed, the second saves memory)."""


def deterministic_kernels(device: torch.device) -> list[str]:
    """``run.deterministic``: torch's deterministic algorithms and, on CUDA, what they need before
    CUDA starts: ``CUBLAS_WORKSPACE_CONFIG`` (cuBLAS reads it when it creates its first handle, and
    torch refuses a matrix product under deterministic mode without it), cuDNN's deterministic
    kernels and no autotuning. Returns what it costs, for the log. Raises when CUDA already started
    with a different workspace setting: this must run before anything touches the GPU."""
    notes = [
        "run.deterministic: torch.use_deterministic_algorithms(True): an operation with no "
        "deterministic kernel raises instead of running"
    ]
    if device.type == "cuda":
        import os

        have = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        if have not in (":4096:8", ":16:8"):
            if torch.cuda.is_initialized():
                raise RuntimeError(
                    "run.deterministic on CUDA needs CUBLAS_WORKSPACE_CONFIG set before CUDA starts, but CUDA "
                    f"is already initialised in this process (CUBLAS_WORKSPACE_CONFIG={have!r}): set "
                    f"CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE} in the environment that launches the run"
                )
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
            have = CUBLAS_WORKSPACE
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        notes.append(
            f"CUBLAS_WORKSPACE_CONFIG={have} (up to {8 * 4 if have == ':4096:8' else 8 * 16 // 1024} MiB "
            "of cuBLAS workspace per stream), cuDNN deterministic without autotuning: slower convolutions "
            "and attention backward kernels; scatter-add style reductions (index_add_, embedding "
            "backward) take slower deterministic paths"
        )
    torch.use_deterministic_algorithms(True)
    return notes
