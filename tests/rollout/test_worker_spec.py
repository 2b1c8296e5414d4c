"""A rollout worker is built from a ``WorkerSpec`` of plain values, not the config: the spec pickles,
and a worker built from it runs episodes in a fresh Python process that never imported the module
defining the trainer's method (the config itself cannot even be unpickled there) nor agentrl.config."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys

import pytest

from agentrl.algorithms import METHODS, WEIGHTINGS
from agentrl.assembly import components
from agentrl.rollout.runner import EpisodeRequest
from tests.helpers import ROOT
from tests.helpers.configs import small_config

PLUGIN = "agentrl_test_plugin_method"
"""The module name the plugin file is imported under here; no other process can import it."""

PLUGIN_SOURCE = '''
from dataclasses import dataclass

from agentrl.algorithms import TokenWeighting, TokenWeights, register_weighting
from agentrl.dataclass_tree import knob


@dataclass
class FlatSettings:
    scale: float = knob(1.0, gt=0)
    """The weight of every policy token."""


def flat_weights(inputs, *, scale):
    """Every policy token weighs ``scale``."""
    return TokenWeights(inputs.mask * scale, inputs.mask)


register_weighting(TokenWeighting("plugin_flat", flat_weights, settings=FlatSettings,
                                  arguments=lambda s, step: {"scale": s.scale}))
'''

WORKER = """
import json, pickle, sys

spec, requests, config_blob = pickle.load(open(sys.argv[1], "rb"))
from agentrl.rollout.ray_worker import RolloutWorker

worker = RolloutWorker(spec)
episodes = worker.run(requests, seed=None, override=None)
answer = {
    "episodes": [[e.failure is None, e.token_ids()] for e in episodes],
    "plugin": sys.argv[2] in sys.modules,
    "config": "agentrl.config" in sys.modules,
}
try:  # what a worker handed the config would meet
    pickle.loads(config_blob)
    answer["config_error"] = None
except Exception as e:
    answer["config_error"] = repr(e)
print(json.dumps(answer))
"""

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture
def plugin_config(tmp_path, tiny_model_dir):
    """A run whose method is defined in a file that only this process imported."""
    path = tmp_path / "plugin_method.py"
    path.write_text(PLUGIN_SOURCE)
    spec = importlib.util.spec_from_file_location(PLUGIN, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[PLUGIN] = module
    spec.loader.exec_module(module)
    cfg = small_config(
        tmp_path,
        tiny_model_dir,
        "env.name=countdown",
        "algorithm.name=plugin_flat",
        "algorithm.plugin_flat.scale=0.5",
        "rollout.max_tokens_per_turn=6",
    )
    yield cfg
    del sys.modules[PLUGIN], WEIGHTINGS["plugin_flat"], METHODS["plugin_flat"]


def test_a_worker_spec_pickles_to_an_equal_spec(plugin_config, tiny_model_dir):
    spec = components.worker_spec(plugin_config, str(tiny_model_dir))
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert spec.engine.model_path == spec.model_path == str(tiny_model_dir)
    assert spec.env.name == "countdown" and spec.runner_kind == "lockstep" and spec.endpoint is None
    assert spec.runner.budgets.max_tokens_per_turn == 6 and spec.runner.sampling.seed is None


def test_a_worker_from_a_spec_runs_where_the_plugin_was_never_imported(
    plugin_config, tmp_path, tiny_model_dir
):
    cfg, path = plugin_config, str(tiny_model_dir)
    assert type(cfg.algorithm.settings["plugin_flat"]).__module__ == PLUGIN
    tasks = components.load_tasks(cfg, "train")[:2]
    requests = [EpisodeRequest(t, seed=i, group=t.id) for i, t in enumerate(tasks)]
    spec = components.worker_spec(cfg, path)
    blob = tmp_path / "payload.pkl"
    blob.write_bytes(pickle.dumps((spec, requests, pickle.dumps(cfg))))
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(blob), PLUGIN],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["plugin"] is False and answer["config"] is False
    # the config itself cannot be unpickled there: its method's settings class lives in the plugin
    assert answer["config_error"] == f"ModuleNotFoundError(\"No module named '{PLUGIN}'\")"

    # the same episodes as this process's engine and runner, built from the config, sample
    engine = components.local_engine(cfg, None, components.load_run_tokenizer(cfg, path), path)
    runner = components.local_runner(cfg, engine, engine.tokenizer)
    try:
        here = runner.run(requests)
    finally:
        runner.close()
    assert answer["episodes"] == [[e.failure is None, e.token_ids()] for e in here]
    assert all(ok for ok, _ in answer["episodes"])


def test_evaluation_samples_at_eval_temperature_and_top_p_and_training_at_the_rollouts(
    tmp_path, tiny_model_dir, tiny_tokenizer
):
    from agentrl.assembly import build, evaluate
    from agentrl.engines.scripted import ScriptedEngine

    cfg = small_config(
        tmp_path,
        tiny_model_dir,
        "env.name=countdown",
        "rollout.max_episode_tokens=1024",  # room for countdown's prompt
        "rollout.temperature=0.9",
        "rollout.top_p=0.95",
        "eval.temperature=0.6",
        "eval.top_p=0.7",
    )
    tasks = components.load_tasks(cfg, "test")[:2]
    engine = ScriptedEngine(lambda prompt, i: "\\boxed{1}<|im_end|>", tokenizer=tiny_tokenizer)
    _, episodes = evaluate(cfg, engine, tiny_tokenizer, tasks, k=2)
    assert [e.failure for e in episodes] == [None] * 4
    assert {(p.temperature, p.top_p) for _, p in engine.calls} == {(0.6, 0.7)}
    assert len(engine.calls) == 4
    engine.calls.clear()
    runner = build.build_runner(cfg, engine, tiny_tokenizer, seed=1)  # the collector's: no override
    runner.run([EpisodeRequest(t, seed=i, group=t.id) for i, t in enumerate(tasks)])
    assert {(p.temperature, p.top_p) for _, p in engine.calls} == {(0.9, 0.95)}
