"""The Environment contract users implement, the task record, rewards and the registry.

A user's environment is a class with ``reset(task, seed)`` and ``step(action_text)`` (Gymnasium's
shape, with ``terminated`` and ``truncated`` kept apart). It never sees token ids: the runner owns
tokens. Tools are typed, docstringed methods marked with ``@tool`` (or plain functions listed in
``extra_tools``); their JSON schemas go to the chat template's ``tools``. The default ``step``
parses tool calls, runs them, and returns their outputs; a turn without a call is the final answer.

    @register
    class Lookup(Environment):
        name = "lookup"

        @tool
        def get(self, key: str) -> str:
            \"\"\"Look a key up.

            Args:
                key: the key.
            \"\"\"
            return self.table[key]

        def reset(self, task, seed):
            self.table = task.metadata["table"]
            return super().reset(task, seed)

The parts: ``records.py`` (``Task``, ``StepResult``, ``Reward``, ``EpisodeState``), ``base.py``
(``Environment``, ``@tool``, options), ``registry.py`` (``@register``, ``make_env``, the entry points).
Environments import them from here: ``from agentrl.env import Environment, register, tool``.
"""

from agentrl.env.base import (
    Environment,
    declared_options,
    extract_boxed,
    option_problem,
    run_with_timeout,
    task_loading_options,
    tool,
    tool_result_text,
)
from agentrl.env.judge import Judge, JudgeError, JudgeReward, JudgeSettings, judge_reward, score_in, yes_no
from agentrl.env.records import (
    STEP_CONTRACT,
    EpisodeState,
    Message,
    Reward,
    StepResult,
    Task,
    checked_messages,
    checked_step,
)
from agentrl.env.registry import (
    ENTRY_POINT_GROUP,
    entry_point_errors,
    import_environment_module,
    make_env,
    register,
    registered,
)
from agentrl.errors import EnvError, ToolError, ToolFeedback, ToolTimeout
from agentrl.models.stopping import ANSWER_TAG, BOXED_ANSWER, StopCondition

__all__ = [
    "ANSWER_TAG",
    "BOXED_ANSWER",
    "ENTRY_POINT_GROUP",
    "STEP_CONTRACT",
    "EnvError",
    "Environment",
    "EpisodeState",
    "Judge",
    "JudgeError",
    "JudgeReward",
    "JudgeSettings",
    "Message",
    "Reward",
    "StepResult",
    "StopCondition",
    "Task",
    "ToolError",
    "ToolFeedback",
    "ToolTimeout",
    "checked_messages",
    "checked_step",
    "declared_options",
    "entry_point_errors",
    "extract_boxed",
    "import_environment_module",
    "judge_reward",
    "make_env",
    "option_problem",
    "register",
    "registered",
    "run_with_timeout",
    "score_in",
    "task_loading_options",
    "tool",
    "tool_result_text",
    "yes_no",
]
