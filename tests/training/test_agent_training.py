"""An OpenAI-client agent trained with STARE through the endpoint: its tokens reweighted and the
model's weights changed; then inspected token by token."""

from __future__ import annotations

import json

import torch

from agentrl.assembly import make_trainer
from agentrl.config import load_config
from agentrl.episode import Episode
from agentrl.views.replay import replay_command
from agentrl.views.viewer.page import build_data
from tests.helpers import HELPERS
from tests.helpers.jsonl import lines


def test_an_openai_agent_trains_with_stare_and_its_episodes_can_be_inspected(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "env.name=test_arithmetic_agent",
            f"env.module={HELPERS / 'agent_envs.py'}",
            f"run.output_dir={run_dir}",
            "run.device=cpu",
            "algorithm.name=stare",
            "algorithm.dynamic_sampling=false",
            "algorithm.stare.target_entropy=100",  # above any entropy: the gate is on from step 0
            "trainer.total_steps=2",
            "rollout.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.max_turns=2",
            "rollout.max_tokens_per_turn=12",
            "logging.tensorboard=false",
            "logging.plots=false",
        ],
    )
    trainer = make_trainer(cfg, log=lambda *_: None)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "two STARE updates changed no parameter"
    episodes = [Episode.from_json(x) for x in lines(run_dir / "transcripts.jsonl")]
    assert len(episodes) == 2 * 2 * 4 and {e.env for e in episodes} == {"test_arithmetic_agent"}
    assert all(e.failure is None for e in episodes), [e.failure for e in episodes if e.failure]
    assert all(e.segments[0].role == "prompt" and e.num_policy_tokens > 0 for e in episodes)
    assert all(e.reward_components.keys() == {"agent"} for e in episodes)
    rows = [json.loads(x) for x in lines(run_dir / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1] and all("loss/pg_loss" in r for r in rows)
    assert any("stare/gate" in k or k.startswith("stare/") for k in rows[0])
    trained = [e for e in episodes if e.overlays and any(x is not None for x in e.overlays["weight"])]
    assert trained, "no episode carries the update's per-token overlays"
    assert all(len(e.overlays["weight"]) == len(e.token_ids()) for e in trained)
    weights = [w for e in trained for w in e.overlays["weight"] if w is not None]
    assert any(w != 1.0 for w in weights), "STARE reweighted no token: every weight is 1"
    # inspect: the viewer's data and the terminal replay read the agent's episodes
    data = build_data(str(run_dir))
    assert len(data["episodes"]) == len(episodes)
    assert replay_command(str(run_dir), step=0, limit=2) == 0
