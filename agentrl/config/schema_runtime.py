"""The config sections of the run's machinery: code execution, timeouts, the agents' endpoint, logging."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentrl.dataclass_tree import knob
from sandboxes import SANDBOXES


@dataclass
class LimitsConfig:
    wall_s: float = knob(10.0, gt=0)
    """Wall-clock limit per execution, seconds."""
    cpu_s: float = knob(10.0, gt=0)
    """CPU-time limit per execution, seconds."""
    memory_mb: int = knob(512, ge=16)
    """Memory limit, MiB."""
    max_procs: int = knob(32, ge=1)
    """Process/thread limit."""
    output_bytes: int = knob(65536, ge=1)
    """stdout/stderr kept per execution; the rest is cut and marked."""
    file_size_mb: int = knob(16, ge=0)
    """Largest file the code may write, MiB."""


@dataclass
class SandboxConfig:
    backend: str = knob("bwrap", choices=lambda: list(SANDBOXES))
    """Code execution (a record in ``sandboxes/factory.py``): ``bwrap`` = bubblewrap on this machine, ``docker``, ``e2b`` (cloud), ``unisolated`` = plain subprocess."""
    allow_unisolated: bool = False
    """DANGEROUS: permit ``backend: unisolated``, which runs model-written code as your user with your files and network. Only for trusted code in a throwaway machine."""
    warm_sessions: int = knob(0, ge=0)
    """Interpreter sessions started ahead of time in each rollout process, so an episode's first cell does not wait for a container or interpreter to start (renamed from ``pool_size``)."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """Resource limits per execution."""
    docker_image: str = "agentrl-sandbox:local"
    """Image for the ``docker`` backend. The default is built locally by ``.ci/docker_setup.sh`` (no pull needed); it bind-mounts the host's ``/usr`` read-only (docs/sandboxes.md)."""
    e2b_template: str | None = None
    """E2B sandbox template; None = E2B's default code interpreter."""


@dataclass
class TimeoutsConfig:
    engine_request_s: float = knob(600.0, gt=0)
    """One generation request (a turn, or a lockstep round's batch) with no answer in this long fails the episodes waiting on it at the ``model`` boundary, with an error naming the engine and the wait; the run goes on (``trainer.max_failed_*`` decide) and the stuck call is abandoned."""
    weight_sync_s: float = knob(600.0, gt=0)
    """One weight sync (all buckets and the verification)."""
    env_step_s: float = knob(600.0, gt=0)
    """An environment's construction, ``reset``, ``step`` or ``close`` (the tools inside it have their own ``tool_timeout_s``) with no answer in this long fails its episode at the ``env`` boundary; an episode's reward functions that have not all returned in this long fail it at the ``reward`` boundary. The stuck call is abandoned, in a daemon thread that cannot keep the process alive at exit."""
    collective_s: float = knob(600.0, gt=0)
    """A torch.distributed collective between the trainer's ranks (the process group's timeout): on CPU (gloo) the waiting ranks raise an error naming the collective; on GPU NCCL's watchdog aborts them."""
    ray_call_s: float = knob(3600.0, gt=0)
    """A call to a Ray rollout worker (a shard of episodes, a weight bucket, a probe, a start). A worker that does not answer in this long is killed and treated as dead: its episodes are retried elsewhere or fail at the ``worker`` boundary."""
    sleep_wake_s: float = knob(300.0, gt=0)
    """Each of the colocated engine's own phases (sleep, wake the weights, wake the KV cache: ``rollout.colocate.sleep``); past it the run stops with an error naming the phase. The update between them is bounded by ``collective_s``, the sync by ``weight_sync_s``."""
    data_wait_s: float = knob(3600.0, gt=0)
    """A rank waiting for a step's episodes: for those of the ranks that run them (rank 0's Ray pool, a tensor-parallel engine's leader), for the slowest rank's share, and in async mode for the pipeline."""
    warm_start_s: float = knob(86400.0, gt=0)
    """Under torchrun, the other ranks waiting for rank 0's SFT warm start (``sft.enabled``): rank 0 trains it once while they wait, then every rank reads it. A warm start that fails on rank 0 stops every rank at once, naming its error."""
    agent_run_s: float = knob(3600.0, gt=0)
    """An ``AgentEnvironment``'s ``run(client, task)`` for one episode: past it the agent is cancelled and its episode fails at the ``agent`` boundary."""


@dataclass
class ProxyConfig:
    host: str = "127.0.0.1"
    """Address the OpenAI-compatible endpoint binds to (``agentrl serve``, and the in-process endpoint agents call). Loopback only unless you change it."""
    port: int = knob(0, ge=0, le=65535)
    """Port of the endpoint; 0 = a free one (the in-process endpoint; ``agentrl serve`` prints it)."""
    on_drift: Literal["split", "fail", "retokenize"] = "split"
    """An agent's request whose history does not extend what the endpoint recorded (the client edited, dropped or re-ordered messages): ``split`` = record the drift and start a new sample prompted with the client's history; ``fail`` = fail the episode (boundary ``agent``) and answer the request with an error; ``retokenize`` = re-render the client's history into the current sample, keeping the policy's tokens where they survive unchanged (the rest becomes prompt). Each drift is recorded in the episode's ``metrics["drift"]`` with its class (``agentrl doctor``'s names)."""
    model_name: str = "agentrl-policy"
    """The model name ``/v1/models`` lists (requests may name any model)."""


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    """Write TensorBoard event files."""
    wandb: bool = False
    """Log to Weights & Biases (needs the wandb extra, ``pip install 'agentrl[wandb]'``, and a login)."""
    wandb_project: str = "agentrl"
    """W&B project name."""
    plots: bool = True
    """Write PNG plots of the main curves into the run directory."""
    transcripts: bool = True
    """Write episode transcripts (JSONL)."""
    transcript_every: int = knob(1, ge=1)
    """Write transcripts every N steps."""
    log_every: int = knob(1, ge=1)
    """Print the progress line (when the output is not a terminal) and send metrics to TensorBoard/W&B every N steps, and at the last step; ``metrics.jsonl`` always gets every step."""
