"""bench/critical_weight.py: its network-level balance is the tabular one where the tabular picture
is exact (a policy with one free softmax per position, SGD on the logits), Adam's preconditioner
changes it, a real step's entropy change matches the first-order prediction as the step shrinks,
and the script runs end to end on the tiny model."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from agentrl.algorithms.entropy_theory import entropy_phi
from agentrl.algorithms.stare_balance import entropy_balance
from tests.helpers import ROOT
from tests.helpers.user_files import one_turn_env


def load():
    spec = importlib.util.spec_from_file_location("critical_weight", ROOT / "bench" / "critical_weight.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tabular_case(seed: int = 0, t: int = 40, v: int = 7):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(t, v, generator=g, dtype=torch.float64) * 1.5).requires_grad_()
    actions = torch.randint(0, v, (t,), generator=g)
    adv = torch.randn(t, generator=g, dtype=torch.float64)
    share = torch.rand(t, generator=g, dtype=torch.float64) / t
    l_pos = (adv > 0) & (torch.rand(t, generator=g) < 0.5)
    l_neg = (adv < 0) & (torch.rand(t, generator=g) < 0.5)
    return z, actions, adv, share, l_pos, l_neg


def tabular_grads(z, actions, adv, share, l_pos, l_neg):
    logp = torch.log_softmax(z, -1).gather(-1, actions[:, None]).squeeze(-1)
    ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)

    def grad(value):
        return torch.autograd.grad(value, z, retain_graph=True)[0].reshape(-1)

    coef = share * adv
    return (
        grad(ent.sum()),
        grad(-(coef * logp).sum()),
        grad(-(coef * l_pos * logp).sum()),
        grad(-(coef * l_neg * logp).sum()),
    )


def test_the_network_balance_of_a_tabular_policy_under_sgd_is_the_tabular_balance():
    bench = load()
    z, actions, adv, share, l_pos, l_neg = tabular_case()
    h, g1, gp, gn = tabular_grads(z, actions, adv, share, l_pos, l_neg)
    net = bench.network_balance(h, g1, gp, gn, None)
    tab = entropy_balance(
        entropy_phi(z.detach(), actions)[None], adv[None], share[None], l_pos[None], l_neg[None]
    )
    assert net.drive == pytest.approx(tab.drive, rel=1e-9)
    assert net.gain_pos == pytest.approx(tab.gain_pos, rel=1e-9)
    assert net.gain_neg == pytest.approx(tab.gain_neg, rel=1e-9)
    assert net.w_star == pytest.approx(tab.w_star, rel=1e-9)
    # a preconditioner that is not a multiple of the identity moves the balance
    p = bench.adam_preconditioner(g1.square())
    adam = bench.network_balance(h, g1, gp, gn, p)
    assert adam.drive != pytest.approx(net.drive * float(p.mean()), rel=1e-3)


def test_the_first_order_change_predicts_a_small_step():
    bench = load()
    z, actions, adv, share, l_pos, l_neg = tabular_case(seed=1)
    h, g1, gp, gn = tabular_grads(z, actions, adv, share, l_pos, l_neg)
    bal = bench.network_balance(h, g1, gp, gn, None)

    def entropy_after(lr, w):
        z2 = z.detach() - lr * (g1 + (w - 1.0) * gp).view_as(z)
        return float(-(torch.softmax(z2, -1) * torch.log_softmax(z2, -1)).sum())

    before = entropy_after(0.0, 1.0)
    for w in (1.0, 3.0):
        gaps = [
            abs(entropy_after(lr, w) - before - bench.first_order_change(bal, lr, w)) for lr in (1e-2, 1e-3)
        ]
        assert gaps[1] < gaps[0] / 50  # second order: the gap falls with the square of the step


@pytest.mark.slow
def test_the_script_runs_on_the_tiny_model(tmp_path, tiny_model_dir, monkeypatch):
    env = tmp_path / "varied_env.py"
    env.write_text(one_turn_env("critical_weight_varied"))
    out, png = tmp_path / "cw.json", tmp_path / "cw.png"
    task = (
        f"tiny=- model.path={tiny_model_dir} env.name=critical_weight_varied env.module={env} "
        f"run.output_dir={tmp_path / 'run'} rollout.max_tokens_per_turn=8 rollout.max_episode_tokens=96 "
        "data.num_train=16 trainer.micro_batch_size=8"
    )
    argv = ["critical_weight.py", "--task", task, "--groups", "1,2", "--repeats", "1", "--group-size", "4"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out), "--plot", str(png)])
    load().main()
    rows = json.loads(out.read_text())
    assert [(r["groups"], r["episodes"]) for r in rows] == [(1, 4), (2, 8)]
    for r in rows:
        assert r["tokens"] > 0 and 0 < r["T_mean"] <= 8
        assert [s["W"] for s in r["steps"]][:2] == [1.0, 1.1]
        assert all(isinstance(s["measured"], float) for s in r["steps"])
    assert png.stat().st_size > 1000
    lines = load().table(rows).splitlines()
    assert [ln.split(" | ")[:2] for ln in lines[2:]] == [["| tiny/warm", "1"], ["| tiny/warm", "2"]]
