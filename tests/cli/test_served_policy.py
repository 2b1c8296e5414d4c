"""``agentrl serve RUN_DIR`` serves the run's trained policy (issue 66, item 2): its newest checkpoint,
or the one ``--checkpoint step_N`` names, at that checkpoint's weight version; a LoRA run's adapter
merged into its base. Before, serve loaded the warm start (``build.policy_path``) and every reply
carried weight version 0. The policy choice and its engine are ``assembly/policy.py``'s, shared with
``agentrl eval``; the HTTP side is tests/rollout/test_agent_runner.py's."""

from __future__ import annotations

import pytest
import torch

from agentrl.assembly import make_trainer
from agentrl.assembly.policy import chosen_policy, policy_engine
from agentrl.config import ConfigError, load_config
from agentrl.models import load_policy
from tests.helpers.configs import small_config


def engine_state(engine) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in engine.model.state_dict().items()}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("served")
    cfg = small_config(
        tmp, tiny_model_dir, "trainer.total_steps=2", "trainer.checkpoint_every=1", "trainer.lr=1e-2"
    )
    trainer = make_trainer(cfg, log=lambda *_: None)
    trainer.train()
    return tmp / "run", {n: p.detach().clone() for n, p in trainer.model.state_dict().items()}


def test_a_run_directory_serves_its_newest_checkpoint_at_its_version(trained_run, tiny_model_dir):
    run, trained = trained_run
    cfg = load_config(str(run), [])
    policy = chosen_policy(str(run), None, cfg, "serving")
    assert (policy.label, policy.path) == ("step_2", str(run / "checkpoints" / "step_2"))
    engine, _ = policy_engine(cfg, policy)
    assert engine.version == 2  # the weight version the step-2 checkpoint's engine had
    served = engine_state(engine)
    assert all(torch.equal(served[n], trained[n]) for n in trained)  # the trained weights, not the start's
    start, _ = load_policy(tiny_model_dir)
    assert any(not torch.equal(served[n], t) for n, t in start.state_dict().items())


def test_checkpoint_chooses_one_by_its_step_and_a_wrong_one_lists_the_runs(trained_run):
    run, _ = trained_run
    cfg = load_config(str(run), [])
    policy = chosen_policy(str(run), "step_1", cfg, "serving")
    assert policy.path == str(run / "checkpoints" / "step_1")
    assert policy_engine(cfg, policy)[0].version == 1
    with pytest.raises(
        ConfigError, match=r"--checkpoint step_9: not a model directory.*\['step_1', 'step_2'\]"
    ):
        chosen_policy(str(run), "step_9", cfg, "serving")


def test_a_lora_run_serves_its_adapter_merged(tmp_path, tiny_model_dir):
    lora = ("trainer.total_steps=1", "trainer.checkpoint_every=1", "model.lora.rank=4", "trainer.lr=5e-2")
    cfg = small_config(tmp_path, tiny_model_dir, *lora)
    make_trainer(cfg, log=lambda *_: None).train()
    run = tmp_path / "run"
    policy = chosen_policy(str(run), None, load_config(str(run), []), "serving")
    assert policy.label == "step_1"
    engine, _ = policy_engine(load_config(str(run), []), policy)
    start, _ = load_policy(tiny_model_dir)
    served = engine_state(engine)
    moved = [n for n, t in start.state_dict().items() if not torch.equal(served[n], t)]
    assert moved and all(n.endswith("proj.weight") for n in moved)  # the adapted layers, merged


def test_a_config_file_serves_the_policy_it_starts_from(tmp_path, tiny_model_dir):
    cfg = small_config(tmp_path, tiny_model_dir)
    policy = chosen_policy(None, None, cfg, "serving")
    assert (policy.label, policy.path) == ("start", str(tiny_model_dir))
