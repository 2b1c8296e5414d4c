"""Drive each built-in environment through reset/step with scripted actions and score the episode
with its own rewards: right answers earn 1, wrong ones 0, bad tool calls become error observations."""

import pytest

from agentrl.env import EpisodeState, Task, make_env
from agentrl.env.check import check_environment, format_report
from agentrl.tools import format_tool_call
from environments.countdown import check_solution


def play(name, task, actions, seed=0):
    """Run scripted assistant turns; returns (components, weighted total, messages, last info)."""
    env = make_env(name)
    messages = env.reset(task, seed)
    info, action = {}, None
    for action in actions:
        messages.append({"role": "assistant", "content": action})
        obs, _, terminated, truncated, step_info = env.step(action)
        info.update(step_info)
        messages += obs
        if terminated or truncated:
            break
    else:
        raise AssertionError("the episode did not end")
    env.close()
    state = EpisodeState(task, messages, action, info)
    comps = {r.name: r.fn(task, state) for r in env.rewards()}
    return comps, sum(r.weight * comps[r.name] for r in env.rewards()), messages, info


WORD = Task(
    "w1", "Ann has 7 cups. Ann buys 3 packs of 4. Ann gives away 5. How many cups does Ann have now?", 14
)


@pytest.mark.parametrize(
    ("action", "correct"),
    [
        ("3*4=12\n7+12=19\n19-5=14\n\\boxed{14}", 1.0),
        ("7-5=2, 2+12=14\n#### 14", 1.0),  # GSM8K form, other step order
        ("\\boxed{14.0}", 1.0),
        ("\\boxed{13}", 0.0),
        ('<tool_call>{"name": "calc", "arguments": {}}</tool_call>', 0.0),  # no tools here: just no answer
    ],
)
def test_short_cot_scores_the_final_answer(action, correct):
    comps, total, messages, _ = play("short_cot", WORD, [action])
    assert comps["correct"] == correct and total == correct
    assert messages[-1]["role"] == "assistant"  # single turn: no observation after the answer


def test_short_cot_turn_without_answer_is_void():
    comps, total, _, info = play("short_cot", WORD, ["I think it is fourteen."])
    assert info.get("void_turn") and comps == {"correct": 0.0, "has_answer": 0.0} and total == 0.0


def test_short_cot_accepts_equivalent_latex():
    task = Task("m1", "What is 1/2 + 1/3?", "\\frac{5}{6}")
    assert play("short_cot", task, ["\\boxed{\\dfrac{5}{6}}"])[0]["correct"] == 1.0
    assert play("short_cot", task, ["\\boxed{0.83}"])[0]["correct"] == 0.0


def test_long_cot_integer_answers_and_length_metric():
    task = Task("l1", "What is 482*37?", 17834)
    comps, total, _, _ = play("long_cot", task, ["...long work...\n\\boxed{17834}"])
    assert comps["correct"] == 1.0 and total == 1.0
    assert comps["response_chars"] == len("...long work...\n\\boxed{17834}")  # 29 characters, weight 0
    assert play("long_cot", task, ["\\boxed{17833}"])[0]["correct"] == 0.0


COUNTDOWN = Task(
    "c1", "Numbers: 3 7 25. Target: 46.", 46, {"numbers": [3, 7, 25], "target": 46, "use_all": False}
)


@pytest.mark.parametrize("expr", ["25+3*7", "3*7+25", "7*3+25", "(7*3)+25", "25 + 3 \\times 7", "25+3*7=46"])
def test_countdown_accepts_any_correct_expression(expr):
    comps, total, _, _ = play("countdown", COUNTDOWN, [f"\\boxed{{{expr}}}"])
    assert comps["correct"] == 1.0 and total == 1.0


@pytest.mark.parametrize(
    "expr",
    [
        "46",  # the target itself is not an expression over the numbers
        "25+3*7*1",  # 1 is not given
        "25+7+7+7",  # 7 used three times
        "25+3*7+1-1",
        "25*3/0",  # division by zero: 0, not a crash
        "__import__('os').system('true')",
        "25+21",  # 21 is not given
        "2**5+14",
    ],
)
def test_countdown_rejects_invalid_expressions(expr):
    comps, total, _, _ = play("countdown", COUNTDOWN, [f"\\boxed{{{expr}}}"])
    assert comps["correct"] == 0.0 and total == 0.0


def test_countdown_use_all_rule():
    assert check_solution("25+3*7", [3, 7, 25], 46, use_all=True)
    assert not check_solution("25+21", [3, 7, 25, 21], 46, use_all=True)  # 3 and 7 unused
    assert check_solution("(25-3)*2+2", [25, 3, 2, 2], 46)  # repeated numbers may each be used once


SHOP = Task(
    "s1",
    "Order: 3 apple, 2 pen. What is the total price?",
    "22",
    {"order": [["apple", 3], ["pen", 2]], "prices_cents": {"apple": 400, "pen": 500, "cup": 200}},
)


def call(name, **args):
    return format_tool_call(name, args)


def test_shop_lookup_strategy():
    actions = [
        call("lookup_price", item="pen") + call("lookup_price", item="apple"),
        "3*4=12\n2*5=10\n\\boxed{22}",
    ]
    comps, total, messages, _ = play("shop", SHOP, actions)
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["5", "4"]
    assert comps == {"correct": 1.0, "has_answer": 1.0, "num_tool_calls": 2.0} and total == 1.0


def test_shop_cart_strategy_and_wrong_answer():
    actions = [
        call("add_to_cart", item="apple", qty=3),
        call("add_to_cart", item="pen", qty=2),
        call("cart_total"),
    ]
    comps, _, messages, _ = play("shop", SHOP, [*actions, "\\boxed{22}"])
    assert messages[-2]["content"] == "22" and comps["correct"] == 1.0 and comps["num_tool_calls"] == 3.0
    assert play("shop", SHOP, [*actions, "\\boxed{20}"])[0]["correct"] == 0.0


def first_observation(action):
    env = make_env("shop")
    env.reset(SHOP, 0)
    obs, _, terminated, _, _ = env.step(action)
    assert not terminated
    return obs[0]["content"]


def test_shop_malformed_call_is_an_error_observation():
    assert first_observation('<tool_call>{"name": "lookup_price", "arguments": {</tool_call>').startswith(
        "Error:"
    )
    assert "not closed" in first_observation('<tool_call>{"name": "lookup_price"')


def test_shop_unknown_tool_gets_a_hint():
    text = first_observation(call("lookup_prise", item="pen"))
    assert "unknown tool" in text and "Did you mean 'lookup_price'" in text


def test_shop_bad_arguments_and_unknown_items_are_feedback():
    assert "qty" in first_observation(call("add_to_cart", item="pen", qty="two"))  # typed argument
    assert "missing" in first_observation(call("add_to_cart", item="pen"))
    text = first_observation(call("lookup_price", item="pencil"))
    assert "no item 'pencil'" in text and "pen" in text
    assert "at least 1" in first_observation(call("add_to_cart", item="pen", qty=0))


@pytest.mark.parametrize("name", ["short_cot", "long_cot", "countdown", "shop", "recall"])
def test_environment_passes_the_checker(name):
    report = check_environment(name)
    assert report.ok, format_report(report)


def test_structured_tool_results_reach_the_model_as_json():
    from agentrl.env import tool_result_text

    assert tool_result_text("17") == "17" and tool_result_text(17) == "17" and tool_result_text(2.5) == "2.5"
    assert tool_result_text({"city": "City7", "population": 1259}) == '{"city": "City7", "population": 1259}'
    assert tool_result_text([1, "a", None, True]) == '[1, "a", null, true]'
    assert tool_result_text(True) == "true" and tool_result_text(None) == "null"
    assert tool_result_text({1, 2}) == "{1, 2}"  # not JSON-encodable: str
