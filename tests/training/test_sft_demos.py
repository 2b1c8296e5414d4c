"""Which tasks SFT demonstrations are made from (``sft.exclude_train_seeds``)."""

from __future__ import annotations

import pytest

from agentrl.assembly.build import warm_start_key
from agentrl.assembly.components import load_tasks
from agentrl.assembly.sft import demo_tasks
from agentrl.config import load_config


def test_default_demonstrations_come_from_the_sft_seeds_training_tasks():
    cfg = load_config("configs/short_cot_cpu.yaml", ["sft.seed=0"])
    assert [t.prompt for t in demo_tasks(cfg)] == [t.prompt for t in load_tasks(cfg, "train", seed=0)]


def test_excluded_seeds_training_prompts_never_reach_the_demonstrations():
    cfg = load_config("configs/short_cot_cpu.yaml", ["sft.seed=0", "sft.exclude_train_seeds=[0,1,2]"])
    taken = {t.prompt for s in (0, 1, 2) for t in load_tasks(cfg, "train", seed=s)}
    demos = demo_tasks(cfg)
    assert len(demos) > 100 and not any(t.prompt in taken for t in demos)
    # the warm start built this way is cached apart from the default one; the default key is unchanged
    plain = load_config("configs/short_cot_cpu.yaml", ["sft.seed=0"])
    assert warm_start_key(cfg, "base") != warm_start_key(plain, "base")
    assert warm_start_key(plain, "base") == warm_start_key(
        load_config("configs/short_cot_cpu.yaml", ["sft.seed=0", "sft.exclude_train_seeds=[]"]), "base"
    )


def test_exclusion_that_leaves_nothing_is_an_error():
    # 2x1-digit multiplication: 600 training tasks per seed cover the small space
    cfg = load_config("configs/long_cot_cpu.yaml", ["sft.exclude_train_seeds=[0,1,2]"])
    with pytest.raises(ValueError, match="problem space is too small"):
        demo_tasks(cfg)


def test_a_demonstration_file_in_the_wrong_format_names_the_line(tmp_path):
    import pytest

    from agentrl.config import ConfigError, load_config

    good = '[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "\\\\boxed{4}"}]\n'
    cases = {
        '{"prompt": "2+2?", "completion": "4"}\n': "line 2: an object with keys ['completion', 'prompt'] but no 'messages'",
        "not json\n": "line 2: not JSON",
        '[{"role": "user", "text": "hi"}]\n': "line 2: message 0 is \"{'role': 'user', 'text': 'hi'}\"",
    }
    for bad, message in cases.items():
        path = tmp_path / "demos.jsonl"
        path.write_text(good + bad)
        with pytest.raises(ConfigError) as e:
            load_config(None, ["sft.enabled=true", f"sft.demos={path}"])
        assert message in str(e.value) and "expected one conversation per line" in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="no such file"):
        load_config(None, ["sft.enabled=true", f"sft.demos={tmp_path / 'missing.jsonl'}"])


def test_too_few_tasks_for_num_demos_is_said(tiny_tokenizer):
    from agentrl.assembly.sft import build_examples
    from agentrl.config import load_config

    logs: list[str] = []
    cfg = load_config(None, ["env.name=calculator", "data.num_train=5", "sft.num_demos=20"])
    examples = build_examples(cfg, tiny_tokenizer, logs.append)
    assert len(examples) == 20
    assert any("sft.num_demos=20 but only 5 training tasks" in x and "4.0 times" in x for x in logs), logs


def test_a_larger_pool_keeps_more_demonstration_tasks_off_rls():
    over = ["sft.seed=0", "sft.exclude_train_seeds=[0,1,2]"]
    small = demo_tasks(load_config("configs/study/tool_use.yaml", [*over, "sft.num_tasks=null"]))
    cfg = load_config("configs/study/tool_use.yaml", over)
    large = demo_tasks(cfg)
    taken = {t.prompt for s in (0, 1, 2) for t in load_tasks(cfg, "train", seed=s)}
    assert cfg.sft.num_tasks == 1600 and len(large) > 1000 > 200 >= len(small)
    assert not any(t.prompt in taken for t in large)
    assert warm_start_key(cfg, "base") != warm_start_key(
        load_config("configs/study/tool_use.yaml", [*over, "sft.num_tasks=1200"]), "base"
    )


def test_the_calculator_teacher_is_diverse_and_always_right():
    from environments.calculator import Calculator, safe_eval

    tasks = Calculator.load_tasks("train", n=200, seed=0, n_operands=2, max_value=30, teacher="diverse")
    demos = Calculator.demonstrations(tasks, seed=0)
    calls, answers = set(), set()
    for task, demo in zip(tasks, demos):
        call, result, answer = demo[2]["content"], demo[3]["content"], demo[4]["content"]
        expr = call.split('"expression": "')[1].split('"')[0]
        assert safe_eval(expr) == task.answer and result == str(task.answer)
        assert answer.count(f"\\boxed{{{task.answer}}}") == 1
        asked = task.metadata["expression"]
        sentence = call.split("<tool_call>")[0].replace(asked, "E")
        calls.add((sentence, " " in expr, expr.replace(" ", "") == asked.replace(" ", "")))
        answers.add(answer.replace(asked, "E").replace(str(task.answer), "N"))
    assert len(calls) == 12 and len(answers) == 4  # 3 sentences x spacing x order; 4 phrasings


def test_the_default_calculator_teacher_says_one_thing_and_a_bad_teacher_is_named():
    from environments.calculator import Calculator

    tasks = Calculator.load_tasks("train", n=50, seed=0, n_operands=2, max_value=30)
    for task, demo in zip(tasks, Calculator.demonstrations(tasks, seed=0)):
        assert demo[2]["content"].startswith("<tool_call>")
        assert demo[4]["content"] == f"The answer is \\boxed{{{task.answer}}}."
    with pytest.raises(ValueError, match="teacher='wise'; valid: one, diverse"):
        Calculator.load_tasks("train", n=5, teacher="wise")
    # the teacher is a data option, so it is in the warm start's key
    cfg = load_config("configs/study/tool_use.yaml")
    assert warm_start_key(cfg, "b") != warm_start_key(
        load_config("configs/study/tool_use.yaml", ["data.options.teacher=one"]), "b"
    )
