"""The verifiers adapter with verifiers 0.4.0 itself, in .venv-verifiers (scripts/test_verifiers.sh;
verifiers pins mcp==2.0.0, so it cannot live in .venv): a verifiers taskset's tasks and splits, and
training runs whose episodes go through verifiers' ``Env.run_episode``, its interception server and
agentrl's endpoint, scored by the taskset's own rewards; a taskset whose scoring raises fails those
episodes at ``agent`` and the run goes on."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys

import pytest

from agentrl.assembly import make_trainer
from agentrl.config import load_config
from agentrl.env import make_env
from agentrl.episode import Episode
from agentrl.training.trainer import TrainingFailed
from tests.helpers import ROOT

pytestmark = [
    pytest.mark.verifiers,
    pytest.mark.skipif(
        importlib.util.find_spec("verifiers") is None,
        reason="verifiers is not installed here: it runs in .venv-verifiers (bash scripts/test_verifiers.sh)",
    ),
]
TASKSET = "agentrl_test_sums"  # verifiers imports a taskset by a top-level module name
COUNTING = "agentrl_test_counting"  # an infinite one


@pytest.fixture(autouse=True)
def taskset(monkeypatch):
    monkeypatch.setitem(sys.modules, TASKSET, importlib.import_module("tests.helpers.vf_taskset"))
    monkeypatch.setitem(sys.modules, COUNTING, importlib.import_module("tests.helpers.vf_counting"))


def test_the_tasksets_tasks_split_by_id_and_seed():
    env = make_env("verifiers", taskset=TASKSET)
    train = env.load_tasks("train", None, 0, taskset=TASKSET)
    test = env.load_tasks("test", None, 0, taskset=TASKSET)
    assert len(train) + len(test) == 36 and not {t.id for t in train} & {t.id for t in test}
    assert {t.prompt for t in train} | {t.prompt for t in test} == {
        f"What is {a} + {b}?" for a in range(1, 7) for b in range(1, 7)
    }
    assert [t.id for t in env.load_tasks("train", 5, 1, taskset=TASKSET)] != [t.id for t in train[:5]]
    with pytest.raises(ValueError, match="fewer than the 100 asked for"):
        env.load_tasks("test", 100, 0, taskset=TASKSET)


def test_an_infinite_taskset_draws_what_the_split_asks_for_and_its_tasks_are_found():
    """A generator taskset (TextArena's is one) is read only as far as needed: ``n`` tasks of the
    split, from the ``seed · n``-th on; without ``n`` it is refused instead of read forever."""
    from environments.adapters.verifiers import env_config, task_list

    env = make_env("verifiers", taskset=COUNTING)
    first = env.load_tasks("train", 4, 0, taskset=COUNTING)
    second = env.load_tasks("train", 4, 1, taskset=COUNTING)
    test = env.load_tasks("test", 4, 0, taskset=COUNTING)
    ids = [t.id for t in first + second + test]
    assert len(set(ids)) == 12  # disjoint seeds, disjoint splits
    config = json.dumps(env_config(COUNTING, None, "agentrl_chat"), sort_keys=True)
    for t in first + second + test:  # what an episode looks up by index
        index = t.metadata["vf_index"]
        assert t.prompt == f"What is {index} + 1?" == task_list(config).get(index).data.prompt
    with pytest.raises(ValueError, match=r"infinite taskset: set data\.num_train and data\.num_test"):
        env.load_tasks("train", None, 0, taskset=COUNTING)


def _train(tmp_path, tiny_model_dir) -> list[Episode]:
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'run'}", "env.name=verifiers",
        f"env.options.taskset={TASKSET}", "trainer.total_steps=2", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "rollout.max_tokens_per_turn=8", "logging.tensorboard=false",
        "logging.plots=false", "algorithm.dynamic_sampling=false", "sft.enabled=false",
        "trainer.max_failed_fraction=1.0"])  # fmt: skip
    with pytest.raises(TrainingFailed, match="no step trained"):  # the untrained tiny model never sums
        make_trainer(cfg, log=lambda *_: None).train()
    lines = (tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()
    episodes = [Episode.from_json(x) for x in lines]
    assert len(episodes) == 8 and sorted({e.step for e in episodes}) == [0, 1]
    return episodes


def test_episodes_run_through_verifiers_and_the_endpoint(tmp_path, tiny_model_dir):
    episodes = _train(tmp_path, tiny_model_dir)
    for e in episodes:
        assert e.failure is None and e.reward_components == {"agent": 0.0}
        prompt, policy = e.segments[0], next(s for s in e.segments if s.role == "policy")
        assert "Answer with the number." in prompt.text and "What is " in prompt.text  # the taskset's own
        assert 0 < len(policy.token_ids) <= 8 and len(policy.logprobs) == len(policy.token_ids)


def test_a_taskset_whose_scoring_raises_fails_its_episodes_and_the_run_goes_on(
    tmp_path, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv("AGENTRL_TEST_VF_RAISE", "1")  # the taskset's metric raises
    episodes = _train(tmp_path, tiny_model_dir)  # both steps ran (max_failed_fraction=1.0)
    for e in episodes:
        assert e.failure is not None and e.failure.boundary == "agent", e.failure
        assert "verifiers episode" in e.failure.message and "fell over" in e.failure.message


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    """openenv's own ``openenv init`` template (the echo environment), served on 127.0.0.1."""
    import subprocess

    pytest.importorskip("openenv", reason="verifiers' openenv extra is not installed here")
    from environments.adapters.openenv_servers import AppServer

    out = tmp_path_factory.mktemp("openenv")
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env", "-o", str(out)],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    server = AppServer("server.app:app", str(out / "echo_env"), timeout_s=60)
    yield server.url
    server.close()


def test_verifiers_own_openenv_taskset_trains_unchanged(tmp_path, tiny_model_dir, echo_server):
    """configs/examples/verifiers_openenv_cpu.yaml. Neither side is ours: verifiers' bundled
    ``openenv`` taskset and env, stepping openenv's echo template (0.1 per character echoed, never done). Its seat is ``player``, not ``agent``; the
    run's turn budget (3) ends each exchange, and the steps taken are still scored."""
    cfg = load_config(ROOT / "configs/examples/verifiers_openenv_cpu.yaml", [
        f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'run'}",
        f"env.options.config.taskset.base_url={echo_server}", "trainer.total_steps=1",
        "rollout.max_tokens_per_turn=8", "logging.tensorboard=false", "logging.plots=false",
        "algorithm.dynamic_sampling=false"])  # fmt: skip
    make_trainer(cfg, log=lambda *_: None).train()
    lines = (tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()
    episodes = [Episode.from_json(x) for x in lines]
    assert len(episodes) == 4
    for e in episodes:
        assert e.failure is None and e.stop_reason == "max_turns", (e.failure, e.stop_reason)
        replies = [s for s in e.segments if s.role == "policy"]
        observations = [json.loads(s.text)["observation"] for s in e.segments if s.role == "env"]
        assert len(replies) == 3 and len(observations) == 2  # the third reply was stepped, not answered
        assert [o["echoed_message"] for o in observations] == [r.text.strip() for r in replies[:2]]
        seen = 0.1 * sum(o["message_length"] for o in observations)
        # the reward counts the third step too: the budget's end did not drop the steps taken
        assert seen < e.reward_components["agent"] <= seen + 0.1 * len(replies[2].text.strip()) + 1e-6
