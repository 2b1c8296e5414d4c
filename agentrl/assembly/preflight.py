"""What a run's inputs can get wrong, checked before any work and before anything is written.

``load_config`` checks the config's own keys and values. This module checks what they point at: the
device, the model and tokenizer directories, the environment (its options, one construction), the
tasks (the data file, its rows, the generator's knobs), the SFT warm start's demonstrations, and on
``--resume`` the keys that changed. Every problem becomes one line of a ``ConfigError`` (exit 2)
naming the key or the file and line, what was found and what to do; the command stops before it
loads a model or creates the run directory. ``agentrl train``, ``sft``, ``eval``, ``rollout`` and
``serve`` call ``check_inputs`` first; the trainer uses the tasks it loaded.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrl.assembly import components
from agentrl.assembly.model_checks import model_problems
from agentrl.config import (
    CONFIG_FILE,
    Config,
    ConfigError,
    config_from_dict,
    config_to_dict,
    output_dir,
    run_history,
)
from agentrl.engines.registry import engine_record
from agentrl.env import Environment, Task, option_problem
from agentrl.training.prompt_fit import over_long_prompts

ATTENTION = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


@dataclass
class ResumeChanges:
    """What a resume changes in the run's config: ``{key: [old, new]}``, and the refused keys that
    ``--force`` let through."""

    changed: dict[str, list[Any]]
    forced: list[str] = field(default_factory=list)


@dataclass
class CheckedInputs:
    """What the checks loaded (so the command does not load it twice) and what to tell the user."""

    train_tasks: list[Task] | None = None
    test_tasks: list[Task] | None = None
    resume: ResumeChanges | None = None
    notes: list[str] = field(default_factory=list)


def check_inputs(
    cfg: Config,
    *,
    train: bool = False,
    test: bool = False,
    sft: bool | None = None,
    force: bool = False,
) -> CheckedInputs:
    """Check ``cfg``'s inputs; load the ``train`` and ``test`` tasks when asked. ``sft`` (default
    ``sft.enabled``): check that the warm start can make its demonstrations. ``force``: let a
    resume change keys it would refuse (recorded). Raises ``ConfigError`` listing every problem."""
    model = list(model_problems(cfg))
    out, problems = CheckedInputs(), [*setting_problems(cfg), *model, *output_problems(cfg)]
    env_cls = components.env_class(cfg)
    env_problems = list(environment_problems(cfg, env_cls))
    problems += env_problems
    if not env_problems:
        before = len(problems)
        if train:
            out.train_tasks = _tasks(cfg, "train", problems, out.notes)
        if test and not (len(problems) > before and components.shared_rows(cfg)):  # one file: said once
            out.test_tasks = _tasks(cfg, "test", problems, out.notes)
        if not model:  # prompts that fill an episode alone, counted by the run's tokenizer
            problems += _over_long(cfg, {"train": out.train_tasks, "test": out.test_tasks})
        if (cfg.sft.enabled if sft is None else sft) and len(problems) == before:  # tasks that load
            problems += demonstration_problems(cfg, env_cls)
    if cfg.run.resume:
        out.resume = _resume_changes(cfg, force, problems)
    if problems:
        raise ConfigError(problems)
    out.notes += _split_notes(cfg, out)
    return out


# -- the machine -------------------------------------------------------------------------------------
def setting_problems(cfg: Config) -> Iterator[str]:
    """Settings whose check needs this machine: the device, the cache, optional packages."""
    yield from device_problems(cfg)
    yield from _cache_problems()
    yield from ray_problems(cfg)
    attn = cfg.model.attn_implementation
    if attn and attn not in ATTENTION and "/" not in attn:
        yield f"model.attn_implementation={attn!r}: valid: {', '.join(ATTENTION)} (or a hub kernel, org/name)"
    for key, on, module, how in (
        ("logging.wandb=true", cfg.logging.wandb, "wandb", "pip install wandb, or logging.wandb=false"),
        (
            "rollout.workers > 0",
            cfg.rollout.workers > 0,
            "ray",
            "pip install 'ray[default]', or rollout.workers=0",
        ),
    ):
        if on and importlib.util.find_spec(module) is None:
            yield f"{key} needs the {module!r} package, which is not installed here: {how}"
    engine = engine_record(cfg.rollout.engine)
    if problem := engine.install_problem():
        yield f"rollout.engine={engine.name}: {problem}"


def bind_problem(key: str, host: str, port: int) -> str | None:
    """Whether a server can listen on ``host:port`` (port 0: any free port), checked by binding."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, port))
    except OSError as e:
        why = (
            "the port is in use (pick another, or 0 for a free one)"
            if e.errno == 98
            else e.strerror or str(e)
        )
        return f"{key}: cannot listen on {host}:{port}: {why}"
    return None


def ray_problems(cfg: Config) -> Iterator[str]:
    """``rollout.ray_address`` answers (a cluster that cannot be reached made Ray retry for minutes)."""
    import socket

    address = cfg.rollout.ray_address
    if cfg.rollout.workers == 0 or not address or address in ("auto", "local"):
        return
    host, _, port = str(address).removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
        yield (
            f"rollout.ray_address={address!r}: nothing answers there ({e.strerror if isinstance(e, OSError) else e}); "
            "start the cluster (ray start --head) or give its address as host:port"
        )


def _cache_problems() -> Iterator[str]:
    from agentrl.models import cache_root

    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        yield f"the cache directory {root} (AGENTRL_CACHE) cannot be created: {e.strerror or e}"


def device_problems(cfg: Config) -> Iterator[str]:
    if cfg.run.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            yield (
                f"run.device=cuda, but torch {torch.__version__} sees no CUDA device here (a CPU build, "
                "or no GPU visible): use run.device=cpu, or run.device=auto to take a GPU when there is one"
            )


# -- the run directory --------------------------------------------------------------------------------
def output_problems(cfg: Config) -> Iterator[str]:
    """``run.output_dir`` is a directory, or can become one: its nearest existing ancestor is a
    writable directory (probed with a temporary directory, removed at once)."""
    out = output_dir(cfg)
    if out.exists() and not out.is_dir():
        yield f"run.output_dir={str(out)!r} is a file, not a directory"
        return
    probe_in = out if out.exists() else next((p for p in out.absolute().parents if p.exists()), Path("/"))
    if not probe_in.is_dir():
        yield f"run.output_dir={str(out)!r} cannot be created: {probe_in} is a file"
        return
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".agentrl-probe-", dir=probe_in))
    except OSError as e:
        yield f"run.output_dir={str(out)!r} cannot be created or written in {probe_in}: {e.strerror or e}"


# -- the environment -------------------------------------------------------------------------------
def environment_problems(cfg: Config, env_cls: type[Environment]) -> Iterator[str]:
    """``env.options`` are options the class declares, and one environment can be constructed."""
    problem = option_problem(env_cls, cfg.env.options)
    if problem:
        yield f"env.options: {problem}"
        return
    if env_cls.mcp_servers:
        from agentrl.env.mcp_tools import client_problem

        if problem := client_problem():
            yield f"env: {cfg.env.name!r} has MCP servers: {problem}"
            return
    from agentrl.agents import AgentEnvironment

    if issubclass(env_cls, AgentEnvironment):  # its agents call an endpoint the run serves
        bound = bind_problem("proxy.host/proxy.port", cfg.proxy.host, cfg.proxy.port)
        if bound:
            yield bound
    from agentrl.timeouts import call_with_timeout

    def construct() -> None:
        components.env_factory(cfg)().close()

    try:
        call_with_timeout(
            construct, cfg.timeouts.env_step_s, "constructing the environment", "timeouts.env_step_s"
        )
    except Exception as e:
        yield (
            f"env: constructing {cfg.env.name!r} with env.options={cfg.env.options} raised "
            f"{type(e).__name__}: {e}"
        )


# -- tasks -------------------------------------------------------------------------------------------
def _tasks(cfg: Config, split: str, problems: list[str], notes: list[str]) -> list[Task] | None:
    """``split``'s tasks (None when they do not load: the reason joins ``problems``); the dataset's
    line naming its adapter joins ``notes`` (once: one file serving both splits is read twice)."""

    def note(line: str) -> None:
        if line not in notes:
            notes.append(line)

    try:
        tasks = components.load_tasks(cfg, split, log=note)
    except Exception as e:
        problems.append(task_problem(cfg, split, e))
        return None
    if not isinstance(tasks, list):
        problems.append(f"{_task_source(cfg)} ({split}) returned {type(tasks).__name__}, not a list of Task")
        return None
    bad = next((t for t in tasks if not isinstance(t, Task)), None)
    if bad is not None:
        problems.append(
            f"{_task_source(cfg)} ({split}) returned {type(bad).__name__} {str(bad)[:60]!r}: expected "
            "agentrl.env.Task(id, prompt, answer, metadata)"
        )
    elif not tasks:
        problems.append(f"{_task_source(cfg)} gave no {split} tasks")
    return tasks


def _over_long(cfg: Config, splits: dict[str, list[Task] | None]) -> list[str]:
    """The splits whose task prompts cannot fit an episode (``prompt_fit.over_long_prompts``)."""
    tokenizer: list[Any] = []

    def load() -> Any:  # once, and only when some prompt is long enough to count
        tokenizer[:] = tokenizer or [components.load_run_tokenizer(cfg, cfg.model.path)]
        return tokenizer[0]

    found = []
    for split, tasks in splits.items():
        if tasks and all(isinstance(t, Task) for t in tasks):
            found.append(
                over_long_prompts(cfg.rollout.max_episode_tokens, cfg.model.path, tasks, split, load)
            )
    return [p for p in found if p]


def _task_source(cfg: Config) -> str:
    d = cfg.data
    if d.source == "builtin":
        return f"load_tasks of environment {cfg.env.name!r}"
    return f"data.path={d.path!r}" if d.source == "file" else f"hub dataset {d.path!r}"


def task_problem(cfg: Config, split: str, e: Exception) -> str:
    """What went wrong loading ``split``'s tasks, and what to do about it."""
    d, what = cfg.data, f"{type(e).__name__}: {e}"
    if isinstance(e, NotImplementedError) and d.source == "builtin":
        return (
            f"environment {cfg.env.name!r} has no built-in tasks: set data.source=file and data.path to your "
            'file of prompts and answers (docs/tasks.md, "Your own data file")'
        )
    if isinstance(e, FileNotFoundError):
        return f"data.path: {e} (relative paths start from {os.getcwd()})"
    if isinstance(e, TypeError) and d.source == "builtin" and d.options:
        return (
            f"data.options={d.options}: the task generator of environment {cfg.env.name!r} does not take "
            f"them ({what}); see its knobs in docs/tasks.md"
        )
    if d.source == "builtin":
        return f"{_task_source(cfg)} ({split}) raised {what}"
    return f"data ({split} split): {e}" if isinstance(e, ValueError) else f"data ({split} split): {what}"


def _split_notes(cfg: Config, out: CheckedInputs) -> list[str]:
    """The log's word on a dataset whose one set of rows was split, with the sizes; fewer training
    tasks than ``data.num_train`` asked for; and any held-out task that is also a training task (two
    files that share prompts)."""
    notes = []
    asked = cfg.data.num_train
    if out.train_tasks is not None and asked and len(out.train_tasks) < asked:
        notes.append(
            f"note: data.num_train={asked}, but there are {len(out.train_tasks)} training tasks: all are used"
        )
    note = components.split_note(cfg)
    if note and out.train_tasks is not None:
        sizes = f"{len(out.train_tasks)} training tasks" + (
            f", {len(out.test_tasks)} held out" if out.test_tasks is not None else ""
        )
        notes.append(f"{note}: {sizes}")
    if out.train_tasks and out.test_tasks:
        trained = {t.prompt for t in out.train_tasks}
        shared = [t.prompt for t in out.test_tasks if t.prompt in trained]  # tasks, as eval counts them
        if shared:
            notes.append(
                f"warning: {len(shared)} of the {len(out.test_tasks)} held-out tasks are also training tasks "
                f"(the same prompt), e.g. {shared[0][:60]!r}: their evaluation is not held out"
            )
    return notes


# -- the SFT warm start -------------------------------------------------------------------------------
def demonstration_problems(cfg: Config, env_cls: type[Environment]) -> Iterator[str]:
    """With ``sft.enabled`` and no ``sft.demos``, the environment's solver makes the
    demonstrations from training tasks: it must have one, and it must accept every task."""
    if cfg.sft.demos:  # read and checked line by line by load_config
        from agentrl.env.demos import load_demonstrations

        yield from _holdout_problems(cfg, len(load_demonstrations(cfg.sft.demos)))
        return
    yield from _holdout_problems(cfg, cfg.sft.num_demos)
    own = getattr(env_cls.demonstrations, "__func__", None)
    if own is Environment.demonstrations.__func__:  # type: ignore[attr-defined]
        yield (
            f"sft.enabled=true, but environment {cfg.env.name!r} has no solver demonstrations (it does not "
            "define demonstrations()): give sft.demos (a JSONL file of conversations, docs/training.md), "
            "or set sft.enabled=false"
        )
        return
    from agentrl.assembly.sft import demo_tasks, solver_demonstrations

    try:
        tasks = demo_tasks(cfg)
        solver_demonstrations(cfg, env_cls, tasks)
    except Exception as e:
        hint = (
            " The rows of a data file need a `solution` column (a worked solution; its last line or "
            "\\boxed{} gives the answer) for the warm start to learn from;"
            if cfg.data.source != "builtin" and "solution" in str(e)
            else ""
        )
        yield (
            f"sft.enabled=true: the warm start makes its demonstrations with the solver of environment "
            f"{cfg.env.name!r} from the training tasks, and that failed: {type(e).__name__}: {e}.{hint} give "
            "sft.demos (a JSONL of conversations), or set sft.enabled=false"
        )


def _holdout_problems(cfg: Config, n: int) -> Iterator[str]:
    """``sft.holdout`` must leave demonstrations to train on (run_sft holds out max(1, round(h·n)))."""
    h = cfg.sft.holdout
    if h > 0 and max(1, round(h * n)) >= n:
        yield f"sft.holdout={h} holds out all {n} demonstration(s), leaving none to train on: lower it or add demonstrations"


# -- resume --------------------------------------------------------------------------------------------
def _resume_changes(cfg: Config, force: bool, problems: list[str]) -> ResumeChanges | None:
    """The keys this resume changes against the run's ``config.yaml``; the ones a run cannot take
    mid-way are problems unless ``force``."""
    run_dir = output_dir(cfg)
    saved = run_dir / CONFIG_FILE
    if not saved.is_file():
        return None
    old, new = saved_tree(saved), config_to_dict(cfg)
    changed = run_history.changed_keys(old, new)
    refused = run_history.refused_changes(changed, old, new)
    if refused and not force:
        problems.append(
            f"resuming {run_dir} with changes a run cannot take mid-way:\n      "
            + "\n      ".join(refused)
            + "\n    Start a new run for them instead (its model.path may be a checkpoint of this one: "
            f"`agentrl export {run_dir} OUT` writes one as a plain model), or pass --force to resume anyway "
            "(recorded in the run's history.jsonl)"
        )
    forced = [k for k in changed if run_history.fixed_reason(k, old, new)] if force else []
    return ResumeChanges(changed, forced)


def saved_tree(path: Path) -> dict[str, Any]:
    """A run's saved config as a plain tree, with keys the schema gained since filled in by their
    defaults (so an old run's resume does not count them as changes), except ``data.test_fraction``
    of a dataset run: before it existed every row was a training task, i.e. 0."""
    raw = yaml.safe_load(path.read_text()) or {}
    data = raw.get("data") if isinstance(raw.get("data"), dict) else None
    if data is not None and data.get("source", "builtin") != "builtin" and "test_fraction" not in data:
        data["test_fraction"] = 0.0  # a run from before held-out splits trained on every row
    try:
        return config_to_dict(config_from_dict(raw))
    except ConfigError:
        return raw


def record_session(run_dir: Path, step: int, checkpoint: str | None, checked: ResumeChanges | None) -> None:
    """Append this session's start or resume to ``RUN/history.jsonl``."""
    entry: dict[str, Any] = {"event": "resume" if checked is not None else "start", "step": step}
    if checked is not None:
        entry.update(checkpoint=checkpoint, changed=checked.changed, forced=checked.forced)
    else:
        entry.update(changed={}, forced=[])
    run_history.append(run_dir, entry)
