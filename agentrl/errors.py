"""Where an episode can fail, and the exceptions that carry their boundary.

A bad rollout is data, not a crash: an exception at one of the boundaries below ends that episode
with a ``Failure`` (where, and what happened), the episode is kept in the transcripts but left out of
training, and the run goes on. Code that raises at a boundary raises a ``BoundaryError`` subclass (or
any exception with a ``boundary`` attribute, such as ``sandboxes.SandboxError``); the runner files
anything else under the boundary it was calling.

Boundaries:
- ``model``: the engine could not produce the turn.
- ``tool``: a tool raised (``ToolError``); malformed calls and ``ToolFeedback`` are feedback instead.
- ``sandbox``: the sandbox itself failed (``sandboxes.SandboxError``), not the code it ran.
- ``env``: ``reset``/``step`` raised or returned something the contract does not allow (``EnvError``).
- ``reward``: a reward function raised (``RewardError``).
- ``judge``: a judge reward got no verdict: its endpoint timed out, failed past its retries, or
  answered without one (``env/judge.py`` ``JudgeError``). Not a zero reward.
- ``worker``: the rollout worker process running the episode was lost (Ray).
- ``agent``: a user's agent (``AgentEnvironment.run``) raised or ran past ``timeouts.agent_run_s``, or
  its client's history drifted with ``proxy.on_drift: fail``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

Boundary = Literal["model", "tool", "sandbox", "env", "reward", "judge", "worker", "agent"]
BOUNDARIES: tuple[str, ...] = get_args(Boundary)


@dataclass
class Failure:
    """Why an episode failed: the boundary and a one-line message."""

    boundary: Boundary
    message: str

    def __post_init__(self) -> None:
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"failure boundary {self.boundary!r} is not one of {BOUNDARIES}")


class BoundaryError(Exception):
    """An exception that belongs to one boundary; the runner records the episode's failure there."""

    boundary: ClassVar[Boundary]


class ToolError(BoundaryError):
    """A tool raised while running."""

    boundary = "tool"


class EnvError(BoundaryError):
    """The environment broke its contract (``reset``/``step`` returned the wrong thing)."""

    boundary = "env"


class OptionsRequired(ValueError):
    """An environment that cannot be built without options that have no default (the server of an
    ``openenv`` environment): ``agentrl envs check --all`` skips it, saying which; named, it fails."""


class RewardError(BoundaryError):
    """A reward function raised or returned something that is not a number."""

    boundary = "reward"


def boundary_of(exc: BaseException, default: Boundary) -> Boundary:
    """Where an exception belongs: its ``boundary`` attribute if it names one, else ``default``."""
    b = getattr(exc, "boundary", None)
    return b if b in BOUNDARIES else default


class ToolTimeout(Exception):
    """A tool ran past its time limit (``env.run_with_timeout``); the model gets it as feedback."""


class ToolFeedback(Exception):
    """Raise from a tool to send an error message back to the model (not an episode failure).
    Importable from ``agentrl.env`` too, where tools are written."""
