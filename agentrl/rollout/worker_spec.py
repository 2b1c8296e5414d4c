"""What a rollout process is built from: a frozen ``WorkerSpec`` of plain values (the checkpoint, the
engine's ``EngineSpec``, the runner's ``RunnerSettings``, the environment and the sandbox), so that a
Ray worker needs no config, and unpickles in a process that has imported none of the trainer's
plugins. ``components.worker_spec`` builds one from a config; ``make_runner`` is the one place an
episode runner is chosen, for a spec and for the trainer's in-process runs alike."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.agents import AgentEnvironment
from agentrl.engines.base import Engine
from agentrl.engines.factory import EngineSpec
from agentrl.env import Environment, import_environment_module, make_env, registered
from agentrl.rollout.async_runner import AsyncEpisodeRunner
from agentrl.rollout.runner import EpisodeRunner, RunnerSettings, SamplingOverride
from sandboxes import SandboxSpec

if TYPE_CHECKING:
    from agentrl.rollout.agent_runner import Endpoint


@dataclass(frozen=True)
class EnvSpec:
    """An environment by name: ``env.name``, the module that registers it (``env.module``) and the
    keyword arguments of each instance (``env.options``)."""

    name: str
    module: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def env_class(self) -> type[Environment]:
        """The registered class (importing ``module`` first)."""
        if self.module:
            import_environment_module(self.module)
        if self.name not in registered():
            make_env(self.name)  # raises with a did-you-mean and the registered names
        return registered()[self.name]

    def factory(self, sandbox: SandboxSpec) -> Callable[[], Environment]:
        """Makes one fresh environment per episode, with ``options`` and ``sandbox``."""
        self.env_class()
        return functools.partial(make_env, self.name, sandbox=sandbox, **self.options)


@dataclass(frozen=True)
class WorkerSpec:
    """A rollout worker: its engine, runner, environment and sandbox, as plain values."""

    model_path: str
    """The checkpoint the engine reads."""
    tokenizer_path: str
    """``model.tokenizer``, else the checkpoint's own."""
    engine: EngineSpec
    runner: RunnerSettings
    """Sampling without a seed: each call sets its own (``with_sampling``)."""
    runner_kind: str
    """``rollout.runner``: lockstep or async (an agent environment takes the agent runner)."""
    env: EnvSpec
    sandbox: SandboxSpec
    endpoint: Endpoint | None = None
    """The agent runner's endpoint (``proxy``), for an agent environment."""


def with_sampling(
    settings: RunnerSettings, seed: int | None, override: SamplingOverride | None
) -> RunnerSettings:
    """``settings`` with this call's sampling seed and, when given, its temperature and top-p."""
    sampling = dataclasses.replace(settings.sampling, seed=seed)
    return dataclasses.replace(settings, sampling=(override or SamplingOverride()).applied(sampling))


def make_runner(
    spec: WorkerSpec,
    engine: Engine,
    tokenizer: Any,
    seed: int | None = None,
    override: SamplingOverride | None = None,
) -> EpisodeRunner:
    """The EpisodeRunner of ``spec.runner_kind`` (lockstep or async) over ``engine``; the agent runner
    when the environment is an agent."""
    settings = with_sampling(spec.runner, seed, override)
    envs = spec.env.factory(spec.sandbox)
    if issubclass(spec.env.env_class(), AgentEnvironment):
        from agentrl.rollout.agent_runner import AgentRunner, Endpoint

        return AgentRunner(engine, tokenizer, envs, settings, spec.endpoint or Endpoint())
    if spec.runner_kind == "async":
        return AsyncEpisodeRunner(engine, tokenizer, envs, settings)
    return EpisodeRunner(engine, tokenizer, envs, settings)
