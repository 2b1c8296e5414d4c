"""Issue 66, item 5: which thread runs an environment's calls. A sqlite handle opened in ``reset``
made 94 % of a user's episodes fail ("SQLite objects created in a thread can only be used in that
same thread"): construction, reset, step, rewards and close of one episode ran on whichever pool
thread took each phase. They now run on the episode's own thread; ``tools_on_episode_thread``
puts the tools there too."""

from __future__ import annotations

import sqlite3
import threading
from typing import ClassVar

import pytest

from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import Environment, Reward, Task, register, tool
from agentrl.rollout.async_runner import AsyncEpisodeRunner
from agentrl.rollout.runner import EpisodeRequest, EpisodeRunner, RunnerSettings
from agentrl.tools import format_tool_call

CALLS = 3  # lookups per episode before the answer
TASK = Task(id="t1", prompt="What is stored under x?", answer=17)


@register
class SqliteLookup(Environment):
    name = "test_sqlite_lookup"
    system_prompt = "Look the value up, then answer."
    max_turns = CALLS + 2
    threads: ClassVar[dict[int, list[tuple[str, int]]]] = {}  # episode seed -> (call, thread id)

    def _saw(self, what: str) -> None:
        self.threads.setdefault(self.seed, []).append((what, threading.get_ident()))

    def reset(self, task, seed):
        messages = super().reset(task, seed)
        self.db = sqlite3.connect(":memory:")  # bound to the thread that opens it
        self.db.execute("create table kv (k text, v integer)")
        self.db.execute("insert into kv values ('x', 17)")
        self._saw("reset")
        return messages

    @tool
    def lookup(self, key: str) -> int:
        """The value stored under a key.

        Args:
            key: the key, e.g. "x".
        """
        self._saw("tool")
        return self.db.execute("select v from kv where k = ?", (key,)).fetchone()[0]

    def step(self, action):
        self._saw("step")
        return super().step(action)

    def rewards(self):
        self._saw("rewards")
        return [Reward("answered", lambda task, state: 1.0)]

    def close(self):
        self._saw("close")
        self.db.close()


@register
class SqliteLookupOneThread(SqliteLookup):
    name = "test_sqlite_lookup_one_thread"
    tools_on_episode_thread = True


def _script(tokenizer):
    def reply(prompt_ids, call_index):
        turns = tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        if turns < CALLS:
            return format_tool_call("lookup", {"key": "x"}) + "<|im_end|>"
        return "\\boxed{17}<|im_end|>"

    return reply


def _episodes(runner_cls, env_cls, tokenizer, n=6):
    env_cls.threads.clear()
    settings = RunnerSettings(max_concurrent_episodes=n)
    runner = runner_cls(ScriptedEngine(_script(tokenizer), tokenizer=tokenizer), tokenizer, env_cls, settings)
    try:
        return runner.run([EpisodeRequest(TASK, seed=i, group=f"g{i}") for i in range(n)])
    finally:
        runner.close()


@pytest.mark.parametrize("runner_cls", [EpisodeRunner, AsyncEpisodeRunner])
def test_one_episodes_environment_calls_run_on_its_own_thread(tiny_tokenizer, runner_cls):
    episodes = _episodes(runner_cls, SqliteLookup, tiny_tokenizer)
    for seed, calls in SqliteLookup.threads.items():
        env_threads = {t for what, t in calls if what != "tool"}
        assert len(env_threads) == 1, (seed, calls)  # reset, the step and close
        assert [w for w, _ in calls] == ["reset", "step", "tool", "close"]
        assert calls[2][1] not in env_threads
    # by default the tools run on threads of their own (a hung tool is abandoned, its timeout is
    # feedback), so the thread-bound handle fails there: the episode says so at the tool boundary
    assert all(ep.failure is not None and ep.failure.boundary == "tool" for ep in episodes)
    assert "SQLite objects created in a thread" in episodes[0].failure.message


@pytest.mark.parametrize("runner_cls", [EpisodeRunner, AsyncEpisodeRunner])
def test_tools_on_the_episode_thread_use_what_reset_opened(tiny_tokenizer, runner_cls):
    episodes = _episodes(runner_cls, SqliteLookupOneThread, tiny_tokenizer)
    assert [ep.failure for ep in episodes] == [None] * 6
    assert all(ep.reward == 1.0 and ep.metrics["tool_calls"] == CALLS for ep in episodes)
    per_episode = {seed: {t for _, t in calls} for seed, calls in SqliteLookupOneThread.threads.items()}
    assert all(len(threads) == 1 for threads in per_episode.values()), per_episode
    assert len(per_episode) == 6
    calls = SqliteLookupOneThread.threads[0]
    assert [w for w, _ in calls] == ["reset", *["step", "tool"] * CALLS, "step", "rewards", "close"]
