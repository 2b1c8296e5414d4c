"""The tasks ``agentrl envs check`` checks an environment with when they are not its built-in ones:
a run's config (``--config``: its environment, options and training tasks) or a task file
(``--data``, read as ``data.source=file`` reads it). Without either, an environment without built-in
tasks is checked on a placeholder task, which has no metadata, so a solver that reads its tasks'
metadata cannot be checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.env import Task


@dataclass
class GivenTasks:
    """What ``--config`` and ``--data`` chose: environment names and options (when the command line
    named none) and the tasks, with where they came from in words."""

    names: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    tasks: list[Task] | None = None
    source: str | None = None


def given_tasks(config: str | None, overrides: list[str], data: str | None) -> GivenTasks:
    """The environment and tasks of a run's ``config`` (with dotted ``overrides``) and/or the tasks
    of the file ``data``. Raises ``ValueError`` (or ``ConfigError``) saying what did not load."""
    out = GivenTasks()
    if config is not None:
        from agentrl.assembly import components
        from agentrl.config import load_config

        cfg = load_config(config, overrides)
        out.names, out.options = [cfg.env.name], dict(cfg.env.options)
        try:
            out.tasks = components.load_tasks(cfg, "train")
        except Exception as e:
            raise ValueError(
                f"--config {config}: its training tasks did not load: {type(e).__name__}: {e}"
            ) from e
        where = cfg.data.path if cfg.data.source != "builtin" else f"{cfg.env.name}'s generator"
        out.source = f"{config}'s training tasks ({where})"
    if data is not None:
        from agentrl.env.data import load_tasks_from_source

        try:
            out.tasks = load_tasks_from_source("file", data, split="train")
        except Exception as e:
            raise ValueError(f"--data {data}: {type(e).__name__}: {e}") from e
        out.source = data
    return out
