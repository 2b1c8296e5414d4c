"""Early stopping of the SFT warm start on held-out demonstrations (``sft.holdout``/``patience``),
and the pass@k curve the study reports."""

from __future__ import annotations

import pytest
import torch

from agentrl.training.sft import holdout_loss, sft_train


def _examples(answer_token: int, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt = torch.randint(5, 900, (8,), generator=g).tolist()
        out.append((prompt + [answer_token] * 4, [0] * 8 + [1] * 4))
    return out


def test_training_that_hurts_the_held_out_loss_stops_early_and_keeps_the_best(tiny_model_dir):
    """The training answers are one token, the held-out answers another: after at most a step or two
    of warm-up, training makes the held-out loss worse, so patience stops the run two evaluations
    after the lowest, and the weights kept are those of the lowest."""
    from agentrl.models import load_policy

    model, _ = load_policy(tiny_model_dir)
    train, held = _examples(17, 16, 0), _examples(23, 8, 1)
    res = sft_train(model, train, steps=100, lr=3e-3, batch_size=8, holdout=held, eval_every=5, patience=2)
    assert res.steps < 100 and len(res.losses) == res.steps
    best_step, best = min(res.holdout_losses, key=lambda x: x[1])
    assert res.best_step == best_step and res.steps == best_step + 2 * 5
    assert [n for n, _ in res.holdout_losses] == list(range(0, res.steps + 1, 5))
    assert res.holdout_losses[-1][1] > best
    assert holdout_loss(model, held, 8, 0) == pytest.approx(best, abs=1e-5)


def test_the_kept_weights_are_those_of_the_lowest_held_out_loss(tiny_model_dir):
    """Held-out answers like the training ones: the loss falls; the weights kept reproduce the lowest."""
    from agentrl.models import load_policy

    model, _ = load_policy(tiny_model_dir)
    train, held = _examples(17, 16, 0), _examples(17, 8, 1)
    res = sft_train(model, train, steps=12, lr=3e-3, batch_size=8, holdout=held, eval_every=4, patience=0)
    assert res.steps == 12 and [n for n, _ in res.holdout_losses] == [0, 4, 8, 12]
    best_step, best = min(res.holdout_losses, key=lambda x: x[1])
    assert res.best_step == best_step and best_step > 0
    assert holdout_loss(model, held, 8, 0) == pytest.approx(best, abs=1e-5)


def test_patience_or_eval_every_without_a_holdout_is_a_config_error():
    from agentrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"sft\.patience"):
        load_config("configs/quickstart.yaml", ["sft.patience=3"])
    with pytest.raises(ConfigError, match=r"sft\.eval_every=10 acts on the held-out loss"):
        load_config("configs/quickstart.yaml", ["sft.eval_every=10"])
    load_config("configs/quickstart.yaml", ["sft.patience=3", "sft.eval_every=10", "sft.holdout=0.1"])


def test_pass_at_k_curve_hand_values():
    from types import SimpleNamespace

    from agentrl.training.evaluation import pass_at_k_curve

    def ep(task: str, ok: bool) -> SimpleNamespace:
        return SimpleNamespace(
            task_id=task, failed=False, reward=float(ok), reward_components={"correct": float(ok)}
        )

    # task a: 1 of 4 correct; task b: 0 of 4; task c: 4 of 4
    eps = [ep("a", i == 0) for i in range(4)] + [ep("b", False) for _ in range(4)]
    eps += [ep("c", True) for _ in range(4)]
    curve = pass_at_k_curve(eps, 4)
    # pass@1 = (1/4 + 0 + 1) / 3; pass@2 for a: 1 - C(3,2)/C(4,2) = 1/2; pass@4 for a: 1
    assert curve[1] == pytest.approx((0.25 + 1) / 3)
    assert curve[2] == pytest.approx((0.5 + 1) / 3)
    assert curve[4] == pytest.approx(2 / 3)
    assert list(curve) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k_curve(eps, 5)
