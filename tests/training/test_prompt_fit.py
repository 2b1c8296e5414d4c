"""Issue 66, item 4: a 100k-character question killed the warm start with a 91 GB allocation, and
RL alone ran 6x slower saying nothing. Prompts that cannot fit an episode are now named before any
work, and the warm start leaves out the demonstrations that are too long, by name."""

from __future__ import annotations

import json
import re

import pytest

from agentrl.assembly.sft import build_examples
from agentrl.cli import main
from agentrl.config import load_config
from agentrl.training.prompt_fit import episode_limit, fitting_examples, model_context
from tests.helpers import ROOT

OWN = "configs/examples/own_data_cpu.yaml"  # short_cot on a data file, SFT on


def refused(tmp_path, capsys, *args: str, config: str = OWN) -> str:
    """``agentrl train CONFIG ARGS``'s error: it must exit 2 without creating the run directory."""
    run = tmp_path / "run"
    code = main(["train", str(ROOT / config), f"run.output_dir={run}", *args])
    err = capsys.readouterr().err
    assert code == 2 and not run.exists(), err
    return err


def test_a_question_that_cannot_fit_an_episode_is_named_before_any_work(tmp_path, capsys, tiny_model_dir):
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    rows[7]["question"] = "Please add these numbers. " + "1 + " * 25_000 + "1?"  # 100k characters
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    err = refused(tmp_path, capsys, f"data.path={path}", f"model.path={tiny_model_dir}", config=OWN)
    # the row is held out or trained on as the file's split falls: either split is checked
    found = re.search(r"data \((train|test) split\): 1 of \d+ task prompt\(s\) cannot fit an episode", err)
    assert found, err
    assert "which holds 256 tokens (rollout.max_episode_tokens=256)" in err, err
    assert f"'{found[1]}-7' (75012 tokens, 100028 characters)" in err, err
    assert "raise rollout.max_episode_tokens" in err and "Token indices" not in err
    rows[7]["question"] = "What is 7 + 1?"  # prompts that fit are never tokenized here, and pass
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main_check(path, tiny_model_dir) == []


def main_check(path, model_dir) -> list[str]:
    from agentrl.assembly.preflight import check_inputs
    from agentrl.config import ConfigError

    cfg = load_config(OWN, [f"data.path={path}", f"model.path={model_dir}", "sft.enabled=false"])
    try:
        check_inputs(cfg, train=True, test=True)
    except ConfigError as e:
        return e.problems
    return []


def test_the_models_context_limits_an_episode_below_max_episode_tokens(tiny_model_dir):
    assert model_context(str(tiny_model_dir)) == 8192 and model_context("org/not-here") is None
    assert episode_limit(20000, 8192) == (8192, "the model's context, under rollout.max_episode_tokens=20000")
    assert episode_limit(20000, None)[0] == 20000


def test_demonstrations_past_the_context_are_left_out_by_name_and_none_left_is_refused():
    short, long, huge = ([1] * 8, [0] * 8), ([1] * 11, [0] * 11), ([1] * 40, [0] * 40)
    logs: list[str] = []
    kept = fitting_examples(10, [short, huge, long], ["a", "task 'b'", "c"], 32, logs.append)
    assert kept == [short, long]
    assert logs == [
        "warning: SFT warm start: 1 demonstration(s) are longer than the model's context (32 tokens) and are "
        "left out: task 'b' (40 tokens)",
        "note: SFT warm start: 1 of 2 demonstrations are longer than an RL episode holds "
        "(rollout.max_episode_tokens=10): RL's episodes stop there",
    ]
    with pytest.raises(
        ValueError, match=r"all 1 demonstrations are longer than the model's context .* task 'b'"
    ):
        fitting_examples(10, [huge], ["task 'b'"], 32, logs.append)
    assert fitting_examples(10, [short, huge], ["a", "b"], None, logs.append) == [
        short,
        huge,
    ]  # context unknown


def test_a_huge_demonstration_in_a_demos_file_is_left_out_by_its_line(tmp_path, tiny_tokenizer):
    ok = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "\\boxed{4}"}]
    huge = [
        {"role": "user", "content": "1 + " * 25_000 + "1?"},
        {"role": "assistant", "content": "\\boxed{25001}"},
    ]
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps(d) + "\n" for d in (ok, huge, ok)))
    cfg = load_config(None, ["env.name=short_cot", "sft.enabled=true", f"sft.demos={demos}"])
    logs: list[str] = []
    examples = build_examples(cfg, tiny_tokenizer, logs.append, context=8192)
    assert len(examples) == 2
    assert any(f"left out: {demos} demonstration 2 (" in x for x in logs), logs
