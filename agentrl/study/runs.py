"""Running a study: every run its own subprocess (``python -m agentrl.study``), ``parallel`` at a time,
archived as it finishes; a stopped study stops its runs at their step's checkpoint; then the report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agentrl.assembly import build, components, evaluate, make_trainer
from agentrl.config import load_config
from agentrl.study import archive, sections
from agentrl.study.prep import extra_evaluations, prepare_family, weights_digest
from agentrl.study.report import write_report
from agentrl.study.spec import RunSpec, StudyConfig, plan, run_threads, runs_at_once
from agentrl.timeouts import start_thread
from agentrl.training.evaluation import pass_at_k_curve
from agentrl.training.run_state import DiskFull
from agentrl.training.trainer import stop_after_step_on_signal
from agentrl.transcripts import read_metrics


def run_one(spec: RunSpec, config_path: str) -> dict[str, Any]:
    """Train one (family, method, seed) and evaluate it at the end; writes ``result.json``."""

    cfg = load_config(config_path, spec.overrides)
    trainer = make_trainer(cfg, log=lambda s: print(s, flush=True))
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
    extra = extra_evaluations(
        config_path, spec.overrides, spec.eval_sampling, trainer.engine, trainer.tokenizer, tasks
    )
    eval_seconds = time.perf_counter() - t_eval
    result = {
        **asdict(spec),
        "steps": len(history),
        "seconds": train_seconds + eval_seconds,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "policy_tokens": sum(h.get("length/policy_tokens_total", 0.0) for h in history),
        "final_eval": final,
        "extra_evals": extra,
        "pass_curve": pass_at_k_curve(episodes, cfg.eval.k),
        "warm_start_sha256": weights_digest(build.policy_path(cfg, log=lambda _: None)),
        "status": "ok",
    }
    Path(spec.out, "result.json").write_text(json.dumps(result, indent=1))
    return result


def _launch(spec: RunSpec, config_path: str, threads: int) -> subprocess.Popen:
    Path(spec.out).mkdir(parents=True, exist_ok=True)
    Path(spec.out, "failed.json").unlink(missing_ok=True)  # an earlier attempt's mark; this one decides anew
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env["AGENTRL_TORCH_THREADS"] = str(threads)
    env["AGENTRL_STUDY_PID"] = str(os.getpid())  # the run stops when its parent is no longer this
    payload = json.dumps({"spec": asdict(spec), "config": config_path})
    log = open(Path(spec.out) / "log.txt", "a")  # noqa: SIM115 - closed with the process below
    # its own session: a Ctrl-C at the terminal reaches the study, which stops its runs once (below);
    # a study that dies without doing so (SIGKILL) is noticed by the run itself (``child_main``)
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
    auto = " (parallel=0: the cores idle at the start)" if not study.parallel else ""
    study = dataclasses.replace(study, parallel=runs_at_once(study))  # before its own work loads the cores
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
    threads = run_threads(study, study.parallel)
    how = f", {study.parallel} at a time with {threads} torch thread(s) each{auto}"
    log(
        f"study: {len(runs)} runs, {len(runs) - len(todo)} already done"
        + (" (report only)" if only_report else how)
    )
    if only_report:
        todo = []
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
            full = proc.returncode == DiskFull.exit_code
            status = (
                "ok"
                if proc.returncode == 0
                else f"FAILED (exit {proc.returncode}{': the disk is full' * full}, see {spec.out}/log.txt)"
            )
            if proc.returncode != 0:
                with contextlib.suppress(OSError):  # a full disk may refuse the mark too; the log says it
                    Path(spec.out, "failed.json").write_text(
                        json.dumps({**asdict(spec), "status": "failed", "exit": proc.returncode})
                    )
            elif study.archive_dir:
                status += f", recorded in {archive.archive_run(study.archive_dir, spec)}"
            log(
                f"[{done}/{total}] {spec.family} {spec.method} seed {spec.seed}: {status} "
                f"in {time.perf_counter() - started:.0f} s"
            )
            if full and todo:  # every later run would meet the same disk
                log(
                    f"study: the disk is full, so {len(todo)} run(s) not started; free space and run the "
                    "same command: it continues every run from its newest checkpoint"
                )
                todo.clear()


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


def stop_when_orphaned(poll_s: float = 0.5) -> None:
    """A daemon thread: when this run's study is gone (its parent changed: the study was killed),
    SIGTERM to this process once, so the run finishes its step and checkpoints it. (The kernel's
    parent-death signal is not used: it can arrive once per exiting thread of the parent, and a
    second SIGTERM means "stop now".) The study is the pid it put in ``AGENTRL_STUDY_PID``, not the
    parent this process finds once its imports are done: a study killed in those seconds has already
    handed the run to init, and the run would train on alone."""

    parent = int(os.environ.get("AGENTRL_STUDY_PID") or os.getppid())

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        print("the study is gone: this run stops after its step", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    start_thread(watch, "study-watch")


def child_main(payload: str) -> int:
    stop_when_orphaned()
    import torch

    torch.set_num_threads(int(os.environ.get("AGENTRL_TORCH_THREADS", "1")))
    data = json.loads(payload)
    try:
        run_one(RunSpec(**data["spec"]), data["config"])
    except KeyboardInterrupt:
        print("run stopped; the study continues it from its newest checkpoint", flush=True)
        return 130
    except DiskFull as e:  # the study stops launching runs; rerunning it continues this one
        print(f"agentrl: {e} (or rerun the study, which does so)", flush=True)
        return e.exit_code
    return 0
