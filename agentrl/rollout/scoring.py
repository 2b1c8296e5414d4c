"""An episode's reward: the rewards ``step`` returned plus the environment's weighted reward
functions, where a reward that raises, returns a non-number or never returns fails the episode at
the ``reward`` boundary (a judge's at ``judge``), naming it, instead of counting as zero."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.env import EpisodeState
from agentrl.env.judge import JudgeReward
from agentrl.env.values import RewardValueError, reward_value
from agentrl.errors import Failure, boundary_of
from agentrl.rollout.turns import LiveEpisode
from agentrl.timeouts import WaitTimeout


def score(lv: LiveEpisode, bounded: Callable[[Callable[[], Any]], Any], step_reward_name: str) -> None:
    """Set ``lv.episode``'s reward and components. ``bounded(call)`` runs the reward functions
    under the runner's environment timeout; ``step_reward_name`` is the component that holds the
    rewards ``step`` returned."""
    ep, env = lv.episode, lv.env
    assert env is not None and env.task is not None
    task = env.task
    state = EpisodeState(task, lv.messages, lv.final_text, dict(lv.info, stop_reason=ep.stop_reason))
    comps: dict[str, float] = {}
    current = ["rewards()"]  # the reward being computed, for the message when one fails

    def compute() -> float:
        total = 0.0
        rewards = env.rewards()
        if any(isinstance(r, JudgeReward) for r in rewards):
            ep.metrics["judged"] = True  # the step reports its judge's failures
        for r in rewards:
            current[0] = repr(r.name)
            value = reward_value(repr(r.name), r.fn(task, state))  # a finite real number
            comps[r.name] = value
            total += r.weight * value
        return total

    try:
        total = reward_value(repr(step_reward_name), lv.step_reward)  # steps' rewards, summed
        total += bounded(compute)
    except Exception as e:
        if isinstance(e, RewardValueError):
            message = str(e)
        else:
            how = "did not return" if isinstance(e, WaitTimeout) else f"raised {type(e).__name__}"
            message = f"reward {current[0]} {how}: {e}"
        ep.failure = Failure(boundary_of(e, "reward"), message)  # a JudgeError: "judge"
        ep.reward_components = dict(comps)
        ep.reward = 0.0
        return
    if lv.step_reward:
        comps[step_reward_name] = lv.step_reward
    ep.reward_components = comps
    ep.reward = total
