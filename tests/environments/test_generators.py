"""Synthetic task generators: seeded, deterministic, disjoint splits, knobs that matter, and solver
demonstrations that the environment's own rewards score as correct (and that are diverse)."""

import pytest

from agentrl.env import EpisodeState, make_env, registered
from environments.generators import code_arithmetic_demos, code_arithmetic_tasks, run_trusted, split_of

FAMILIES = ["short_cot", "long_cot", "countdown", "shop", "recall"]


def replay(name, task, demo, seed=0):
    """Step the environment with the demo's assistant turns; return (weighted reward, components)."""
    env = make_env(name)
    first = env.reset(task, seed)
    assert demo[: len(first)] == first
    messages, info, i = list(first), {}, len(first)
    while i < len(demo):
        assert demo[i]["role"] == "assistant"
        action = demo[i]["content"]
        messages.append(demo[i])
        obs, _, terminated, truncated, step_info = env.step(action)
        info.update(step_info)
        i += 1
        assert [m["content"] for m in obs] == [m["content"] for m in demo[i : i + len(obs)]]
        messages += obs
        i += len(obs)
        if terminated or truncated:
            assert i == len(demo), "the episode ended before the demonstration did"
    state = EpisodeState(task, messages, action, info)
    comps = {r.name: r.fn(task, state) for r in env.rewards()}
    return sum(r.weight * comps[r.name] for r in env.rewards()), comps


@pytest.mark.parametrize("name", FAMILIES)
def test_seeded_and_deterministic(name):
    cls = registered()[name]
    a = cls.load_tasks("train", n=20, seed=3)
    b = cls.load_tasks("train", n=20, seed=3)
    c = cls.load_tasks("train", n=20, seed=4)
    assert a == b
    assert [t.id for t in a] != [t.id for t in c]
    assert len({t.id for t in a}) == 20  # distinct within a split
    assert cls.demonstrations(a, seed=1) == cls.demonstrations(b, seed=1)


@pytest.mark.parametrize("name", FAMILIES)
def test_splits_never_overlap(name):
    cls = registered()[name]
    train = cls.load_tasks("train", n=300, seed=0) + cls.load_tasks("train", n=100, seed=1)
    test = cls.load_tasks("test", n=100, seed=0) + cls.load_tasks("test", n=100, seed=7)
    assert not {t.id for t in train} & {t.id for t in test}
    assert not {t.prompt for t in train} & {t.prompt for t in test}


def test_split_is_a_function_of_the_key_alone():
    # the same key lands in the same split whatever else changes; about TEST_FRACTION of keys are test
    keys = [f"k{i}" for i in range(2000)]
    share = sum(split_of(k) == "test" for k in keys) / len(keys)
    assert 0.17 < share < 0.23  # binomial(2000, 0.2): sd 0.009, so +-0.03 is > 3 sd
    assert [split_of(k) for k in keys] == [split_of(k) for k in keys]


def test_countdown_split_ignores_number_order_and_knobs():
    # "2 3 10 -> 8" and "10 2 3 -> 8" are one problem: its key sorts the numbers, so knob changes
    # that draw the same problem cannot move it across splits
    cls = registered()["countdown"]
    train = cls.load_tasks("train", n=400, seed=0) + cls.load_tasks("train", n=200, seed=0, max_number=12)
    test = cls.load_tasks("test", n=100, seed=0, max_number=12) + cls.load_tasks("test", n=100, seed=5)
    canon = lambda t: (tuple(sorted(t.metadata["numbers"])), t.metadata["target"])  # noqa: E731
    assert not {canon(t) for t in train} & {canon(t) for t in test}


@pytest.mark.parametrize("name", FAMILIES)
def test_every_demo_is_scored_correct_by_the_env(name):
    cls = registered()[name]
    tasks = cls.load_tasks("train", n=40, seed=0) + cls.load_tasks("test", n=10, seed=0)
    for task, demo in zip(tasks, cls.demonstrations(tasks, seed=0)):
        total, comps = replay(name, task, demo)
        assert comps["correct"] == 1.0, (task, demo[-1])
        assert comps["has_answer"] == 1.0
        assert total == 1.0  # metrics have weight 0


def test_countdown_demos_are_diverse():
    cls = registered()["countdown"]
    tasks = cls.load_tasks("train", n=30, seed=0)
    assert all(t.metadata["num_solutions"] >= 2 for t in tasks)
    answers = {
        (t.id, d[-1]["content"]) for s in range(6) for t, d in zip(tasks, cls.demonstrations(tasks, seed=s))
    }
    # every task has >= 2 solutions; over 6 seeds almost every task shows more than one
    per_task = [sum(1 for tid, _ in answers if tid == t.id) for t in tasks]
    assert sum(n >= 2 for n in per_task) >= 25


def test_shop_demos_use_every_strategy():
    cls = registered()["shop"]
    demos = cls.demonstrations(cls.load_tasks("train", n=60, seed=0), seed=0)
    first_calls = [d[2]["content"] for d in demos]
    assert any("add_to_cart" in c for c in first_calls)
    assert any(
        c.count("<tool_call>") == 2 and "lookup_price" in c for c in first_calls
    )  # both lookups at once
    assert any(c.count("<tool_call>") == 1 and "lookup_price" in c for c in first_calls)  # one per turn


def test_short_cot_demos_vary_the_step_order():
    cls = registered()["short_cot"]
    tasks = cls.load_tasks("train", n=30, seed=0)
    texts = [
        {d[-1]["content"] for d in (cls.demonstrations([t], seed=s)[0] for s in range(5))} for t in tasks
    ]
    assert sum(len(x) > 1 for x in texts) >= 20


def test_long_cot_demo_is_long_and_checks_out():
    cls = registered()["long_cot"]
    task = cls.load_tasks("train", n=1, seed=0)[0]
    text = cls.demonstrations([task])[0][-1]["content"]
    a, b = task.metadata["a"], task.metadata["b"]
    assert text.endswith(f"\\boxed{{{a * b}}}")
    assert 400 < len(text) < 1200  # 3x2 digits: ~17 lines of ~25 characters


def test_knobs_change_the_distribution():
    reg = registered()
    cd = reg["countdown"].load_tasks("train", n=20, seed=0, num_numbers=4, max_number=20, max_target=100)
    assert all(len(t.metadata["numbers"]) == 4 for t in cd)
    assert max(n for t in cd for n in t.metadata["numbers"]) > 10  # default max_number is 10
    easy = reg["short_cot"].load_tasks("train", n=20, seed=0)
    hard = reg["short_cot"].load_tasks("train", n=20, seed=0, steps=4, max_value=50)
    assert all(len(t.metadata["terms"]) == 3 for t in easy) and all(
        len(t.metadata["terms"]) == 5 for t in hard
    )
    lc = reg["long_cot"].load_tasks("train", n=20, seed=0, digits_a=5, digits_b=4)
    assert all(len(str(t.metadata["a"])) == 5 and len(str(t.metadata["b"])) == 4 for t in lc)
    shop = reg["shop"].load_tasks("train", n=20, seed=0, num_items=3, cents=True)
    assert all(len(t.metadata["order"]) == 3 for t in shop)
    assert any("." in t.answer for t in shop)


def test_too_small_a_space_raises():
    with pytest.raises(ValueError, match="distinct"):
        registered()["countdown"].load_tasks("test", n=500, seed=0, max_number=3, max_target=10)


def test_code_arithmetic_demos_print_the_answer():
    tasks = code_arithmetic_tasks("train", n=40, seed=0)
    assert {t.metadata["kind"] for t in tasks} == {"expr", "range_sum"}
    assert not {t.id for t in tasks} & {t.id for t in code_arithmetic_tasks("test", n=40, seed=0)}
    demos = code_arithmetic_demos(tasks, seed=0)
    for task, demo in zip(tasks, demos):
        assert [m["role"] for m in demo] == ["user", "assistant", "tool", "assistant"]
        code = demo[1]["content"].removeprefix("```python\n").removesuffix("\n```")
        assert run_trusted(code).strip() == str(task.answer) == demo[2]["content"]
        assert demo[3]["content"] == f"\\boxed{{{task.answer}}}"
    shapes = {
        d[1]["content"].split("\n")[1][:6] for d in demos
    }  # first code line: print(, result, x = , total
    assert len(shapes) >= 3


def test_countdown_show_steps_knob():
    cls = registered()["countdown"]
    bare = cls.demonstrations(cls.load_tasks("train", n=5, seed=0), seed=0)
    steps = cls.demonstrations(cls.load_tasks("train", n=5, seed=0, show_steps=True), seed=0)
    assert all(d[-1]["content"].startswith("\\boxed{") for d in bare)
    assert all("=" in d[-1]["content"].split("\\boxed")[0] for d in steps)  # "a op b=c" lines first
