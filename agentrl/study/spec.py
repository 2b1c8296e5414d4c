"""What a study is: its config (``StudyConfig``, read and checked by ``load_study``) and its plan, one
``RunSpec`` per (family, method, seed)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentrl import dataclass_tree
from agentrl.dataclass_tree import knob


@dataclass
class TargetRule:
    rule: Literal["initial", "fixed"] = "initial"
    """``initial``: H_tgt = scale × the warm start's measured entropy; ``fixed``: H_tgt = value."""
    scale: float = 1.0
    """Multiplier on the measured initial entropy."""
    value: float | None = None
    """H_tgt in nats when ``rule = fixed``."""
    probe_prompts: int = 16
    """Training prompts (× ``rollout.group_size`` episodes) the initial entropy is measured on."""
    probe: Literal["run_seeds", "sft_seed"] = "run_seeds"
    """Whose training prompts: ``run_seeds`` = an equal share from each RL seed's task list (what
    the runs start on); ``sft_seed`` = the warm start's own task list (which it may have memorised;
    the committed study used it, see study.md)."""


@dataclass
class Reduced:
    """What ``--reduced`` keeps: the smoke-sized study a test runs. It writes into ``OUTPUT/reduced``
    and ``REPORT/reduced`` and archives nothing, apart from the full study's runs."""

    families: list[str] = field(default_factory=list)
    """Families to run (empty: the first)."""
    methods: list[str] = field(default_factory=list)
    """Methods to run (empty: all)."""
    seeds: list[int] = field(default_factory=lambda: [0])
    steps: int = 8
    eval_tasks: int = 16


@dataclass
class StudyConfig:
    name: str = "entropy-study"
    output_dir: str = "runs/study"
    """Where the runs go: ``OUTPUT/FAMILY/METHOD/sSEED``."""
    report_dir: str = "runs/study/report"
    """Where ``results.md`` and its PNGs (``img/``) are written."""
    families: dict[str, str] = field(default_factory=dict)
    """Family name -> the agentrl config it trains with (a normal ``agentrl train`` config)."""
    family_overrides: dict[str, list[str]] = field(default_factory=dict)
    """Extra dotted overrides per family."""
    methods: dict[str, list[str]] = field(default_factory=dict)
    """Method label -> dotted overrides that make it (e.g. ``[algorithm.name=dapo]``)."""
    extra_methods: dict[str, list[str]] = field(default_factory=dict)
    """More methods, run after every run of ``methods`` (seeds outermost again), so that a study cut
    short by its budget has the required methods on every seed and the extras on the seeds that fit."""
    overrides: list[str] = field(default_factory=list)
    """Dotted overrides for every run."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 30
    """RL steps per run."""
    sft_seed: int = 0
    """Seed of the shared warm start of each family."""
    target: TargetRule = field(default_factory=TargetRule)
    band: tuple[float, float] = (0.5, 1.5)
    """The entropy band, as multiples of H_tgt."""
    warmup_steps: int = 3
    """Steps excluded from the band fraction (the controller needs a few steps to act)."""
    eval_k: int = 8
    """Samples per held-out task at the end: mean@k, and pass@j for every j ≤ k (unbiased
    estimator), the curve the report plots."""
    pass_k: int | None = None
    """The pass@j the tables show (≤ ``eval_k``); None = ``eval_k``."""
    eval_sampling: dict[str, list[str]] = field(default_factory=dict)
    """More held-out evaluations of every run and of the warm start, by name, each a list of
    ``eval.*`` overrides of the one above: ``{top_p_0.7: [eval.top_p=0.7], greedy:
    [eval.temperature=0, eval.k=1]}``. The report compares the methods at each (paired by seed)."""
    eval_tasks: int = 32
    parallel: int = knob(0, ge=0)
    """Runs at once. 0 = the cores idle when the study starts: the cores less those other processes
    keep busy over a second (``/proc/stat``), rounded, at least 1 (2 on an idle 2-core machine, 1
    beside one busy process). Each run
    gets ``run.threads`` torch threads when the overrides set it, else cores / parallel."""
    checkpoint_every: int = 0
    """RL steps between checkpoints of each run: a run the study was stopped in continues from its
    newest one. 0 = none: a stopped run starts over (the tiny-model runs take minutes; a real model's
    take hours, so its studies set this)."""
    archive_dir: str | None = None
    """Where each finished run's record is kept, small enough to commit (``study/archive.py``): a
    study on a machine without its run directories restores the records instead of rerunning them.
    None = no archive."""
    section_in: str | None = None
    """Also write the report as a section of this markdown file (``study/sections.py``), e.g.
    ``docs/results.md`` for a study that belongs beside another study's results; that file's own study
    keeps the section when it rewrites the file. None = the report in ``report_dir`` only."""
    reduced: Reduced = field(default_factory=Reduced)


@dataclass
class RunSpec:
    family: str
    method: str
    seed: int
    overrides: list[str]
    out: str
    eval_sampling: dict[str, list[str]] = field(default_factory=dict)
    """The study's ``eval_sampling``: the evaluations after the main one."""


def load_study(path: str | Path, overrides: Sequence[str] = (), reduced: bool = False) -> StudyConfig:
    """Read and check a study config (unknown keys and bad types name the key and the choices)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    ours, every_run = split_overrides(overrides)
    if ours:
        dotted = OmegaConf.to_container(OmegaConf.from_dotlist(ours), resolve=True)
        raw = OmegaConf.to_container(OmegaConf.merge(raw, dotted), resolve=True)
    if every_run:  # after the file's own: the command line wins
        assert isinstance(raw, dict)
        raw = {**raw, "overrides": [*(raw.get("overrides") or []), *every_run]}
    values, errors = dataclass_tree.check_tree(raw, StudyConfig, str(path))
    if errors:
        raise ValueError("\n".join(errors))
    cfg = dataclass_tree.build(StudyConfig, _complete(StudyConfig(), values))
    if not cfg.families or not cfg.methods:
        raise ValueError(f"{path}: a study needs at least one entry in 'families' and in 'methods'")
    if set(cfg.methods) & set(cfg.extra_methods):
        raise ValueError(
            f"{path}: {sorted(set(cfg.methods) & set(cfg.extra_methods))} in both 'methods' and 'extra_methods'"
        )
    for name, over in cfg.eval_sampling.items():
        if not over or any(not o.startswith("eval.") or "=" not in o for o in over):
            raise ValueError(
                f"{path}: eval_sampling.{name} must be a list of eval.KEY=VALUE overrides, got {over}"
            )
    if cfg.pass_k is not None and not 1 <= cfg.pass_k <= cfg.eval_k:
        raise ValueError(f"{path}: pass_k={cfg.pass_k} must be between 1 and eval_k={cfg.eval_k}")
    if cfg.target.rule == "fixed" and cfg.target.value is None:
        raise ValueError(f"{path}: target.rule=fixed needs target.value")
    if reduced:
        cfg = _reduce(cfg, path)
    return cfg


def runs_at_once(study: StudyConfig, window_s: float = 1.0) -> int:
    """``parallel``, with 0 resolved from the cores idle now (see ``StudyConfig.parallel``)."""
    if study.parallel:
        return study.parallel
    cores = os.cpu_count() or 1
    return max(1, min(cores, round(cores - busy_cores(window_s))))


def busy_cores(window_s: float = 1.0) -> float:
    """How many cores other processes keep busy: the non-idle share of ``/proc/stat`` over
    ``window_s`` times the cores (the 1-minute load average where there is no ``/proc/stat``: it
    also counts work that ended up to a minute ago, such as a test run or an install)."""
    import time

    def sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    first = sample()
    if first is None:
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    time.sleep(window_s)
    second = sample()
    assert second is not None
    total, idle = second[0] - first[0], second[1] - first[1]
    return (os.cpu_count() or 1) * (1 - idle / total) if total > 0 else 0.0


def run_threads(study: StudyConfig, parallel: int) -> int:
    """Torch threads per run: the last ``run.threads=N`` of the overrides, else cores / parallel."""
    given = [o.split("=", 1)[1] for o in study.overrides if o.split("=", 1)[0] == "run.threads"]
    if given and given[-1] not in ("null", "None", ""):
        return int(given[-1])
    return max(1, (os.cpu_count() or 1) // max(1, parallel))


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """The command line's dotted overrides: those of the study's own keys (``parallel=1``,
    ``reduced.steps=20``), and those of a run's config (``run.threads=1``, ``trainer.lr=1e-5``: the
    first part names a section of ``agentrl.config.Config`` that is not a study key), which join
    ``overrides`` and so reach every run, warm start and probe."""
    from agentrl.config import Config

    study_keys = {f.name for f in dataclasses.fields(StudyConfig)}
    run_sections = {f.name for f in dataclasses.fields(Config)} - study_keys
    ours: list[str] = []
    every_run: list[str] = []
    for item in overrides:
        head = item.split("=", 1)[0].split(".", 1)[0].lstrip("+~")
        (every_run if head in run_sections else ours).append(item)
    return ours, every_run


def _complete(default: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The default dataclass tree as a dict, with the checked values of ``given`` merged in."""
    out = asdict(default)

    def merge(base: dict[str, Any], upd: dict[str, Any]) -> None:
        for k, v in upd.items():
            if (
                isinstance(v, dict)
                and isinstance(base.get(k), dict)
                and dataclass_tree.is_section(type(getattr(default, k, None)))
            ):
                merge(base[k], v)
            else:
                base[k] = v

    merge(out, given)
    return out


def _reduce(cfg: StudyConfig, path: str | Path) -> StudyConfig:
    r = cfg.reduced
    fams = r.families or list(cfg.families)[:1]
    meths = r.methods or list(cfg.methods)
    pools = ((fams, cfg.families, "families"), (meths, {**cfg.methods, **cfg.extra_methods}, "methods"))
    for name, pool, what in pools:
        unknown = [x for x in name if x not in pool]
        if unknown:
            raise ValueError(f"{path}: reduced.{what} names {unknown}; valid: {sorted(pool)}")
    every = {**cfg.methods, **cfg.extra_methods}
    cfg.families = {k: cfg.families[k] for k in fams}
    cfg.methods = {k: every[k] for k in meths}
    cfg.extra_methods = {}
    cfg.seeds, cfg.steps, cfg.eval_tasks = list(r.seeds), r.steps, r.eval_tasks
    # apart from the full study: a reduced run's result must never pass for a finished full run
    cfg.output_dir = str(Path(cfg.output_dir) / "reduced")
    cfg.report_dir = str(Path(cfg.report_dir) / "reduced")
    cfg.archive_dir = None
    cfg.section_in = None
    return cfg


# ------------------------------------------------------------------------------------- planning
def family_overrides(study: StudyConfig, family: str) -> list[str]:
    """Overrides every run of ``family`` shares (the warm start and the probe use them too)."""
    return [
        *study.overrides,
        *study.family_overrides.get(family, []),
        f"sft.seed={study.sft_seed}",
        f"eval.k={study.eval_k}",
        f"eval.num_tasks={study.eval_tasks}",
    ]


def plan(study: StudyConfig, targets: dict[str, float]) -> list[RunSpec]:
    """Every (family, method, seed) run, seeds outermost so that a partial study is balanced: the
    ``methods`` first, then the ``extra_methods``."""
    runs = []
    for group in (study.methods, study.extra_methods):
        runs += _plan_group(study, targets, group)
    return runs


def _plan_group(
    study: StudyConfig, targets: dict[str, float], methods: dict[str, list[str]]
) -> list[RunSpec]:
    runs = []
    for seed in study.seeds:
        for family in study.families:
            for method, m_over in methods.items():
                out = str(Path(study.output_dir) / family / method / f"s{seed}")
                runs.append(
                    RunSpec(
                        family,
                        method,
                        seed,
                        [
                            *family_overrides(study, family),
                            *m_over,
                            f"run.seed={seed}",
                            f"trainer.total_steps={study.steps}",
                            f"algorithm.stare.target_entropy={targets[family]:.6g}",
                            f"run.output_dir={out}",
                            f"run.name={study.name}-{family}-{method}-s{seed}",
                            f"trainer.checkpoint_every={study.checkpoint_every}",
                            "run.resume=true",  # continue a stopped run, or start over without a checkpoint
                        ],
                        out,
                        dict(study.eval_sampling),
                    )
                )
    return runs
