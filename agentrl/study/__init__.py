"""``agentrl study CONFIG``: the entropy-stability study, one command from configs to a report.

Several methods (GRPO-ds, DAPO, STARE variants and controllers, ...) train on the same task families
with the same seeds, warm starts, data and budgets; the report (``study_report.py``) compares their
entropy, reward, length and held-out accuracy.

What is shared and what varies:
- **One warm start per family**, made with ``sft.seed`` fixed (``study.sft_seed``), so every
  method and RL seed starts from the same weights (and it is cached: a rerun skips SFT).
- **One target entropy per family**: ``target.rule = initial`` measures the warm start's token-mean
  entropy H0 over the policy tokens of fresh rollouts on training prompts (one exact forward pass
  over ``target.probe_prompts × group_size`` episodes) and sets H_tgt = ``target.scale`` × H0:
  "hold the entropy the policy starts with". ``rule = fixed`` uses ``target.value``.
- **RL seeds** change the rollout sampling and task order, the same for every method.

Execution: every run is its own subprocess (a crash marks that run failed and the study goes on;
its log is in ``RUN/log.txt``), ``parallel`` at a time, each with ``cores / parallel`` torch threads.
A finished run leaves ``result.json`` and is not rerun, so a killed study resumes where it stopped.
Every run starts as a resume (``run.resume=true``): a run cut short continues from its newest
checkpoint (every ``checkpoint_every`` steps), or starts over when it has none, its partial lines cut.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentrl import dataclass_tree
from agentrl.config import Config, load_config
from agentrl.env import Task
from agentrl.models import resolve_model_path
from agentrl.rollout import components
from agentrl.rollout.runner import EpisodeRequest
from agentrl.study import archive, sections
from agentrl.study.report import write_report
from agentrl.training import build
from agentrl.training.batch import batch_forward, build_batch
from agentrl.training.evaluation import evaluate, pass_at_k_curve
from agentrl.training.trainer import Trainer, stop_after_step_on_signal
from agentrl.transcripts import read_metrics


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
    eval_tasks: int = 32
    parallel: int = 2
    """Runs at once."""
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


def load_study(path: str | Path, overrides: Sequence[str] = (), reduced: bool = False) -> StudyConfig:
    """Read and check a study config (unknown keys and bad types name the key and the choices)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    if overrides:
        dotted = OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides)), resolve=True)
        raw = OmegaConf.to_container(OmegaConf.merge(raw, dotted), resolve=True)
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
    if cfg.pass_k is not None and not 1 <= cfg.pass_k <= cfg.eval_k:
        raise ValueError(f"{path}: pass_k={cfg.pass_k} must be between 1 and eval_k={cfg.eval_k}")
    if cfg.target.rule == "fixed" and cfg.target.value is None:
        raise ValueError(f"{path}: target.rule=fixed needs target.value")
    if reduced:
        cfg = _reduce(cfg, path)
    return cfg


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
                    )
                )
    return runs


# ---------------------------------------------------------------------------- family preparation
def probe_tasks(cfg: Config, study: StudyConfig) -> list[Task]:
    """The training prompts H0 is measured on (``target.probe``): an equal share of each RL seed's
    task list, or the first ``probe_prompts`` of the warm start's."""

    n = study.target.probe_prompts
    if study.target.probe == "sft_seed":
        return components.load_tasks(cfg, "train", seed=study.sft_seed)[:n]
    share = -(-n // len(study.seeds))  # ceil
    tasks = [t for s in study.seeds for t in components.load_tasks(cfg, "train", seed=s)[:share]]
    return tasks[:n]


def prepare_family(
    study: StudyConfig, family: str, log: Callable[[str], None] = print, report_only: bool = False
) -> dict[str, Any]:
    """Warm start (cached), the initial entropy H0, H_tgt, and the warm start's held-out accuracy.
    Cached in ``OUTPUT/FAMILY/prep.json`` (keyed by the warm start's cache key and the probe
    settings). ``report_only``: a cached (or archived) measurement is returned without building the
    warm start, which only the runs and the probe need."""
    cfg = load_config(study.families[family], family_overrides(study, family))
    base = resolve_model_path(cfg.model.path)
    key = _prep_key(study, build.warm_start_dir(cfg, base))
    if report_only:
        cached = _cached_prep(study, family, key, build.warm_start_dir(cfg, base), log)
        if cached is not None:
            return {**cached, "tokenizer": base}
    path = build.policy_path(cfg, log=log)
    cached = _cached_prep(study, family, key, path, log)
    if cached is not None:
        return {**cached, "tokenizer": base}
    prep_file = Path(study.output_dir) / family / "prep.json"
    digest = _weights_digest(path)
    t0 = time.perf_counter()
    model, tokenizer = components.load_model(cfg, path)
    model.eval()
    engine = build.build_engine(cfg, model, tokenizer, path)
    episodes, h0, h0_branching = _probe_entropy(cfg, study, model, engine, tokenizer)
    h_tgt = study.target.value if study.target.rule == "fixed" else study.target.scale * h0
    test = components.load_tasks(cfg, cfg.eval.split)[: study.eval_tasks]
    metrics, eval_episodes = evaluate(cfg, engine, tokenizer, test, k=study.eval_k)
    prep = {
        "key": key,
        "family": family,
        "config": study.families[family],
        "policy": path,
        "h0": h0,
        "h0_branching": h0_branching,
        "target_entropy": h_tgt,
        "probe_episodes": len(episodes),
        "probe_reward": sum(e.reward for e in episodes) / max(len(episodes), 1),
        "initial_eval": metrics,
        "initial_pass_curve": pass_at_k_curve(eval_episodes, study.eval_k),
        "sft": _sft_record(path),
        "policy_sha256": digest,
        "seconds": time.perf_counter() - t0,
    }
    prep_file.parent.mkdir(parents=True, exist_ok=True)
    prep_file.write_text(json.dumps(prep, indent=1))
    if study.archive_dir:
        archive.archive_prep(study.archive_dir, family, prep_file)
    log(f"{family}: H0 = {h0:.4f} nats (branching {h0_branching:.3f}), H_tgt = {h_tgt:.4f}; probe reward "
        f"{prep['probe_reward']:.3f}; warm start held-out mean@{study.eval_k} {metrics['eval/mean@k']:.3f}, "
        f"pass@{study.eval_k} {metrics['eval/pass@k']:.3f}")  # fmt: skip
    return {**prep, "tokenizer": base}


def _prep_key(study: StudyConfig, warm_start: str) -> dict[str, Any]:
    """What a family's measurement depends on. The warm start by its cache key (its directory's
    name), not its path: a record made on another machine, with another cache root, is the same."""
    target = asdict(study.target)
    if target["probe"] == "sft_seed":  # the rule before the option existed: keep its cached results
        del target["probe"]
    else:
        target["seeds"] = list(study.seeds)
    return {
        "policy": Path(warm_start).name,
        "target": target,
        "eval": [study.eval_k, study.eval_tasks],
        "version": 3,
    }


def _cached_prep(
    study: StudyConfig, family: str, key: dict, path: str, log: Callable[[str], None]
) -> dict[str, Any] | None:
    """The family's ``prep.json`` (restored from the archive when the run directories are new) if it
    was measured with ``key``; a warning when the warm start at ``path`` has other weights."""
    prep_file = Path(study.output_dir) / family / "prep.json"
    if study.archive_dir and archive.restore_prep(study.archive_dir, family, prep_file):
        log(f"{family}: the warm start's measurements restored from the archive {study.archive_dir}")
    if not prep_file.exists():
        return None
    prep = json.loads(prep_file.read_text())
    if prep.get("key") != key:
        return None
    digest = _weights_digest(path)
    if digest is not None and prep.get("policy_sha256", digest) != digest:
        log(f"WARNING {family}: the warm start rebuilt here ({path}, SHA-256 {digest}) differs from the "
            f"one the study measured (SHA-256 {prep['policy_sha256']}); the report names the runs that "
            "start from it")  # fmt: skip
    return {**prep, "policy": path}


def _probe_entropy(
    cfg: Config, study: StudyConfig, model: Any, engine: Any, tokenizer: Any
) -> tuple[list[Any], float, float]:
    """Fresh episodes on the probe prompts; their policy tokens' mean entropy H0 and its branching
    (top 10 %) part."""
    import torch

    tasks = probe_tasks(cfg, study)
    runner = build.build_runner(cfg, engine, tokenizer, seed=study.sft_seed + 7)
    G = cfg.rollout.group_size
    try:
        reqs = [EpisodeRequest(t, seed=i * G + j, group=f"probe{i}", episode_id=f"probe-{i}-{j}")
                for i, t in enumerate(tasks) for j in range(G)]  # fmt: skip
        episodes = [e for e in runner.run(reqs) if not e.failed]
    finally:
        runner.close()
    batch = build_batch(
        episodes, torch.zeros(len(episodes)), [1.0] * len(episodes), tokenizer.pad_token_id or 0
    )
    with torch.no_grad():
        _, ent = batch_forward(model, batch, cfg.trainer.micro_batch_size, cfg.rollout.temperature)
    h0 = float((ent * batch.mask).sum() / batch.mask.sum().clamp(min=1))
    policy_ent = ent[batch.mask > 0]  # the same "branching" as entropy/branching: the top 10 % of tokens
    h0_branching = float(policy_ent.topk(max(1, int(0.1 * policy_ent.numel()))).values.mean())
    return episodes, h0, h0_branching


def _weights_digest(path: str) -> str | None:
    """SHA-256 of a local model directory's weights; None for a hub name."""
    return archive.weights_sha256(path) if Path(path).is_dir() else None


def _sft_record(path: str) -> dict[str, Any]:
    """What the warm start's SFT did (``sft_result.json``), without the per-step losses."""
    f = Path(path) / "sft_result.json"
    if not f.exists():
        return {}
    rec = json.loads(f.read_text())
    rec.pop("losses", None)
    return rec


# ------------------------------------------------------------------------------------- one run
def run_one(spec: RunSpec, config_path: str) -> dict[str, Any]:
    """Train one (family, method, seed) and evaluate it at the end; writes ``result.json``."""

    cfg = load_config(config_path, spec.overrides)
    trainer = Trainer(cfg, log=lambda s: print(s, flush=True))
    with stop_after_step_on_signal(trainer, trainer.log):
        trainer.train()
    if trainer.stop_requested:  # stopped by the study (or a signal): the checkpoint is its step's
        raise KeyboardInterrupt
    history = read_metrics(trainer.run_dir)  # every step, those before a resume included
    # the steps' own times: a run continued over several invocations counts every step once
    train_seconds = sum(h.get("time/step_s", 0.0) for h in history)
    t_eval = time.perf_counter()
    tasks = components.load_tasks(cfg, cfg.eval.split)[: cfg.eval.num_tasks]
    final, episodes = evaluate(cfg, trainer.engine, trainer.tokenizer, tasks, k=cfg.eval.k)
    eval_seconds = time.perf_counter() - t_eval
    result = {
        **asdict(spec),
        "steps": len(history),
        "seconds": train_seconds + eval_seconds,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "policy_tokens": sum(h.get("length/policy_tokens_total", 0.0) for h in history),
        "final_eval": final,
        "pass_curve": pass_at_k_curve(episodes, cfg.eval.k),
        "warm_start_sha256": _weights_digest(build.policy_path(cfg, log=lambda _: None)),
        "status": "ok",
    }
    Path(spec.out, "result.json").write_text(json.dumps(result, indent=1))
    return result


def _launch(spec: RunSpec, config_path: str, threads: int) -> subprocess.Popen:
    Path(spec.out).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env["AGENTRL_TORCH_THREADS"] = str(threads)
    env["AGENTRL_STUDY_PID"] = str(os.getpid())  # the run stops when its parent is no longer this
    payload = json.dumps({"spec": asdict(spec), "config": config_path})
    log = open(Path(spec.out) / "log.txt", "a")  # noqa: SIM115 - closed with the process below
    # its own session: a Ctrl-C at the terminal reaches the study, which stops its runs once (below);
    # a study that dies without doing so (SIGKILL) is noticed by the run itself (``_child_main``)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.study", payload],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    proc.log_file = log  # type: ignore[attr-defined]
    return proc


def run_study(
    study: StudyConfig,
    log: Callable[[str], None] = print,
    only_report: bool = False,
    prepare_only: bool = False,
) -> Path | None:
    """Prepare every family, run every missing run (``parallel`` at a time), write the report.
    ``prepare_only``: build and measure the warm starts (``OUTPUT/FAMILY/prep.json``), then stop."""

    t0 = time.perf_counter()
    for spec in plan(study, {f: 1.0 for f in study.families}):  # every run's config, before any work
        load_config(study.families[spec.family], spec.overrides)
    preps = {f: prepare_family(study, f, log, report_only=only_report) for f in study.families}
    if prepare_only:
        return None
    runs = plan(study, {f: p["target_entropy"] for f, p in preps.items()})
    if study.archive_dir:
        archive.restore_runs(study.archive_dir, runs, log)
        _archive_finished(study, runs, log)
    todo = [r for r in runs if not Path(r.out, "result.json").exists()]
    log(f"study: {len(runs)} runs, {len(runs) - len(todo)} already done"
        + (" (report only)" if only_report else f", {study.parallel} at a time"))  # fmt: skip
    if only_report:
        todo = []
    threads = max(1, (os.cpu_count() or 1) // max(1, study.parallel))
    active: list[tuple[RunSpec, subprocess.Popen, float]] = []
    try:
        _run_all(todo, active, study, threads, len(runs), log)
    finally:  # interrupted: the running runs finish their step and checkpoint it (resume continues them)
        _stop_runs([proc for _, proc, _ in active], log)
    report = write_report(study, preps, runs, wall_seconds=time.perf_counter() - t0)
    log(f"study report: {report}")
    if study.section_in:
        target = Path(study.section_in)
        sections.embed(target, study.name, sections.section(study.name, report, target))
        log(f"study report: also a section of {target}")
    return report


def _run_all(
    todo: list[RunSpec],
    active: list[tuple[RunSpec, subprocess.Popen, float]],
    study: StudyConfig,
    threads: int,
    total: int,
    log: Callable[[str], None],
) -> None:
    """Run ``todo`` ``study.parallel`` at a time; ``active`` holds the running ones."""
    done = 0
    while todo or active:
        while todo and len(active) < study.parallel:
            spec = todo.pop(0)
            active.append((spec, _launch(spec, study.families[spec.family], threads), time.perf_counter()))
        time.sleep(0.5)
        for item in list(active):
            spec, proc, started = item
            if proc.poll() is None:
                continue
            proc.log_file.close()  # type: ignore[attr-defined]
            active.remove(item)
            done += 1
            status = (
                "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see {spec.out}/log.txt)"
            )
            if proc.returncode != 0:
                Path(spec.out, "failed.json").write_text(
                    json.dumps({**asdict(spec), "status": "failed", "exit": proc.returncode})
                )
            elif study.archive_dir:
                status += f", recorded in {archive.archive_run(study.archive_dir, spec)}"
            log(f"[{done}/{total}] {spec.family} {spec.method} seed {spec.seed}: {status} "
                f"in {time.perf_counter() - started:.0f} s")  # fmt: skip


def _archive_finished(study: StudyConfig, runs: list[RunSpec], log: Callable[[str], None]) -> None:
    """Record the finished runs the archive lacks (finished before it was set, or by an older study)."""
    assert study.archive_dir
    for spec in runs:
        rec = archive.record_dir(study.archive_dir, spec.family, spec.method, spec.seed)
        if Path(spec.out, "result.json").exists() and not (rec / "result.json").exists():
            log(
                f"study: {spec.method} seed {spec.seed} recorded in {archive.archive_run(study.archive_dir, spec)}"
            )


def _stop_runs(procs: list[subprocess.Popen], log: Callable[[str], None]) -> None:
    """SIGTERM once to each run (it finishes its step and checkpoints it), then wait for them; an
    interrupt during the wait leaves them to stop on their own (they notice the study is gone)."""
    if not procs:
        return
    log(
        f"study stopping: {len(procs)} run(s) finish their step and checkpoint it (interrupt again to stop now)"
    )
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait()
        proc.log_file.close()  # type: ignore[attr-defined]


def _stop_when_orphaned(poll_s: float = 0.5) -> None:
    """A daemon thread: when this run's study is gone (its parent changed: the study was killed),
    SIGTERM to this process once, so the run finishes its step and checkpoints it. (The kernel's
    parent-death signal is not used: it can arrive once per exiting thread of the parent, and a
    second SIGTERM means "stop now".) The study is the pid it put in ``AGENTRL_STUDY_PID``, not the
    parent this process finds once its imports are done: a study killed in those seconds has already
    handed the run to init, and the run would train on alone (it did, 2026-11-28)."""
    import threading

    parent = int(os.environ.get("AGENTRL_STUDY_PID") or os.getppid())

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        print("the study is gone: this run stops after its step", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="study-watch", daemon=True).start()


def _child_main(payload: str) -> int:
    _stop_when_orphaned()
    import torch

    torch.set_num_threads(int(os.environ.get("AGENTRL_TORCH_THREADS", "1")))
    data = json.loads(payload)
    try:
        run_one(RunSpec(**data["spec"]), data["config"])
    except KeyboardInterrupt:
        print("run stopped; the study continues it from its newest checkpoint", flush=True)
        return 130
    return 0
