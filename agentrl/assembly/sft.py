"""The SFT warm start's assembly from the config: its demonstrations (``sft.demos``, or the
environment's solver on training tasks), the model it trains, and the call of the SFT loop
(``training/sft.py``)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from agentrl.assembly import components
from agentrl.config import Config
from agentrl.env import Task
from agentrl.env.demos import load_demonstrations, with_summaries
from agentrl.models.chat import ChatRenderer
from agentrl.models.checkpointing import checkpointing
from agentrl.rollout.context import SUMMARY_PROMPT
from agentrl.timeouts import call_with_timeout
from agentrl.training import lora
from agentrl.training.prompt_fit import fitting_examples, loaded_context
from agentrl.training.sft import (
    SFTResult,
    save_warm_start,
    sft_seed,
    sft_train,
    tokenize_conversation,
    trains_adapters,
)


def build_examples(
    cfg: Config, tokenizer: Any, log: Callable[[str], None] = print, context: int | None = None
) -> list[tuple[list[int], list[int]]]:
    """SFT examples from ``sft.demos`` (JSONL) or from the environment's solver on training tasks.
    When there are fewer tasks than ``sft.num_demos``, tasks repeat, and the log says so. Those
    longer than the model's ``context`` are left out by name (``prompt_fit.fitting_examples``)."""
    env = components.env_factory(cfg)()
    try:
        renderer = ChatRenderer(
            tokenizer, env.tool_schemas() or None, cfg.rollout.tools_prompt, env.tool_format
        )
    finally:
        env.close()
    if cfg.sft.demos:
        demos = load_demonstrations(cfg.sft.demos)
        names = [f"{cfg.sft.demos} demonstration {i + 1}" for i in range(len(demos))]
    else:
        tasks = demo_tasks(cfg)
        if len(tasks) < cfg.sft.num_demos:
            log(
                f"SFT warm start: sft.num_demos={cfg.sft.num_demos} but only {len(tasks)} training tasks, so "
                f"each task is demonstrated ~{cfg.sft.num_demos / len(tasks):.1f} times (solvers sample among "
                "the solutions where several exist). Raise data.num_train for more distinct tasks, or lower "
                "sft.num_demos."
            )
        rng = random.Random(sft_seed(cfg.sft, cfg.run.seed))
        tasks = [
            tasks[i % len(tasks)]
            for i in rng.sample(range(max(len(tasks), cfg.sft.num_demos)), cfg.sft.num_demos)
        ]
        demos = solver_demonstrations(cfg, type(env), tasks)
        one_each = len(demos) == len(tasks)
        names = [
            f"the demonstration of task {tasks[i].id!r}" if one_each else f"demonstration {i + 1}"
            for i in range(len(demos))
        ]
        if one_each:
            demos, names = summary_demonstrations(cfg, type(env), tasks, demos, names)
    return fitting_examples(
        cfg.rollout.max_episode_tokens,
        [tokenize_conversation(renderer, d) for d in demos],
        names,
        context,
        log,
    )


def summary_demonstrations(
    cfg: Config, env_cls: Any, tasks: list[Task], demos: list[Any], names: list[str]
) -> tuple[list[Any], list[str]]:
    """With ``rollout.context.policy: compact`` and an environment that says what a summary should
    keep (``summary_demonstration(task, messages)``), every demonstration also gives the
    compaction samples around it (``agentrl.env.demos.with_summaries``): the summaries are warmed up
    with the rest. Otherwise the demonstrations as they are."""
    solver = getattr(env_cls, "summary_demonstration", None)
    if cfg.rollout.context.policy != "compact" or solver is None:
        return demos, names
    request = cfg.rollout.context.summary_prompt or env_cls.summary_prompt or SUMMARY_PROMPT
    out, out_names = [], []
    for task, demo, name in zip(tasks, demos, names):
        for k, d in enumerate(with_summaries(demo, functools.partial(solver, task), request)):
            out.append(d)
            out_names.append(name if k == 0 else f"{name}, compaction sample {k}")
    return out, out_names


def solver_demonstrations(cfg: Config, env_cls: Any, tasks: list[Any]) -> list[Any]:
    """The environment's solver demonstrations of ``tasks``: user code, bounded as rollouts bound it
    (``timeouts.env_step_s`` for the whole call; ``WaitTimeout`` naming the environment past it)."""
    n, limit = len(tasks), cfg.timeouts.env_step_s
    return call_with_timeout(
        lambda: env_cls.demonstrations(tasks, seed=sft_seed(cfg.sft, cfg.run.seed)),
        limit,
        f"environment {cfg.env.name!r}: demonstrations() of {n} task(s)",
        f"timeouts.env_step_s={limit:g}s",
    )


# A separate task stream for demonstrations kept off RL's tasks (an offset far from any run seed).
_DEMO_STREAM = 1_000_003


def demo_tasks(cfg: Config) -> list[Task]:
    """The tasks demonstrations are made from: the SFT seed's training tasks, or, with
    ``sft.exclude_train_seeds``, tasks from a separate stream minus every task whose prompt RL
    trains on under those run seeds. Raises when the exclusion leaves nothing."""
    seeds = list(cfg.sft.exclude_train_seeds)
    sized = cfg
    if cfg.sft.num_tasks is not None:  # the pool's size, not RL's
        sized = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, num_train=cfg.sft.num_tasks))
    if not seeds:
        return components.load_tasks(sized, "train", seed=sft_seed(cfg.sft, cfg.run.seed))
    taken = {t.prompt for s in seeds for t in components.load_tasks(cfg, "train", seed=s)}
    pool = components.load_tasks(sized, "train", seed=sft_seed(cfg.sft, cfg.run.seed) + _DEMO_STREAM)
    kept = [t for t in pool if t.prompt not in taken]
    if not kept:
        raise ValueError(
            f"sft.exclude_train_seeds={seeds}: all {len(pool)} candidate tasks are among RL's training "
            "tasks (the environment's problem space is too small to keep them apart)"
        )
    return kept


def run_sft(cfg: Config, base_path: str, out_dir: Path, log: Callable[[str], None] = print) -> SFTResult:
    """Warm-start ``base_path`` on demonstrations and save the result (HF format) to ``out_dir``."""
    torch.manual_seed(sft_seed(cfg.sft, cfg.run.seed))
    model, tokenizer = components.load_model(cfg, base_path)
    context = loaded_context(model)
    adapters = trains_adapters(cfg.sft, cfg.model.lora)
    if cfg.model.gradient_checkpointing:  # as RL's update does (then no shared-prefix forward: no KV cache)
        checkpointing(model)
    if adapters:  # only the adapters train; merged into the base below, so the warm start is a plain model
        model = lora.apply(model, cfg.model.lora, seed=sft_seed(cfg.sft, cfg.run.seed))
        log(f"SFT warm start trains LoRA adapters (sft.weights={cfg.sft.weights}): {lora.describe(model)}")
    examples = build_examples(cfg, tokenizer, log, context)
    holdout, examples = _split_holdout(cfg, examples)
    steps = cfg.sft.steps or max(1, cfg.sft.epochs * len(examples) // cfg.sft.batch_size)
    n_tok = sum(sum(m) for _, m in examples)
    held = (
        f", {len(holdout)} held out (loss every {cfg.sft.eval_every} steps, best weights kept)"
        if holdout
        else ""
    )
    log(f"SFT warm start: {len(examples)} demonstrations ({n_tok} assistant tokens), {steps} steps{held}")
    with sft_progress(steps, log) as on_step:
        result = sft_train(
            model,
            examples,
            steps=steps,
            lr=cfg.sft.lr,
            batch_size=cfg.sft.batch_size,
            seed=sft_seed(cfg.sft, cfg.run.seed),
            pad_id=tokenizer.pad_token_id or 0,
            on_step=on_step,
            holdout=holdout,
            eval_every=cfg.sft.eval_every,
            patience=cfg.sft.patience,
            micro_batch_size=cfg.sft.micro_batch_size,
            share_prefix=not cfg.model.gradient_checkpointing,
        )
    if adapters:
        model = model.merge_and_unload()  # type: ignore[operator]  # W + (α/r)·B A merged; adapters removed
    save_warm_start(out_dir, model, tokenizer, result, len(examples), len(holdout))
    if result.holdout_losses:
        best = min(loss for _, loss in result.holdout_losses)
        losses = " ".join(f"{n}:{v:.3f}" for n, v in result.holdout_losses)
        log(f"SFT held-out loss: {losses}; kept step {result.best_step} (held-out loss {best:.3f})")
    log(f"SFT done in {result.seconds:.1f}s, {result.steps} steps, final loss {result.final_loss:.3f}")
    return result


@contextlib.contextmanager
def sft_progress(steps: int, log: Callable[[str], None]) -> Iterator[Callable[[int, float], None]]:
    """The warm start's ``on_step``: a progress bar on a terminal, and a plain line every tenth of
    the steps for logs and CI."""
    with Progress(
        TextColumn("[bold]SFT warm start"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeRemainingColumn(),
        transient=False,
    ) as progress:
        task = progress.add_task("sft", total=steps, loss=float("nan"))
        every = max(1, steps // 10)

        def on_step(i: int, loss: float) -> None:
            progress.update(task, completed=i + 1, loss=loss)
            if not progress.console.is_terminal and (i + 1) % every == 0:
                log(f"SFT step {i + 1}/{steps}  loss {loss:.3f}")

        yield on_step


def _split_holdout(
    cfg: Config, examples: list[tuple[list[int], list[int]]]
) -> tuple[list[tuple[list[int], list[int]]], list[tuple[list[int], list[int]]]]:
    """(held out, trained on): a seeded split, so the held-out demonstrations are never trained on."""
    if cfg.sft.holdout <= 0:
        return [], examples
    random.Random(sft_seed(cfg.sft, cfg.run.seed) + 1).shuffle(examples)
    n_held = max(1, round(cfg.sft.holdout * len(examples)))
    if n_held >= len(examples):
        raise ValueError(f"sft.holdout={cfg.sft.holdout} leaves no demonstration to train on")
    return examples[:n_held], examples[n_held:]
