"""The rules that tie config keys together, checked once the config is built and its presets resolved:
each yields ``(key, message)``, the message naming the keys, their values and what would work."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from pathlib import Path

from agentrl.agents import AgentEnvironment
from agentrl.algorithms import registry
from agentrl.config.schema import Config, weighting_name, weighting_settings
from agentrl.engines.registry import ENGINES, engine_record
from agentrl.env import entry_point_errors, import_environment_module, registered
from agentrl.env.demos import load_demonstrations
from agentrl.sync.registry import OBJECT_STORE
from sandboxes import SANDBOXES


def cross_checks(cfg: Config) -> Iterator[tuple[str, str]]:
    """Rules that involve more than one key, as ``(key, message)``."""
    yield from _source_problems(cfg)
    yield from _batch_problems(cfg)
    yield from _mode_problems(cfg)
    yield from _context_problems(cfg)
    ro = cfg.rollout
    reads_gemm = "rollout.cpu_gemm" in engine_record(ro.engine).keys
    if ro.cpu_gemm == "onednn" and (not reads_gemm or (ro.dtype or cfg.model.dtype) != "float32"):
        yield (
            "rollout.cpu_gemm",
            (
                f"rollout.cpu_gemm=onednn applies to the HF engine in float32 on the CPU; this run has "
                f"rollout.engine={ro.engine} in {ro.dtype or cfg.model.dtype}: set rollout.cpu_gemm=mkl (or auto)"
            ),
        )
    empty = [i for i, s in enumerate(cfg.rollout.stop) if not s]
    if empty:
        yield "rollout.stop", f"rollout.stop[{empty[0]}] is an empty string: a stop string must hold text"


def _context_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """``rollout.context``: a budget the policy can act within, and no setting its policy ignores."""
    ro = cfg.rollout
    c = ro.context
    if c.max_tokens is not None and c.max_tokens > ro.max_episode_tokens:
        yield (
            "rollout.context.max_tokens",
            f"rollout.context.max_tokens={c.max_tokens} exceeds rollout.max_episode_tokens="
            f"{ro.max_episode_tokens}, the hard limit of every sample: lower it or raise the other",
        )
    budget = ro.max_episode_tokens if c.max_tokens is None else c.max_tokens
    if c.policy != "stop" and budget <= ro.max_tokens_per_turn:
        yield (
            "rollout.context.max_tokens",
            f"rollout.context.policy={c.policy} acts when the context could not hold another turn of "
            f"rollout.max_tokens_per_turn={ro.max_tokens_per_turn}, but its budget is {budget} tokens: "
            "give the context room for more than one turn",
        )
    if c.policy != "compact":
        for key in ("max_summary_tokens", "summary_prompt"):
            if getattr(c, key) is not None:
                yield (
                    f"rollout.context.{key}",
                    f"rollout.context.{key} is set, but only rollout.context.policy=compact writes a "
                    f"summary (this run has policy={c.policy}): set the policy or drop the key",
                )
    elif c.max_summary_tokens is not None and c.max_summary_tokens > ro.max_episode_tokens:
        yield (
            "rollout.context.max_summary_tokens",
            f"rollout.context.max_summary_tokens={c.max_summary_tokens} exceeds "
            f"rollout.max_episode_tokens={ro.max_episode_tokens}",
        )


def _source_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """Where code runs and where the data comes from."""
    s = cfg.sandbox
    if not SANDBOXES[s.backend].isolated and not s.allow_unisolated:
        isolated = ", ".join(sorted(n for n, r in SANDBOXES.items() if r.isolated))
        yield (
            "sandbox.backend",
            (
                f"sandbox.backend={s.backend!r} runs model-written code with no isolation; set "
                f"sandbox.allow_unisolated=true to accept that risk, or use one of {isolated}"
            ),
        )
    if cfg.data.source != "builtin" and not cfg.data.path:
        yield "data.source", f"data.path is required when data.source={cfg.data.source!r}"
    if cfg.data.source == "builtin":
        for key in ("path", "test_path", "columns"):
            if getattr(cfg.data, key):
                yield (
                    f"data.{key}",
                    f"data.{key} is set, but data.source=builtin takes the environment's own tasks and ignores "
                    "it: set data.source=file (or hub) to train on that data",
                )


def _batch_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """The shape of a step's batch, its sampling and the warm start's schedule."""
    ro, alg = cfg.rollout, cfg.algorithm
    if ro.max_tokens_per_turn > ro.max_episode_tokens:
        yield (
            "rollout.max_tokens_per_turn",
            (
                f"rollout.max_tokens_per_turn={ro.max_tokens_per_turn} exceeds "
                f"rollout.max_episode_tokens={ro.max_episode_tokens}"
            ),
        )
    if ro.prompts_per_step % cfg.trainer.mini_batches_per_step:
        yield (
            "trainer.mini_batches_per_step",
            (
                f"rollout.prompts_per_step={ro.prompts_per_step} must be divisible by "
                f"trainer.mini_batches_per_step={cfg.trainer.mini_batches_per_step} (mini-batches split the groups evenly)"
            ),
        )
    if alg.dynamic_sampling and ro.group_size < 2:
        yield (
            "rollout.group_size",
            (
                "algorithm.dynamic_sampling needs rollout.group_size >= 2 (a group of one never has a reward spread)"
            ),
        )
    if alg.overlong.enabled and alg.overlong.cache_length >= alg.overlong.max_length:  # type: ignore[operator]
        yield (
            "algorithm.overlong.cache_length",
            (
                f"algorithm.overlong.cache_length={alg.overlong.cache_length} must be below "
                f"algorithm.overlong.max_length={alg.overlong.max_length}"
            ),
        )
    if cfg.sft.weights == "lora" and cfg.model.lora.rank == 0:
        yield (
            "sft.weights",
            "sft.weights=lora trains adapters with model.lora's settings, but model.lora.rank is 0: set "
            "model.lora.rank (e.g. 16) or sft.weights=full",
        )
    for key, value, unset in (("patience", cfg.sft.patience, 0), ("eval_every", cfg.sft.eval_every, 50)):
        if value != unset and cfg.sft.holdout == 0:
            yield (
                f"sft.{key}",
                f"sft.{key}={value} acts on the held-out loss, but sft.holdout=0 holds nothing out: set "
                f"sft.holdout (e.g. 0.1) or leave sft.{key} at {unset}",
            )


def _mode_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """Sync or async, the weight transport, colocation and the method's own rules."""
    ro = cfg.rollout
    if cfg.trainer.chunked_head == "always" and cfg.trainer.strategy == "fsdp2":
        yield (
            "trainer.chunked_head",
            "trainer.chunked_head=always applies the output head outside the model's forward, where FSDP2 "
            "has not gathered it: use trainer.chunked_head=auto (the whole logits under FSDP2) or trainer.strategy=ddp",
        )
    if cfg.trainer.mode == "async" and ro.on_stale == "drop" and ro.max_staleness == 0:
        yield (
            "rollout.on_stale",
            "rollout.on_stale=drop with rollout.max_staleness=0 drops every batch sampled during an update: "
            "use rollout.on_stale=wait (K = 0 then trains exactly like trainer.mode=sync) or max_staleness >= 1",
        )
    if ro.sync.transport != OBJECT_STORE and ro.workers == 0:
        yield (
            "rollout.sync.transport",
            f"rollout.sync.transport={ro.sync.transport} sends the weights from the trainer to Ray rollout "
            "workers, but rollout.workers=0 runs the engine in the trainer's process (it takes the tensors "
            f"directly): set rollout.workers >= 1 or rollout.sync.transport={OBJECT_STORE}",
        )
    yield from _engine_placement_problems(cfg)
    if ro.colocate.sleep:
        yield from _colocate_problems(cfg)
    weighting = registry.WEIGHTINGS[weighting_name(cfg)]
    if weighting.check is not None:  # the selected method's own rules (its record)
        yield from weighting.check(weighting_settings(cfg), cfg.trainer)


def _engine_placement_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """Engine settings that only some engines or placements use: the HF engine's poll interval, the
    workers' GPU share, tensor parallelism's limits."""
    ro = cfg.rollout
    record = engine_record(ro.engine)
    if ro.lean_decode != "auto" and "rollout.lean_decode" not in record.keys:
        yield (
            "rollout.lean_decode",
            f"rollout.lean_decode={str(ro.lean_decode).lower()} chooses the HF engine's decode step, but "
            f"rollout.engine={ro.engine!r} has its own: leave rollout.lean_decode at auto",
        )
    if ro.poll_every is not None and "rollout.poll_every" not in record.keys:
        yield (
            "rollout.poll_every",
            f"rollout.poll_every={ro.poll_every} sets the HF engine's decode loop, but rollout.engine="
            f"{ro.engine!r} has its own scheduler: leave rollout.poll_every unset",
        )
    if ro.worker_gpus is not None and ro.workers == 0:
        yield (
            "rollout.worker_gpus",
            f"rollout.worker_gpus={ro.worker_gpus:g} is the GPU share of each Ray rollout worker, but "
            "rollout.workers=0 runs the engine in the trainer's process: set rollout.workers >= 1 or leave "
            "rollout.worker_gpus unset",
        )
    u, w = ro.vllm.gpu_memory_utilization, ro.worker_gpus
    if ro.workers > 0 and record.settings == "vllm" and w is not None and 0 < w < 1 and u > w:
        yield (
            "rollout.vllm.gpu_memory_utilization",
            f"rollout.vllm.gpu_memory_utilization={u:g} is the share of a GPU each worker's vLLM engine "
            f"reserves, but rollout.worker_gpus={w:g} gives each worker only {w:g} of one (the others on the "
            f"GPU would find no memory): set gpu_memory_utilization <= {w:g}",
        )
    tp = ro.vllm.tensor_parallel_size if record.tensor_parallel else 1
    if tp > 1 and ro.sync.verify != "off":
        yield (
            "rollout.sync.verify",
            f"rollout.vllm.tensor_parallel_size={tp}: the weight sync's proof reads whole tensors from the "
            "engine, and each of its GPUs holds a slice: set rollout.sync.verify=off (the gathering read is "
            "not written)",
        )
    if tp > 1 and ro.workers == 0 and cfg.trainer.mode == "async":
        yield (
            "trainer.mode",
            f"trainer.mode=async with a colocated vLLM engine of rollout.vllm.tensor_parallel_size={tp}: the "
            "ranks of a tensor-parallel group follow their leader's generation calls in the trainer's main "
            "thread, which async mode keeps for the update; use trainer.mode=sync, or rollout.workers > 0",
        )


def _colocate_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """``rollout.colocate.sleep`` needs vLLM's sleep mode (GPU only), an engine in the trainer's
    process, and updates that no rollout overlaps."""
    ro, problems = cfg.rollout, []
    if not engine_record(ro.engine).sleeps:
        sleepers = ", ".join(sorted(n for n, r in ENGINES.items() if r.sleeps))
        problems.append(
            f"rollout.colocate.sleep needs an engine with sleep mode, rollout.engine={sleepers} on a GPU; "
            f"rollout.engine={ro.engine!r} has none: set rollout.colocate.sleep=false"
        )
    if cfg.trainer.mode == "async":
        problems.append(
            "rollout.colocate.sleep puts the engine to sleep for every update, but trainer.mode=async "
            "generates during updates: use trainer.mode=sync, or rollout.colocate.sleep=false"
        )
    if ro.workers > 0:
        problems.append(
            "rollout.colocate.sleep acts on the engine in the trainer's process, but "
            f"rollout.workers={ro.workers} runs the engines in Ray workers (no sleep/wake there): set "
            "rollout.workers=0 or rollout.colocate.sleep=false"
        )
    if cfg.run.device in ("cpu", "auto"):
        import torch

        if cfg.run.device == "cpu" or not torch.cuda.is_available():
            where = "run.device=cpu" if cfg.run.device == "cpu" else "run.device=auto found no GPU here"
            problems.append(
                "rollout.colocate.sleep needs a GPU: vLLM's sleep mode runs on CUDA and ROCm only, and "
                f"{where}; set rollout.colocate.sleep=false on CPU"
            )
    for message in problems:
        yield "rollout.colocate.sleep", message


def environment_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """``env.module`` imports and ``env.name`` is registered: checked with the rest of the config,
    before any work (a typo must not cost a warm start first)."""
    if cfg.env.module:
        try:
            import_environment_module(cfg.env.module)
        except FileNotFoundError:
            yield (
                "env.module",
                f"env.module={cfg.env.module!r}: no such file (a relative path is resolved against the "
                f"current directory, {os.getcwd()})",
            )
            return
        except Exception as e:  # ModuleNotFoundError, or the user's module itself raising
            yield "env.module", f"env.module={cfg.env.module!r} cannot be imported: {type(e).__name__}: {e}"
            return
    envs = registered()
    broken = entry_point_errors().get(cfg.env.name)
    if broken:
        yield "env.name", f"env.name={cfg.env.name!r} is installed but could not be loaded: {broken}"
        return
    if cfg.env.name not in envs:
        guess = difflib.get_close_matches(cfg.env.name, list(envs), n=1)
        did = f" — did you mean '{guess[0]}'?" if guess else "."
        hint = (
            ""
            if cfg.env.module
            else " If it is defined in your own file or package, set env.module to that .py file or "
            "module name so it is imported first."
        )
        yield (
            "env.name",
            f"unknown environment env.name={cfg.env.name!r}{did} Registered: {', '.join(sorted(envs))}.{hint}",
        )
        return
    if cfg.rollout.context.policy != "stop" and issubclass(envs[cfg.env.name], AgentEnvironment):
        yield (
            "rollout.context.policy",
            f"rollout.context.policy={cfg.rollout.context.policy} rewrites the context the runner "
            f"keeps, but env.name={cfg.env.name!r} is an agent environment whose client keeps its own "
            "history: set rollout.context.policy=stop (a client that rewrites its history is split "
            "into samples by proxy.on_drift)",
        )


def demonstration_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """``sft.demos`` exists and every line is a conversation (read once, before any work)."""
    if not (cfg.sft.enabled and cfg.sft.demos):
        return
    if not Path(cfg.sft.demos).is_file():
        yield (
            "sft.demos",
            f"sft.demos={cfg.sft.demos!r}: no such file (the current directory is {os.getcwd()})",
        )
        return
    try:
        load_demonstrations(cfg.sft.demos)
    except ValueError as e:
        yield "sft.demos", f"sft.demos: {e}"
