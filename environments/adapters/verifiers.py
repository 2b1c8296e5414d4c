"""verifiers: a verifiers environment (0.4.0, ``verifiers.v1``) trained unchanged: its taskset gives
the tasks, its rewards score them, and its rollouts run through agentrl's OpenAI-compatible endpoint,
where every token the policy samples is recorded.

    env:
      name: verifiers
      options:
        taskset: my_tasks            # a verifiers taskset id: a module exporting one Taskset subclass
        config: {}                   # or a whole verifiers env config (taskset, agent, ...)

**Installing it.** verifiers 0.4.0 declares ``mcp==2.0.0`` and ``openai<3``; agentrl needs
``mcp>=2.3`` (its MCP client uses 2.3's ``Client(StdioServerParameters)``), so pip cannot put both in
one environment. ``bash scripts/test_verifiers.sh --install`` makes ``.venv-verifiers``: verifiers and
its pins in a virtual environment layered on ``.venv`` (a ``.pth`` file), so everything else is
agentrl's own install. There, agentrl's MCP tool servers (``env.mcp_servers``) do not work; the
rest does. Run ``.venv-verifiers/bin/agentrl train ...``.

**How an episode runs.** The adapter is an ``AgentEnvironment``: the runner gives each episode an
``openai`` client whose key is the episode's key. The adapter builds verifiers' environment once per
process (``vf.load_environment(vf.resolve_env_config(config))``) and runs the episode's task with
``env.run_episode(task, ModelContext(...))``, pointing verifiers' client at agentrl's endpoint with the
episode key in the ``X-Episode-Key`` header; verifiers' interception server relays the harness's
model calls there. The default harness, ``environments.adapters.verifiers_chat``, runs in this
process (verifiers' own ``bash``/``null`` harnesses install their script's packages with ``uv`` at
run time, which these machines cannot); its id is ``agentrl_chat``, because verifiers imports harnesses
and tasksets by a top-level module name. It goes in every agent seat of the env's config (``agent``,
or ``player`` in verifiers' openenv and textarena envs); ``SEAT: {harness: ...}`` in ``config`` picks
another.

**Tasks** are the taskset's, in its order, split into ``train`` and ``test`` by a hash of each
task's id (``environments.generators.split_of``); the run seed picks which ones a split draws.
**Reward**: the trace's reward (the taskset's ``@vf.reward`` functions, weighted, as verifiers sums
them), component ``agent``. An episode verifiers reports as not ``ok`` (an error in the taskset, a
reward that raised, a harness that failed) fails at the ``agent`` boundary with verifiers' errors;
the run goes on.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import json
import os
import random
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from agentrl.agents import AgentEnvironment
from agentrl.env import Message, Task, register
from agentrl.errors import OptionsRequired
from environments.generators import split_of, task_id

KEY_VAR = "AGENTRL_VERIFIERS_KEY"  # verifiers reads an API key from a variable; the header wins
HARNESS = "agentrl_chat"  # environments.adapters.verifiers_chat, under the top-level name verifiers wants


def _vf() -> Any:
    try:
        vf = importlib.import_module("verifiers.v1")
        # verifiers imports a harness by a top-level module name (``agent.harness.id``)
        sys.modules.setdefault(HARNESS, importlib.import_module("environments.adapters.verifiers_chat"))
        return vf
    except ImportError as e:
        raise ImportError(
            "environment 'verifiers' needs verifiers>=0.4.0, which pins mcp==2.0.0 and openai<3 and so "
            "cannot be installed beside agentrl's mcp>=2.3: `bash scripts/test_verifiers.sh --install` "
            f"makes .venv-verifiers, layered on .venv, where it runs (docs/tasks.md) ({type(e).__name__}: {e})"
        ) from e


def env_config(taskset: str | None, config: dict | None, harness: str) -> dict[str, Any]:
    """verifiers' env config: ``config`` as given, ``taskset`` as its taskset id, and for each agent
    seat the env declares (``agent`` in a single-agent env, ``player`` in verifiers' openenv and
    textarena envs) our harness and a subprocess runtime unless set (verifiers' default runtime is a
    remote Prime sandbox)."""
    out = json.loads(json.dumps(dict(config or {})))
    if taskset:
        out.setdefault("taskset", {})["id"] = taskset
    if "id" not in out.get("taskset", {}):
        raise OptionsRequired("verifiers needs env.options.taskset (a taskset id) or config.taskset.id")
    for seat in agent_seats(out["taskset"]["id"], out.get("id", "")):
        agent = out.setdefault(seat, {})
        agent.setdefault("harness", {"id": harness})
        agent.setdefault("runtime", {"type": "subprocess"})
    return out


def agent_seats(taskset: str, env: str = "") -> list[str]:
    """The fields of the env's config that are agents (``vf.AgentConfig``)."""
    vf = _vf()
    from verifiers.v1.utils.loaders import env_config_type

    fields = env_config_type(taskset, env).model_fields
    return [
        name
        for name, field in fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, vf.AgentConfig)
    ]


@functools.lru_cache(maxsize=8)
def load_vf_env(config_json: str) -> Any:
    vf = _vf()
    return vf.load_environment(vf.resolve_env_config(json.loads(config_json)))


def prompt_text(data: Any) -> str:
    prompt = getattr(data, "prompt", None)
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(
            str(getattr(m, "content", None) or (m.get("content") if isinstance(m, dict) else m))
            for m in prompt
        )
    return str(getattr(data, "name", None) or getattr(data, "id", ""))


class TaskList:
    """A taskset's tasks in order, read lazily (a verifiers taskset may be infinite: TextArena's is a
    generator) and kept, so an episode's task is found by its index without iterating again."""

    def __init__(self, taskset: Any) -> None:
        self.bounded = bool(getattr(taskset, "bounded", True))
        self._it = iter(taskset)
        self._seen: list[Any] = []
        self._lock = threading.Lock()

    def get(self, index: int) -> Any:
        with self._lock:
            while len(self._seen) <= index:
                try:
                    self._seen.append(next(self._it))
                except StopIteration:
                    raise IndexError(f"the taskset has {len(self._seen)} tasks, no task {index}") from None
            return self._seen[index]

    def __iter__(self) -> Iterator[Any]:
        for index in itertools.count():
            try:
                yield self.get(index)
            except IndexError:
                return


@functools.lru_cache(maxsize=8)
def task_list(config_json: str) -> TaskList:
    return TaskList(load_vf_env(config_json).taskset)


def verifiers_tasks(split: str, n: int | None, seed: int, config: dict[str, Any]) -> list[Task]:
    """``n`` tasks of ``split``. A finite taskset: all of its ``split`` tasks, shuffled by ``seed``,
    the first ``n``. An infinite one: its ``split`` tasks in its order, from the ``seed · n``-th on
    (so seeds draw disjoint tasks); ``n`` is then required."""
    tasks_all = task_list(json.dumps(config, sort_keys=True))
    family = f"verifiers:{config['taskset']['id']}"
    if not tasks_all.bounded and n is None:
        raise ValueError(
            f"{family} is an infinite taskset: set data.num_train and data.num_test (how many tasks "
            "each split draws)"
        )
    skip = 0 if tasks_all.bounded else seed * (n or 0)
    tasks: list[Task] = []
    for index, vf_task in enumerate(tasks_all):
        data = vf_task.data
        key = f"{family}|{data.id if data.id is not None else index}"
        if split_of(key) != split:
            continue
        if skip:
            skip -= 1
            continue
        tasks.append(Task(id=task_id(family, key), prompt=prompt_text(data), metadata={"vf_index": index}))
        if not tasks_all.bounded and len(tasks) == n:
            return tasks
    random.Random(f"{family}:{split}:{seed}").shuffle(tasks)
    if n is not None and n > len(tasks):
        raise ValueError(
            f"{family}: the taskset has {len(tasks)} {split} tasks, fewer than the {n} asked for"
        )
    return tasks if n is None else tasks[:n]


@register
class Verifiers(AgentEnvironment):
    """A verifiers environment's taskset, rewards and harness, through agentrl's endpoint."""

    name = "verifiers"
    taskset: str | None = None
    """A verifiers taskset id (an importable module that exports one ``Taskset`` subclass)."""
    config: dict = {}  # noqa: RUF012 (an option's default; never mutated)
    """A verifiers env config (``vf.resolve_env_config``); ``taskset`` sets its taskset id."""
    harness: str = HARNESS
    """The harness id when ``config`` names none: agentrl's in-process chat harness."""
    task_options: ClassVar[tuple[str, ...]] = ("taskset", "config", "harness")

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        _vf()
        self._config = env_config(self.taskset, self.config, self.harness)

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **options: Any) -> list[Task]:
        """The taskset's tasks of ``split`` (options ``taskset``, ``config``, ``harness``)."""
        config = env_config(options.get("taskset"), options.get("config"), options.get("harness", HARNESS))
        return verifiers_tasks(split, n, seed, config)

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        raise NotImplementedError("verifiers tasksets have no solver demonstrations")

    async def run(self, client: Any, task: Task) -> float:
        vf = _vf()
        config = json.dumps(self._config, sort_keys=True)
        env = load_vf_env(config)
        vf_task = task_list(config).get(int(task.metadata["vf_index"]))
        os.environ.setdefault(KEY_VAR, "agentrl")
        endpoint = vf.EvalClientConfig(
            base_url=str(client.base_url).rstrip("/"),
            api_key_var=KEY_VAR,
            headers={"X-Episode-Key": client.api_key},
        )
        async with env.serving():
            episode = await env.run_episode(vf_task, vf.ModelContext(model="policy", client=endpoint))
        if not episode.ok or not episode.traces:
            found = [*episode.errors, *(e for trace in episode.traces for e in trace.errors)]
            errors = "; ".join(f"{getattr(e, 'type', 'Error')}: {getattr(e, 'message', e)}" for e in found)
            errors = errors or "no trace"
            raise RuntimeError(f"verifiers episode of {task.id} failed: {errors}")
        return float(sum(trace.reward for trace in episode.traces) / len(episode.traces))
