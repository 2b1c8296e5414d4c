"""Off-policy guards: truncated IS weights, the mismatch monitor, weight-version lag; the trainer
with ``algorithm.is_correction=tis``."""

from __future__ import annotations

import math

import torch

from agentrl.episode import Episode, Segment
from agentrl.training.offpolicy import MismatchMonitor, tis_weights, too_stale, version_lag
from tests.helpers.configs import small_config


def test_tis_weights_by_hand():
    old = torch.tensor([[-1.0, -2.0, -0.5, -0.5]])
    rollout = torch.tensor([[-1.0, -1.0, -2.0, -9.0]])
    has = torch.tensor([[True, True, True, False]])
    w = tis_weights(old, rollout, has, cap=2.0)
    # exp(0) = 1; exp(-1) = 0.36788; exp(1.5) = 4.48 capped at 2; no rollout logprob -> 1
    assert torch.allclose(w, torch.tensor([[1.0, math.exp(-1.0), 2.0, 1.0]]), atol=1e-6)
    old.requires_grad_(True)
    assert not tis_weights(old, rollout, has, 2.0).requires_grad


def test_mismatch_monitor_warns_on_a_jump_only():
    m = MismatchMonitor(factor=3.0, min_history=3)
    assert [m.update(v) for v in (0.010, 0.012, 0.011)] == [None, None, None]  # too little history
    assert m.update(0.030) is None  # median 0.0115 -> threshold 0.0345
    warning = m.update(0.050)  # median of (.010, .012, .011, .030) = 0.0115; 0.05 > 0.0345
    assert warning is not None and "jumped" in warning
    quiet = MismatchMonitor()
    assert all(quiet.update(v) is None for v in (0, 0, 0, 2e-4, 0))  # below the floor: rounding noise


def _episode(versions: list[int]) -> Episode:
    ep = Episode(id="e", env="x", task_id="t", seed=0)
    ep.add(Segment("prompt", 0, [1, 2], "ab"))
    for turn, v in enumerate(versions):
        ep.add(Segment("policy", turn, [3], "c", [-0.5], v))
        ep.add(Segment("tool", turn + 1, [4], "d"))
    return ep


def test_version_lag_and_staleness():
    eps = [_episode([5, 6]), _episode([7]), _episode([])]
    assert [version_lag(e, 7) for e in eps] == [2, 0, 0]  # the oldest policy token counts
    assert too_stale(eps, 7, max_lag=1) == [True, False, False]
    assert too_stale(eps, 7, max_lag=2) == [False, False, False]


def test_trainer_step_with_tis(tmp_path, tiny_model_dir):
    from agentrl.assembly import make_trainer

    cfg = small_config(
        tmp_path,
        tiny_model_dir,
        "algorithm.is_correction=tis",
        "algorithm.is_cap=2.0",
        "trainer.total_steps=1",
    )
    out = make_trainer(cfg, log=lambda *_: None).train_step(0)
    m = out.metrics
    # float32 engine and trainer with the same weights: the mismatch is rounding, so the weights are ~1
    assert m["mismatch/abs_logp_mean"] < 1e-4
    assert abs(m["offpolicy/tis_mean"] - 1.0) < 1e-4 and m["offpolicy/tis_capped_frac"] == 0.0
    assert m["offpolicy/stale_dropped"] == 0.0 and m["offpolicy/version_lag_max"] == 0.0
