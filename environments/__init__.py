"""The built-in environments. Importing this package registers all of them (``agentrl.env.register``).

Each environment is one small module you can read in a minute and copy to start your own:

- ``gsm_symbolic``: GSM8K questions and new instances of their GSM-Symbolic templates (real language).
- ``short_cot``: single-turn math, answer in ``\\boxed{}`` or ``#### N``, checked by ``math_equiv``.
- ``long_cot``: single-turn long reasoning with integer answers (long-hand multiplication built in).
- ``countdown``: reach a target with given numbers; any correct expression counts.
- ``shop``: multi-turn JSON tool calls (three typed tools, many valid call orders).
- ``calculator``: multi-turn JSON tool calls to a calculator.
- ``code_interpreter``: multi-turn Python in a sandbox (```python blocks, output as ``tool`` messages).
- ``recall``: a code told early, asked for after more turns than the context holds
  (``rollout.context``: compaction; its demonstrations also show the summaries, one chat each).

Conventions every built-in environment follows (copy them in yours):

- ``load_tasks(split, n, seed, **knobs)`` (classmethod) returns seeded, deterministic ``Task`` records;
  ``train`` and ``test`` never overlap because a task's split is a hash of its canonical parameters
  (``generators.split_of``), whatever the seed, count or knobs. Knobs set the difficulty.
- ``demonstrations(tasks, seed)`` (classmethod) returns one full chat per task, ``[system?, user,
  assistant, (tool..., assistant)...]``, written by an exact solver and starting with exactly what
  ``reset`` returns. Tool messages are ``{"role": "tool", "name": ..., "content": ...}`` with the
  tool's real output; JSON tool calls are written with ``agentrl.tools.format_tool_call``. Where many
  solutions exist the solver samples among them (``generators.demo_rng(seed, task)``), so the SFT
  warm start does not collapse the policy onto one answer.
- ``rewards()`` returns named ``Reward(name, fn, weight)``; ``correct`` has weight 1, metrics weight 0.
  Reward functions do not swallow exceptions: the runner records them as ``reward`` failures.
- Task data outside the generators (GSM8K, MATH-500, AIME, DAPO-Math) comes from ``agentrl.env.data``.
"""

from environments import (
    calculator,
    code_interpreter,
    countdown,
    gsm_symbolic,
    long_cot,
    recall,
    shop,
    short_cot,
)

__all__ = [
    "calculator",
    "code_interpreter",
    "countdown",
    "gsm_symbolic",
    "long_cot",
    "recall",
    "shop",
    "short_cot",
]
