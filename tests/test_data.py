"""Dataset adapters on small local files written in the public schemas (tests/data, made by
tests/data/make_fixtures.py): the hub path is the same code with ``source="hub"``."""

from pathlib import Path

import pytest

from agentrl.data import load_tasks_from_source
from agentrl.env import EpisodeState
from environments.math_equiv import is_equivalent
from environments.short_cot import ShortCoT

DATA = Path(__file__).parent / "data"


def load(name, **kw):
    return load_tasks_from_source("file", str(DATA / name), **kw)


def test_gsm8k():
    tasks = load("gsm8k.jsonl", adapter="gsm8k")
    assert [t.answer for t in tasks] == ["31", "1200", "60"]  # "#### 1,200" loses its comma
    assert tasks[0].id == "gsm8k-train-0" and tasks[0].prompt.startswith("A box holds 12 pens")
    assert "<<3*12=36>>" in tasks[0].metadata["solution"]


def test_math500():
    tasks = load("math500.jsonl", adapter="math500")
    assert [t.id for t in tasks] == ["test/prealgebra/1.json", "test/algebra/2.json", "test/algebra/3.json"]
    assert (
        tasks[1].answer == "2\\sqrt{2}"
        and tasks[1].metadata["subject"] == "Algebra"
        and tasks[1].metadata["level"] == 2
    )


@pytest.mark.parametrize(
    ("file", "ids", "answers"),
    [
        ("aime2024.jsonl", ["aime-2024-I-1", "aime-2024-I-2"], ["1", "24"]),  # ID/Problem/Answer (ints)
        ("aime2025.jsonl", ["aime-0", "aime-1"], ["33", "24"]),  # id/problem/answer ("033" -> "33")
        ("aime2025_question.jsonl", ["aime-0", "aime-1"], ["42", "99"]),  # question/answer only
    ],
)
def test_aime_variants(file, ids, answers):
    tasks = load(file, adapter="aime")
    assert [t.id for t in tasks] == ids and [t.answer for t in tasks] == answers
    assert all(t.prompt for t in tasks)


def test_dapo_math_parquet():
    tasks = load("dapo_math.parquet", adapter="dapo_math")
    assert [t.answer for t in tasks] == ["81", "8", "51"]
    assert tasks[0].prompt == "What is $3^4$?"  # DAPO's "Answer:" instructions stripped
    assert tasks[0].id == "dapo-00000000-0000-0000-0000-000000000000"
    assert tasks[0].metadata["data_source"] == "math_dapo"
    kept = load("dapo_math.parquet", adapter="dapo_math", keep_instructions=True)
    assert (
        kept[0].prompt.startswith("Solve the following math problem") and "What is $3^4$?" in kept[0].prompt
    )


def test_generic_columns_mapping():
    tasks = load(
        "generic.jsonl", adapter="jsonl", columns={"id": "uid", "prompt": "query", "answer": "target"}
    )
    assert [(t.id, t.prompt, t.answer) for t in tasks] == [
        ("q1", "What is 2+2?", "4"),
        ("q2", "What is 3*3?", "9"),
    ]
    assert tasks[0].metadata == {"difficulty": "easy"}  # unmapped columns become metadata


def test_generic_dotted_paths_reach_nested_columns():
    cols = {"id": "extra_info.index", "prompt": "prompt", "answer": "reward_model.ground_truth"}
    tasks = load("dapo_math.parquet", columns=cols)  # auto + columns -> the generic adapter
    assert tasks[2].answer == "51" and tasks[2].prompt.startswith("Solve the following")


@pytest.mark.parametrize(
    ("file", "expected"),
    [("gsm8k.jsonl", "31"), ("math500.jsonl", "\\frac{5}{6}"), ("aime2024.jsonl", "1"), ("aime2025_question.jsonl", "42"),
     ("dapo_math.parquet", "81")],
)  # fmt: skip
def test_auto_detects_the_adapter(file, expected):
    assert load(file)[0].answer == expected


def test_subsample_is_seeded_and_keeps_file_row_ids():
    a = load("gsm8k.jsonl", n=2, seed=1)
    assert a == load("gsm8k.jsonl", n=2, seed=1)
    assert len(a) == 2 and {t.id for t in a} <= {"gsm8k-train-0", "gsm8k-train-1", "gsm8k-train-2"}
    all_ids = {tuple(t.id for t in load("gsm8k.jsonl", n=2, seed=s)) for s in range(8)}
    assert len(all_ids) > 1  # different seeds, different subsets


def test_split_placeholder_in_path():
    tasks = load_tasks_from_source("file", str(DATA / "{split}.jsonl"), split="gsm8k", adapter="gsm8k")
    assert tasks[0].id == "gsm8k-gsm8k-0"


def test_errors_are_explicit():
    with pytest.raises(ValueError, match="unknown adapter"):
        load("gsm8k.jsonl", adapter="gsm9k")
    with pytest.raises(ValueError, match="columns"):
        load("gsm8k.jsonl", adapter="gsm8k", columns={"prompt": "question"})
    with pytest.raises(FileNotFoundError):
        load("missing.jsonl")
    with pytest.raises(ValueError, match="source"):
        load_tasks_from_source("ftp", "x.jsonl")
    with pytest.raises(KeyError, match="score"):
        load("generic.jsonl", columns={"id": "uid", "prompt": "query", "answer": "score"})


@pytest.mark.parametrize("file", ["gsm8k.jsonl", "math500.jsonl"])
def test_dataset_solutions_become_verified_demonstrations(file):
    tasks = load(file)
    env = ShortCoT()
    for task, demo in zip(tasks, ShortCoT.demonstrations(tasks)):
        text = demo[-1]["content"]
        assert "<<" not in text and "####" not in text
        info = env.step(text).info
        state = EpisodeState(task, demo, text, info)
        assert all(r.fn(task, state) == 1.0 for r in env.rewards()), (task.answer, text)
        assert is_equivalent(info["answer"], task.answer)


def test_hub_names_go_to_load_dataset_with_config_and_split(monkeypatch):
    # the hub is unreachable here: check the call we make, and that its rows go through the adapter
    import datasets

    calls = []

    def fake_load_dataset(name, config=None, split=None, **kw):
        calls.append((name, config, split))
        return datasets.Dataset.from_list([{"question": "What is 1+1?", "answer": "1+1=2\n#### 2"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    tasks = load_tasks_from_source("hub", "openai/gsm8k:main", split="test")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert tasks[0].id == "gsm8k-test-0" and tasks[0].answer == "2"
