"""The pieces of a run, built in this process from its config: the device, the sandbox and
environment factory, tasks, the policy, a local engine, sampling parameters and the EpisodeRunner.

``build.py`` assembles a run from these (the SFT warm start, Ray rollout workers); the Ray workers
and the SFT warm start use them directly, so nothing here imports either.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

from agentrl.agents import AgentEnvironment
from agentrl.config import Config, ConfigError
from agentrl.engines.base import Engine, SamplingParams
from agentrl.engines.factory import EngineSpec, host_device, make_engine, weight_dtype
from agentrl.engines.probe_cache import cpu_flags
from agentrl.engines.registry import engine_record
from agentrl.env import (
    Environment,
    Task,
    import_environment_module,
    registered,
    task_loading_options,
)
from agentrl.env.data import HeldOut, load_tasks_from_source
from agentrl.models import load_policy, resolve_model_path, torch_dtype
from agentrl.models.tokenizer import load_tokenizer
from agentrl.parallel.placement import Launch, Placement, Rollouts, launch_from_env, place
from agentrl.rollout.context import ContextSettings
from agentrl.rollout.ray_workers import PoolSettings, RolloutPool
from agentrl.rollout.runner import Budgets, EpisodeRunner, RunnerSettings, SamplingOverride
from agentrl.rollout.worker_spec import EnvSpec, WorkerSpec, make_runner
from sandboxes import SANDBOXES, SandboxSpec

if TYPE_CHECKING:
    from agentrl.engines.vllm import VLLMEngine
    from agentrl.rollout.agent_runner import Endpoint


def device_of(cfg: Config) -> torch.device:
    """The run's device; on CUDA under torchrun, the GPU of this rank (``LOCAL_RANK``)."""
    kind = cfg.run.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(kind)


def worker_gpus(cfg: Config, cuda: bool) -> float:
    """GPUs each Ray rollout worker asks for: ``rollout.worker_gpus``, or by default none on a CPU
    run and, on CUDA, the engine's tensor-parallel size (1 for the HF engine)."""
    ro = cfg.rollout
    if ro.worker_gpus is not None:
        return float(ro.worker_gpus)
    if not cuda:
        return 0.0
    return float(engine_tp(cfg))


def engine_tp(cfg: Config) -> int:
    """GPUs one engine spans: its section's ``tensor_parallel_size`` for an engine that splits
    (``EngineRecord.tensor_parallel``), else 1."""
    record = engine_record(cfg.rollout.engine)
    if not record.tensor_parallel or record.settings is None:
        return 1
    return int(getattr(cfg.rollout, record.settings).tensor_parallel_size)


def placement(cfg: Config, launch: Launch | None = None) -> Placement:
    """Where every process of this run lives (``parallel/placement.py``), for ``launch`` or, by
    default, this process's own (torchrun's variables and the GPUs torch sees)."""
    cuda = device_of(cfg).type == "cuda"
    launch = launch or launch_from_env(cuda)
    ro = cfg.rollout
    return place(
        launch,
        Rollouts(
            engine=ro.engine,
            tensor_parallel=ro.vllm.tensor_parallel_size,
            workers=ro.workers,
            worker_gpus=worker_gpus(cfg, launch.cuda),
            worker_placement=ro.worker_placement,
            transport=ro.sync.transport,
            cluster=bool(ro.ray_address),
        ),
    )


def apply_threads(cfg: Config, log: Callable[[str], None] = print) -> None:
    """``run.threads`` into torch; with the default, a note when other processes already keep the
    cores busy (``os.getloadavg``): torch's one thread per core then waits for cores in turn."""
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
        return
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if cfg.run.device != "cuda" and torch.get_num_threads() >= cores and load >= 0.75:
        log(
            f"note: this machine is busy (load {load:.1f} on {cores} cores) and torch computes with "
            f"{torch.get_num_threads()} threads: set run.threads to the cores this job has to itself "
            "(docs/performance.md#torch-threads-on-a-shared-cpu-machine)"
        )


def cpu_bf16_note(cfg: Config, device: torch.device, flags: set[str] | None = None) -> str | None:
    """A warning when the run computes in bf16 on a CPU without bf16 instructions (x86 AVX-512 BF16
    or AMX, Arm's BF16): torch then emulates the products, and they run many times slower than in
    float32 (docs/performance.md#on-a-real-model-smollm2-135m-instruct). None when the CPU has them,
    nothing is bf16, or the CPU's flags cannot be read."""
    bf16 = [
        name
        for name, on in (
            ("trainer.bf16", cfg.trainer.bf16 is True),  # auto is decided before (precision.py)
            ("model.dtype=bfloat16", cfg.model.dtype == "bfloat16"),
            ("rollout.dtype=bfloat16", cfg.rollout.dtype == "bfloat16"),
        )
        if on
    ]
    if device.type != "cpu" or not bf16:
        return None
    flags = cpu_flags() if flags is None else flags
    if not flags or flags & {"avx512_bf16", "amx_bf16", "bf16"}:
        return None
    return (
        f"warning: {', '.join(bf16)} on a CPU without bf16 instructions (no avx512_bf16, amx_bf16 or "
        "bf16 in /proc/cpuinfo): torch emulates bf16 products here, many times slower than float32 "
        "(docs/performance.md#on-a-real-model-smollm2-135m-instruct). Set them off to train in float32"
    )


def say_slow_bf16(cfg: Config, device: torch.device, log: Callable[[str], None]) -> None:
    """Log ``cpu_bf16_note``'s warning, if there is one."""
    if note := cpu_bf16_note(cfg, device):
        log(note)


def sandbox_spec(cfg: Config) -> SandboxSpec:
    """The ``sandbox`` section as the ``SandboxSpec`` every environment receives."""
    s, lim = cfg.sandbox, cfg.sandbox.limits
    options: dict[str, Any] = {
        "limits": {
            "wall_s": lim.wall_s,
            "cpu_s": lim.cpu_s,
            "memory_bytes": lim.memory_mb * 2**20,
            "processes": lim.max_procs,
            "output_bytes": lim.output_bytes,
            "file_bytes": lim.file_size_mb * 2**20,
        },
    }
    for option, key in SANDBOXES[s.backend].keys.items():  # the backend's own keys (its record)
        if getattr(s, key) is not None:
            options[option] = getattr(s, key)
    return SandboxSpec(
        backend=s.backend,
        options=options,
        warm_sessions=s.warm_sessions,
        max_sessions=cfg.rollout.max_concurrent_episodes,  # one session per running episode
    )


def env_spec(cfg: Config) -> EnvSpec:
    """The ``env`` section as an ``EnvSpec``."""
    return EnvSpec(cfg.env.name, cfg.env.module, dict(cfg.env.options))


def env_class(cfg: Config) -> type[Environment]:
    """The registered environment class ``env.name`` (importing ``env.module`` first)."""
    return env_spec(cfg).env_class()


def env_factory(cfg: Config) -> Callable[[], Environment]:
    """Makes one fresh environment per episode: ``env.options`` and the run's sandbox."""
    return env_spec(cfg).factory(sandbox_spec(cfg))


def load_tasks(
    cfg: Config, split: str, seed: int | None = None, log: Callable[[str], None] | None = None
) -> list[Task]:
    """Tasks for ``split`` ("train" or "test") from the environment's generator or a dataset, drawn
    with ``seed`` (default ``run.seed``). A dataset whose one set of rows serves both splits is split
    by ``data.test_fraction`` (``shared_rows``): no held-out task is ever a training task. ``log``
    gets a dataset's line naming the adapter that read it and why."""
    d = cfg.data
    n = d.num_train if split == "train" else d.num_test
    seed = cfg.run.seed if seed is None else seed
    if d.source == "builtin":
        if cfg.env.module:
            import_environment_module(cfg.env.module)
        env_cls = registered()[cfg.env.name]
        return env_cls.load_tasks(
            split, n=n, seed=seed, **task_loading_options(env_cls, cfg.env.options, d.options)
        )
    shared = shared_rows(cfg)
    if split == "test" and shared and d.test_fraction == 0:
        raise ValueError(
            f"no held-out tasks: data.path={d.path!r} serves training and data.test_fraction=0 holds none of "
            "its rows out. Set data.test_fraction (e.g. 0.1), or give held-out rows their own file with "
            "data.test_path"
        )
    path = d.test_path if split == "test" and d.test_path else d.path or ""
    return load_tasks_from_source(
        source=d.source,
        path=path,
        adapter=d.adapter,
        columns=dict(d.columns),
        split=d.train_split if split == "train" else d.test_split,
        n=n,
        seed=seed,
        held_out=HeldOut(split, d.test_fraction, d.split_seed) if shared else None,
        log=log,
        **d.options,
    )


def shared_rows(cfg: Config) -> bool:
    """Does one set of dataset rows serve both splits? A file path without ``{split}`` and no
    ``data.test_path``, or a hub dataset whose ``train_split`` and ``test_split`` are the same."""
    d = cfg.data
    if d.source == "builtin" or d.test_path:
        return False
    if d.source == "file":
        return "{split}" not in (d.path or "")
    return d.train_split == d.test_split


def split_note(cfg: Config) -> str | None:
    """What the log says about a dataset split from one set of rows (None when the splits are apart)."""
    if not shared_rows(cfg):
        return None
    d = cfg.data
    where = d.path if d.source == "file" else f"{d.path} ({d.train_split})"
    if d.test_fraction == 0:
        return f"data: every row of {where} is a training task (data.test_fraction=0: nothing held out)"
    return (
        f"data: {where} serves both splits: {d.test_fraction:.0%} of its rows are held out for evaluation "
        f"and never trained on (data.test_fraction={d.test_fraction:g}, data.split_seed={d.split_seed})"
    )


def load_model(
    cfg: Config, path: str, device: torch.device | str | None = None, dtype: str | None = None
) -> tuple[torch.nn.Module, Any]:
    """The policy at ``path`` and its tokenizer, in ``dtype`` (default ``model.dtype``) on ``device``
    (default the run's). ``device="meta"``: the architecture only, parameters on the meta device
    (no memory, nothing read but the config; ``sharding.materialize`` fills them), buffers real."""
    extra = {"attn_implementation": cfg.model.attn_implementation} if cfg.model.attn_implementation else {}
    dtype = dtype or cfg.model.dtype
    if str(device) == "meta":
        return meta_model(path, dtype, **extra), load_run_tokenizer(cfg, path)
    return load_policy(
        path, dtype=dtype, device=str(device or device_of(cfg)), tokenizer=cfg.model.tokenizer, **extra
    )


def load_run_tokenizer(cfg: Config, path: str) -> Any:
    """The tokenizer ``load_model`` loads with the policy at ``path`` (``model.tokenizer``, else the
    checkpoint's own), without reading any weights."""
    return load_tokenizer(resolve_model_path(cfg.model.tokenizer or path))


def meta_model(path: str, dtype: str, **kwargs: Any) -> torch.nn.Module:
    """The model at ``path`` built from its config.json with parameters on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.parallel.sharding import meta_parameters

    config = AutoConfig.from_pretrained(resolve_model_path(path), **kwargs)
    with meta_parameters():
        return AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))


def engine_spec(cfg: Config, path: str) -> EngineSpec:
    """The plain record ``make_engine`` builds this run's engine from (``rollout.engine``) for the
    checkpoint at ``path``."""
    ro, m = cfg.rollout, cfg.model
    section = engine_record(ro.engine).settings
    return EngineSpec(
        name=ro.engine,
        model_path=path,
        dtype=ro.dtype or m.dtype,
        device=str(device_of(cfg)),
        tokenizer=m.tokenizer,
        attn_implementation=m.attn_implementation,
        seed=cfg.run.seed,
        max_model_len=ro.max_episode_tokens,
        poll_every=ro.poll_every,
        cpu_gemm=ro.cpu_gemm,
        lean_decode=None if ro.lean_decode == "auto" else ro.lean_decode,
        sleep=ro.colocate.sleep,
        options=dataclasses.asdict(getattr(ro, section)) if section else {},
    )


def local_engine(cfg: Config, model: torch.nn.Module | None, tokenizer: Any, path: str) -> Engine:
    """A generation engine in this process (``engines/factory.py``), in ``rollout.dtype``, with its
    own copy of the weights: of ``model``, or read from ``path`` (the trainer's model is sharded, or
    the engine reads its checkpoint itself), synced after each update through ``load_weights``."""
    spec = engine_spec(cfg, path)
    if spec.sleep and host_device(spec) == "cpu":  # load_config says so first; this is the fallback
        raise ConfigError(
            f"rollout.colocate.sleep needs a GPU: {engine_record(spec.name).label}'s sleep mode runs on CUDA and "
            f"ROCm only, and this run's engine would run on the CPU (run.device={cfg.run.device!r}, CUDA "
            f"available: {torch.cuda.is_available()}); set rollout.colocate.sleep=false"
        )
    return make_engine(spec, tokenizer, model)


def engine_dtype(cfg: Config) -> torch.dtype:
    """The dtype the rollout engine holds its weights in, so the one a weight sync sends them in
    (``factory.weight_dtype``). The same on every rank and in every Ray worker (the same config), as a
    collective gather needs."""
    return weight_dtype(engine_spec(cfg, cfg.model.path))


def vllm_engine(cfg: Config, path: str) -> VLLMEngine:
    """The vLLM engine of ``rollout.vllm`` (``local_engine`` with ``rollout.engine`` vllm)."""
    vllm = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, engine="vllm"))
    return cast("VLLMEngine", local_engine(vllm, None, None, path))


def sampling_params(cfg: Config, seed: int | None = None) -> SamplingParams:
    return SamplingParams(
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        stop=tuple(cfg.rollout.stop),
        seed=seed,
    )


def runner_settings(cfg: Config, seed: int | None = None) -> RunnerSettings:
    """The one settings record every episode runner takes, from ``rollout`` and ``timeouts``."""
    ro, t = cfg.rollout, cfg.timeouts
    return RunnerSettings(
        budgets=Budgets(
            ro.max_turns, ro.max_tokens_per_turn, ro.max_episode_tokens, ro.max_tool_output_tokens
        ),
        sampling=sampling_params(cfg, seed),
        max_concurrent_episodes=ro.max_concurrent_episodes,
        request_timeout_s=t.engine_request_s,
        env_timeout_s=t.env_step_s,
        agent_timeout_s=t.agent_run_s,
        history=ro.history,
        tools_prompt=ro.tools_prompt,
        env_stop=ro.env_stop,
        context=ContextSettings(
            ro.context.policy,
            ro.context.max_tokens,
            ro.context.max_summary_tokens,
            ro.context.summary_prompt,
        ),
    )


def endpoint(cfg: Config, host: str | None = None, port: int | None = None) -> Endpoint:
    """The agent runner's endpoint, from ``proxy`` (``host`` and ``port`` override it)."""
    from agentrl.rollout.agent_runner import Endpoint  # the endpoint's module: openai, http.server

    p = cfg.proxy
    return Endpoint(host or p.host, p.port if port is None else port, p.model_name, p.on_drift)


def worker_spec(cfg: Config, path: str) -> WorkerSpec:
    """Everything a rollout process builds its engine and runner from, for the checkpoint at ``path``:
    the plain record a Ray worker is handed instead of the config."""
    env = env_spec(cfg)
    agent = issubclass(env.env_class(), AgentEnvironment)
    return WorkerSpec(
        model_path=path,
        tokenizer_path=cfg.model.tokenizer or path,
        engine=engine_spec(cfg, path),
        runner=runner_settings(cfg),
        runner_kind=cfg.rollout.runner,
        env=env,
        sandbox=sandbox_spec(cfg),
        endpoint=endpoint(cfg) if agent else None,
    )


def local_runner(
    cfg: Config,
    engine: Engine,
    tokenizer: Any,
    seed: int | None = None,
    override: SamplingOverride | None = None,
) -> EpisodeRunner:
    """The EpisodeRunner of ``rollout.runner`` (lockstep or async) over ``engine``; the agent runner
    when the environment is an agent (``worker_spec.make_runner``)."""
    return make_runner(worker_spec(cfg, cfg.model.path), engine, tokenizer, seed, override)


def pool_settings(cfg: Config, workers: int | None = None) -> PoolSettings:
    r, t = cfg.rollout, cfg.timeouts
    return PoolSettings(
        workers=r.workers if workers is None else workers,
        ray_address=r.ray_address,
        worker_placement=r.worker_placement,
        transport=r.sync.transport,
        bucket_mb=r.sync.bucket_mb,
        weight_sync_s=t.weight_sync_s,
        ray_call_s=t.ray_call_s,
    )


def rollout_pool(
    cfg: Config, path: str, where: Placement | None = None, workers: int | None = None
) -> RolloutPool:
    """A pool of ``rollout.workers`` (or ``workers``) Ray workers serving the checkpoint at ``path``."""
    return RolloutPool(worker_spec(cfg, path), pool_settings(cfg, workers), where or placement(cfg))
