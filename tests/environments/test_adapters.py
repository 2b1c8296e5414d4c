"""The reasoning-gym and TextArena adapters: their tasks, splits, rewards and errors, the packages'
own scoring, and a short training run through each (scripts/test.sh installs both extras)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from agentrl.assembly import make_trainer
from agentrl.cli import main
from agentrl.config import load_config
from agentrl.env import EpisodeState, make_env, registered
from agentrl.env.check import check_environment
from agentrl.episode import Episode
from agentrl.training.trainer import TrainingFailed
from tests.helpers import ROOT

needs_rg = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None,
    reason="reasoning-gym is not installed here: pip install 'agentrl[reasoning-gym]' (scripts/test.sh does)",
)
needs_ta = pytest.mark.skipif(
    importlib.util.find_spec("textarena") is None,
    reason="textarena is not installed here: pip install 'agentrl[textarena]' (scripts/test.sh does)",
)


def test_envs_list_shows_the_adapters(capsys):
    names = ("reasoning_gym", "reasoning_gym_python", "textarena", "openenv", "verifiers")
    assert set(names) <= set(registered())
    assert main(["envs", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in names)


@pytest.mark.parametrize(("module", "extra", "env", "options"), [
    ("reasoning_gym", "reasoning-gym", "reasoning_gym", {}), ("textarena", "textarena", "textarena", {}),
    ("openenv", "openenv", "openenv", {"url": "http://127.0.0.1:9"})])  # fmt: skip
def test_without_its_package_an_adapter_says_which_extra_to_install(monkeypatch, module, extra, env, options):
    from environments.adapters import reasoning_gym, textarena

    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")] or [module]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: "not installed" to import
    reasoning_gym._dataset.cache_clear()
    textarena.game_ids.cache_clear()
    with pytest.raises(ImportError, match=re.escape(f"pip install 'agentrl[{extra}]'")):
        make_env(env, **options)
    textarena.game_ids.cache_clear()


@pytest.mark.skipif(importlib.util.find_spec("verifiers") is not None, reason="verifiers is installed here")
def test_verifiers_outside_its_environment_says_how_to_get_one():
    with pytest.raises(ImportError, match=r"pins mcp==2\.0\.0.*scripts/test_verifiers\.sh --install"):
        make_env("verifiers", taskset="x")
    assert "test_verifiers.sh" in check_environment("verifiers").missing  # envs check --all skips it


def test_envs_check_all_skips_an_adapter_whose_package_is_missing(monkeypatch, capsys):
    import agentrl.env as env_mod
    from agentrl.env import registry
    from environments.adapters import textarena

    monkeypatch.setitem(sys.modules, "textarena", None)
    textarena.game_ids.cache_clear()
    some = {k: v for k, v in env_mod.registered().items() if k in ("calculator", "textarena")}
    monkeypatch.setattr(env_mod, "registered", lambda: some)  # what `agentrl envs` lists
    monkeypatch.setattr(registry, "registered", lambda: some)  # what make_env finds
    try:
        assert main(["envs", "check", "--all"]) == 0
        out = capsys.readouterr().out
        assert "environment 'calculator': OK" in out
        assert "environment 'textarena': SKIPPED: environment 'textarena' needs the textarena package" in out
        assert main(["envs", "check", "textarena"]) == 1  # named, it fails
        assert "pip install 'agentrl[textarena]'" in capsys.readouterr().out
    finally:
        textarena.game_ids.cache_clear()


# -- reasoning-gym --------------------------------------------------------------------------------
@needs_rg
def test_reasoning_gym_splits_are_disjoint_and_seeded():
    from environments.adapters.reasoning_gym import ReasoningGym

    opts = {"dataset": "chain_sum", "config": {"min_digits": 2, "max_digits": 3}}
    train = ReasoningGym.load_tasks("train", 300, seed=0, **opts)
    test = ReasoningGym.load_tasks("test", None, seed=0, **opts)
    assert len(train) == 300 and len(test) == 200
    assert not {t.prompt for t in train} & {t.prompt for t in test}
    assert [t.id for t in ReasoningGym.load_tasks("train", 300, seed=0, **opts)] == [t.id for t in train]
    other = ReasoningGym.load_tasks("train", 300, seed=1, **opts)
    assert [t.id for t in other] != [t.id for t in train]
    assert not {t.prompt for t in other} & {t.prompt for t in test}  # a held-out item never trains
    # the dataset's own config reached the generator: 2-3 digit terms only
    assert all(len(term) in (2, 3) for t in train for term in t.metadata["entry"]["metadata"]["expression"].replace("-", "+").split(" + "))  # fmt: skip


@needs_rg
def test_reasoning_gym_scores_with_its_own_score_answer():
    import reasoning_gym
    import reasoning_gym.utils

    env = make_env("reasoning_gym", dataset="countdown")
    task = env.load_tasks("train", 3, seed=0, dataset="countdown")[0]
    messages = env.reset(task, 0)
    assert "<answer>" in messages[0]["content"] and messages[-1]["content"] == task.prompt
    entry = task.metadata["entry"]
    own = reasoning_gym.create_dataset("countdown", size=10_000, seed=0)
    for text in (f"Let me think. <answer>{task.answer}</answer>", "<answer>1+1</answer>", "no answer at all"):
        _, _, done, _, info = env.step(text)
        state = EpisodeState(task, [*messages, {"role": "assistant", "content": text}], text, info)
        scores = {r.name: r.fn(task, state) for r in env.rewards()}
        extracted = reasoning_gym.utils.extract_answer(text)
        assert done and scores["score"] == own.score_answer(extracted, entry)
        assert scores["has_answer"] == float(extracted is not None)
    assert own.score_answer(task.answer, entry) == 1.0


@needs_rg
@pytest.mark.parametrize(("option", "said"), [
    ("env.options.dataset=chain_sun", "reasoning-gym has no dataset 'chain_sun'. Did you mean 'chain_sum'?"),
    ("env.options.config={min_term: 2}", "has no config key 'min_term' (did you mean 'min_terms'?)"),
    ("env.options.config={min_terms: 5, max_terms: 2}", "rejects config"),
])  # fmt: skip
def test_a_wrong_reasoning_gym_dataset_or_config_is_refused_before_the_run(
    tmp_path, capsys, tiny_model_dir, option, said
):
    run = tmp_path / "run"
    code = main(["train", str(ROOT / "configs/real/reasoning_gym_smollm2.yaml"), f"run.output_dir={run}",
                 f"model.path={tiny_model_dir}", "env.options.config={}", option])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and said in err, err
    assert not run.exists()


@needs_rg
@pytest.mark.parametrize("name", ["reasoning_gym", "reasoning_gym_python"])
def test_reasoning_gym_passes_envs_check(name):
    report = check_environment(name, {"dataset": "basic_arithmetic"})
    assert report.ok, report.problems
    assert any("built-in tasks load: 1000 train and 200 test" in p for p in report.passed)


@needs_rg
def test_env_and_data_options_that_disagree_are_named(tmp_path):
    from agentrl.assembly import components

    cfg = load_config(None, [f"run.output_dir={tmp_path}", "env.name=reasoning_gym", "env.options.dataset=chain_sum",
                             "data.options={dataset: countdown}"])  # fmt: skip
    said = "env.options.dataset='chain_sum' and data.options.dataset='countdown' disagree"
    with pytest.raises(ValueError, match=re.escape(said)):
        components.load_tasks(cfg, "train")


def _train(config: str, tmp_path, tiny_model_dir, *extra: str) -> list[Episode]:
    """Two steps of 2 x 2 episodes with the tiny model on ``config``. An untrained tiny model scores
    the same on every episode, so no step trains and the run must say so (as in test_families);
    everything before that verdict ran. Returns the recorded episodes."""
    cfg = load_config(ROOT / config, [f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'run'}",
                                      "trainer.total_steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2",
                                      "rollout.max_tokens_per_turn=8", "logging.tensorboard=false",
                                      "logging.plots=false", "algorithm.dynamic_sampling=false", *extra])  # fmt: skip
    with pytest.raises(TrainingFailed, match="no step trained"):
        make_trainer(cfg, log=lambda *_: None).train()
    episodes = [
        Episode.from_json(x) for x in (tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()
    ]
    assert sorted({e.step for e in episodes}) == [0, 1] and len(episodes) == 8
    return episodes


@needs_rg
@pytest.mark.slow
def test_reasoning_gym_config_runs_its_episodes(tmp_path, tiny_model_dir):
    episodes = _train("configs/real/reasoning_gym_smollm2.yaml", tmp_path, tiny_model_dir)
    assert all(e.failure is None and set(e.reward_components) == {"score", "has_answer"} for e in episodes)
    assert all(e.task_id.startswith("reasoning_gym:chain_sum-") for e in episodes)


# -- TextArena ------------------------------------------------------------------------------------
@needs_ta
def test_textarena_game_is_a_multi_turn_episode_with_the_games_outcome():
    env = make_env("textarena", game="Mastermind-v0")
    task = env.load_tasks("train", 2, seed=0, game="Mastermind-v0")[0]
    messages = env.reset(task, 0)
    assert "You are playing Mastermind" in messages[-1]["content"]
    obs, _, done, _, _ = env.step("I guess [1 2 3 4]")
    assert not done and obs[0]["role"] == "user" and "Feedback" in obs[0]["content"]
    assert "[1 2 3 4]" in obs[0]["content"] and "[Player]" not in obs[0]["content"]  # no echo of the move
    obs, _, done, _, _ = env.step("[1 2 3 4]")  # the same guess again: the game calls it invalid
    assert not done and "invalid move" in obs[0]["content"]
    _, _, done, _, info = env.step("no move at all")  # past the game's allowance: it ends the game
    assert done and info["game_info"]["invalid_move"] is True and 0.0 <= info["outcome"] <= 1.0
    state = EpisodeState(task, messages, "no move at all", info)
    assert {r.name: r.fn(task, state) for r in env.rewards()} == {"outcome": info["outcome"], "finished": 1.0}
    env.close()


@needs_ta
def test_textarena_seeds_split_and_a_won_game_scores_1():
    from environments.adapters.textarena import innermost

    train = make_env("textarena").load_tasks("train", 50, seed=0, game="GuessTheNumber-v0")
    test = make_env("textarena").load_tasks("test", 20, seed=0, game="GuessTheNumber-v0")
    assert not {t.metadata["game_seed"] for t in train} & {t.metadata["game_seed"] for t in test}
    env = make_env("textarena", game="GuessTheNumber-v0")
    env.reset(train[0], 0)
    secret = innermost(env._game).state.game_state["game_number"]
    _, _, done, _, info = env.step(f"[{secret}]")
    assert done and info["outcome"] == 1.0


@needs_ta
@pytest.mark.parametrize("game", ["Mastermind-v0", "GuessTheNumber-v0", "TowerOfHanoi-v0"])
def test_textarena_passes_envs_check(game):
    report = check_environment("textarena", {"game": game})
    assert report.ok, report.problems


@needs_ta
def test_a_wrong_textarena_game_is_refused_before_the_run(tmp_path, capsys, tiny_model_dir):
    run = tmp_path / "run"
    code = main(["train", str(ROOT / "configs/examples/textarena_cpu.yaml"), f"run.output_dir={run}",
                 f"model.path={tiny_model_dir}", "env.options.game=Mastermnd-v0"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "TextArena has no game 'Mastermnd-v0'. Did you mean 'Mastermind-v0'?" in err, err


@needs_ta
def test_wordle_without_nltks_word_list_is_refused_naming_it(monkeypatch, tmp_path):
    """TextArena's Wordle asks NLTK to download its word list on import; offline (simulated here
    by a download that fails, NLTK_DATA empty) the game cannot be made, and the adapter says so."""
    import nltk

    from environments.adapters import textarena

    monkeypatch.setattr(nltk, "download", lambda *a, **k: False)
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    for name in [m for m in sys.modules if m.startswith("textarena.envs.Wordle")]:
        monkeypatch.delitem(sys.modules, name)
    textarena.check_startable.cache_clear()
    try:
        with pytest.raises(
            ValueError, match=r"TextArena game 'Wordle-v0' .* cannot be made: LookupError.*words"
        ):
            make_env("textarena", game="Wordle-v0")
    finally:
        textarena.check_startable.cache_clear()


def _stand_in_nltk_data(root: Path, nouns: list[str]) -> None:
    """NLTK's ``words`` corpus and English POS tagger are downloads, not packages: a stand-in with
    ``nouns`` as the word lists and a tagger whose dictionary calls each of them a noun."""
    from nltk.tag.perceptron import PerceptronTagger

    corpus = root / "corpora" / "words"
    corpus.mkdir(parents=True)
    for fileid in ("en", "en-basic"):
        (corpus / fileid).write_text("\n".join(nouns) + "\n")
    tagger = PerceptronTagger(load=False)
    tagger.tagdict = dict.fromkeys(nouns, "NN")
    tagger.classes = {"NN"}
    out = root / "taggers" / "averaged_perceptron_tagger_eng"
    out.mkdir(parents=True)
    tagger.save_to_json(lang="eng", loc=str(out))


@needs_ta
def test_wordle_plays_through_the_adapter_on_stand_in_nltk_data(monkeypatch, tmp_path):
    """Wordle itself, unchanged, with stand-in NLTK data (the real word list and tagger cannot be
    fetched here): a bracketed guess gets TextArena's G/Y/X feedback as the next user turn, a word
    outside the dictionary is an invalid move the game reports, and the secret word wins (outcome 1)."""
    import nltk

    from environments.adapters import textarena
    from environments.adapters.textarena import innermost

    nouns = ["crane", "house", "plant", "stone", "bread"]
    monkeypatch.setattr(nltk, "download", lambda *a, **k: False)  # offline, as here
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])  # NLTK writes only inside a data root
    _stand_in_nltk_data(tmp_path, nouns)
    for name in [m for m in sys.modules if m.startswith("textarena.envs.Wordle")]:
        monkeypatch.delitem(sys.modules, name)
    textarena.check_startable.cache_clear()
    try:
        env = make_env("textarena", game="Wordle-v0")
        (task,) = env.load_tasks("train", 1, seed=0, game="Wordle-v0")
        first = env.reset(task, 0)
        assert "Wordle" in first[-1]["content"] and "[apple]" in first[-1]["content"]
        secret = innermost(env._game).state.game_state["secret_word"]
        assert secret in nouns
        obs, _, done, _, _ = env.step("[qqqqq]")
        assert not done and "'qqqqq' is not an English word" in obs[-1]["content"]
        wrong = next(w for w in nouns if w != secret)
        obs, reward, done, _, _ = env.step(f"My guess: [{wrong}]")
        assert not done and reward == 0.0
        feedback = obs[-1]["content"]  # without the echo of the move (Wordle sends it as the game's)
        assert feedback.startswith(f"You submitted [{wrong}].") and " ".join(wrong.upper()) in feedback
        marks = feedback.splitlines()[3].split()
        assert marks == ["G" if a == b else "Y" if a in secret else "X" for a, b in zip(wrong, secret)]
        obs, _, done, _, info = env.step(f"[{secret}]")
        assert done and info["outcome"] == 1.0, info
    finally:
        textarena.check_startable.cache_clear()


@needs_ta
@pytest.mark.slow
def test_a_game_that_raises_fails_its_episode_and_the_run_goes_on(tmp_path, tiny_model_dir, monkeypatch):
    from environments.adapters import textarena

    real = textarena.make_game
    calls = {"n": 0}

    def every_other_game_crashes(game, options=None):
        env = real(game, options)
        calls["n"] += 1
        if calls["n"] % 2 == 0:

            def explode(action):
                raise RuntimeError("the game crashed")

            env.step = explode
        return env

    monkeypatch.setattr(textarena, "make_game", every_other_game_crashes)
    episodes = _train("configs/examples/textarena_cpu.yaml", tmp_path, tiny_model_dir, "rollout.max_turns=3")
    failed = [e for e in episodes if e.failure is not None]
    assert len(failed) == 4, [e.failure for e in episodes]  # half the games, in both steps
    assert all(e.failure.boundary == "env" and "the game crashed" in e.failure.message for e in failed)
    assert all(set(e.reward_components) == {"outcome", "finished"} for e in episodes if e.failure is None)
