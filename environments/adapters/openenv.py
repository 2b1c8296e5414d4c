"""openenv: an OpenEnv environment (openenv-core's HTTP/WebSocket step/reset API) as multi-turn
episodes, unchanged: the environment's observations are the user turns, each model turn is an
action, the environment's rewards are the episode's reward.

    pip install 'agentrl[openenv]'

    env:
      name: openenv
      options:
        project: path/to/my_env      # an OpenEnv project (its openenv.yaml names the app), or
        # app: my_env.server.app:app # an installed environment's ASGI app, or
        # url: http://127.0.0.1:8000 # a server that is already running, or
        # image: my-env:latest       # a container image, started through the Docker path
        action_field: null           # the action's text field; null: its only required string field
        max_turns: 16

**Where the environment runs** (``environments.adapters.openenv_servers``). Exactly one of four sources:

- ``project`` / ``app``: agentrl starts the environment's own server, ``python -m uvicorn APP --host
  127.0.0.1 --port N`` (``project`` is its working directory and goes on ``PYTHONPATH``; ``app``
  defaults to the ``app:`` of the project's ``openenv.yaml``), waits for ``GET /health``, and stops
  it when the run ends (or when agentrl dies: the server gets SIGTERM with its parent).
- ``image``: a container from the image, started as ``agentrl.sandboxes``' Docker backend starts its
  own (``sandboxes.docker.connect``, the same owner labels, so a crashed run's containers are removed
  by the next), its ``container_port`` (8000, OpenEnv's) published on 127.0.0.1 only.
- ``url``: a server someone else started; agentrl only connects.

An OpenEnv server holds a fixed number of sessions at once (``max_concurrent_envs`` in its
``create_app``; 1 in the ``openenv init`` template). Each episode is one session (one WebSocket,
``openenv.core.GenericEnvClient``). With ``project``/``app``/``image`` agentrl starts another server
when every session of the running ones is taken, up to ``max_servers``; an episode that finds all
``max_servers x sessions_per_server`` sessions busy fails at the ``env`` boundary saying so (lower
``rollout.max_concurrent_episodes`` or raise ``max_servers``). With ``url``, ``sessions_per_server``
is the server's capacity.

**Actions.** The model's reply becomes the action: with ``action_field`` (by default the action
schema's only required string field, read from the server's ``GET /schema``, e.g. the template's
``message``) the reply text is that field; an action without such a field must be written as a JSON
object, the last one in the reply. A reply that is not a valid action is feedback, not a crash: the
model is told what was wrong and what the action looks like, and the turn counts.

**Observations.** The observation's fields (without ``reward``, ``done`` and ``metadata``) as JSON,
or one field's text with ``observation_field``. The first user message is the observation of
``reset(seed=...)``, after a system prompt that says what an action is (``system_prompt`` replaces
it).

**Tasks** are seeds for ``reset``: hashed into ``train`` and ``test`` (``environments.generators.
split_of``), so a held-out seed is never trained on; what a seed changes is the environment's business.

**Reward.** Each step's ``reward`` is added up (the episode's ``env_step`` reward component); ``done``
ends the episode. ``finished`` (weight 0): 1 when the environment said ``done``, 0 when agentrl's
turn budget ended it first.

**Failures are data.** A server that dies, a session the server refuses, an action the server
rejects (its validation error) or a step that raises fails that episode at the ``env`` boundary with
the server's message; the run goes on (and the circuit breaker counts it, as for any environment).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentrl.env import Environment, EpisodeState, Message, Reward, StepResult, Task, register
from agentrl.errors import OptionsRequired
from environments.adapters.openenv_servers import app_of, pool_for
from environments.adapters.packages import require
from environments.generators import sample_tasks

OBSERVATION_BOOKKEEPING = ("reward", "done", "metadata")


def _openenv() -> Any:
    return require("openenv.core", "openenv", "openenv")


# ---------------------------------------------------------------- actions and observations


def text_field(schema: dict[str, Any]) -> str | None:
    """The action's only required string field, if it has exactly one."""
    props, required = schema.get("properties") or {}, schema.get("required") or []
    strings = [name for name in required if (props.get(name) or {}).get("type") == "string"]
    return strings[0] if len(strings) == 1 else None


def last_json_object(text: str) -> dict[str, Any] | None:
    """The last ``{...}`` in ``text`` that parses as a JSON object."""
    decoder = json.JSONDecoder()
    found = None
    for start in [m.start() for m in re.finditer(r"\{", text)]:
        with contextlib.suppress(ValueError):
            value, _ = decoder.raw_decode(text[start:])
            if isinstance(value, dict):
                found = value
    return found


def observation_text(observation: Any, field: str | None) -> str:
    if not isinstance(observation, dict):
        return str(observation)
    if field is not None:
        if field not in observation:
            raise KeyError(f"the observation has no field {field!r} (it has {sorted(observation)})")
        value = observation[field]
        return value if isinstance(value, str) else json.dumps(value)
    shown = {k: v for k, v in observation.items() if k not in OBSERVATION_BOOKKEEPING}
    return json.dumps(shown, ensure_ascii=False)


def openenv_tasks(split: str, n: int | None = None, seed: int = 0) -> list[Task]:
    def make(rng: Any) -> tuple[str, str, Any, dict[str, Any]]:
        env_seed = rng.randrange(2**31)
        return str(env_seed), f"OpenEnv episode, seed {env_seed}", None, {"env_seed": env_seed}

    return sample_tasks("openenv", make, split, n, seed)


def _finished(task: Task, state: EpisodeState) -> float:
    return float(bool(state.info.get("done")))


@register
class OpenEnv(Environment):
    """An OpenEnv environment behind its server, one session per episode (module docstring)."""

    name = "openenv"
    max_turns = 16
    project: str | None = None
    """An OpenEnv project directory (``openenv init`` makes one): the server's working directory."""
    app: str | None = None
    """The server's ASGI app, ``module:attribute``; default: the ``app:`` of ``project``'s openenv.yaml."""
    url: str | None = None
    """A running server's base URL (agentrl starts nothing)."""
    image: str | None = None
    """A container image serving the environment (started through the Docker path)."""
    container_port: int = 8000
    """The port the image's server listens on inside the container."""
    docker_url: str | None = None
    """The Docker engine (default: ``DOCKER_HOST`` or the local socket)."""
    action_field: str | None = None
    """The action field the reply's text goes into; None: the action schema's only required string
    field, or, if it has none or several, the reply must be a JSON object action."""
    observation_field: str | None = None
    """Show only this observation field; None: the observation's fields as JSON."""
    system_prompt: ClassVar[str | None] = None
    """None: a prompt that says what an action is (from the server's action schema)."""
    sessions_per_server: int = 1
    """How many sessions one server takes at once (its ``max_concurrent_envs``)."""
    max_servers: int = 8
    """How many servers agentrl may start for ``project``/``app``/``image`` (more sessions at once)."""
    start_timeout_s: float = 120.0
    """How long a starting server may take to answer ``GET /health``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        _openenv()
        sources = [k for k in ("project", "app", "url", "image") if getattr(self, k)]
        if not sources or (len(sources) > 1 and sources != ["project", "app"]):
            raise OptionsRequired(
                "openenv needs exactly one of env.options.project (with an optional app), app, url "
                f"or image; got {sources or 'none'} (agentrl envs check openenv --options "
                """'{"project": "PATH"}')"""
            )
        if self.sessions_per_server < 1 or self.max_servers < 1:
            raise ValueError("openenv: sessions_per_server and max_servers must be at least 1")
        source: dict[str, Any] = {"start_timeout_s": self.start_timeout_s}
        if self.url:
            source["url"] = self.url
        elif self.image:
            source |= {
                "image": self.image,
                "container_port": self.container_port,
                "docker_url": self.docker_url,
            }
        else:
            project = str(Path(self.project).resolve()) if self.project else None
            source |= {"app": self.app or app_of(str(project)), "project": project}
        self._pool = pool_for(source, self.sessions_per_server, self.max_servers)
        self._client: Any = None
        self._server: str | None = None

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **options: Any) -> list[Task]:
        """Seeds for ``reset``, disjoint between splits."""
        return openenv_tasks(split, n, seed)

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        raise NotImplementedError("OpenEnv environments have no solver demonstrations")

    def reset(self, task: Task, seed: int) -> list[Message]:
        self.close()
        self.task, self.seed = task, seed
        self._invalid = 0
        self._server = self._pool.acquire()
        schema = self._pool.action_schema(self._server)
        self._field = self.action_field or text_field(schema)
        if self._field is not None and self._field not in (schema.get("properties") or {}):
            raise ValueError(
                f"openenv: the action has no field {self._field!r} "
                f"(its fields: {sorted(schema.get('properties') or {})})"
            )
        self._schema = schema
        self._client = _openenv().GenericEnvClient(base_url=self._server).sync()
        self._client.connect()
        result = self._client.reset(seed=int(task.metadata.get("env_seed", seed)))
        prompt = self.system_prompt or self.default_prompt()
        first = observation_text(result.observation, self.observation_field)
        return [{"role": "system", "content": prompt}, {"role": "user", "content": first}]

    def default_prompt(self) -> str:
        title = self._schema.get("title") or "action"
        if self._field is not None:
            return (
                "You are acting in an environment. Each of your replies is one action: its text is the "
                f"{title}'s {self._field!r}. The environment's observations come back as user messages."
            )
        fields = {k: v for k, v in (self._schema.get("properties") or {}).items() if k != "metadata"}
        return (
            "You are acting in an environment. Each of your replies is one action, written as a JSON "
            f"object ({title}) with these fields: {json.dumps(fields)}. The environment's observations "
            "come back as user messages."
        )

    def action(self, text: str) -> dict[str, Any] | str:
        """The action for a reply, or the feedback that says why the reply is not one."""
        if self._field is not None:
            return {self._field: text}
        action = last_json_object(text)
        if action is None:
            fields = sorted(k for k in (self._schema.get("properties") or {}) if k != "metadata")
            return f"That is not an action: write one JSON object with the fields {fields}."
        return action

    def step(self, action: str) -> StepResult:
        if self._client is None:
            raise RuntimeError("openenv: no session (reset was not called)")
        act = self.action(action)
        if isinstance(act, str):
            self._invalid += 1
            info = {"invalid_actions": self._invalid}
            return StepResult([{"role": "user", "content": act}], 0.0, False, False, info)
        result = self._client.step(act)
        reward = float(result.reward or 0.0)
        if result.done:
            return StepResult([], reward, True, False, {"done": True})
        text = observation_text(result.observation, self.observation_field)
        return StepResult([{"role": "user", "content": text}], reward, False, False, {})

    def close(self) -> None:
        client, self._client = self._client, None
        server, self._server = self._server, None
        try:
            if client is not None:
                with contextlib.suppress(Exception):  # a dead server: the session is gone anyway
                    client.close()
        finally:
            if server is not None:
                self._pool.release(server)

    def rewards(self) -> list[Reward]:
        return [Reward("finished", _finished, 0.0)]
