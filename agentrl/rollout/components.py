"""The pieces of a run, built in this process from its config: the device, the sandbox and
environment factory, tasks, the policy, a local engine, sampling parameters and the EpisodeRunner.

``build.py`` assembles a run from these (the SFT warm start, Ray rollout workers); the Ray workers
and the SFT warm start use them directly, so nothing here imports either.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentrl.agents import AgentEnvironment
from agentrl.config import Config, ConfigError
from agentrl.engines.base import Engine, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.env import (
    Environment,
    Task,
    import_environment_module,
    make_env,
    registered,
    task_loading_options,
)
from agentrl.env.data import HeldOut, load_tasks_from_source
from agentrl.models import load_policy, resolve_model_path, torch_dtype
from agentrl.models.tokenizer import load_tokenizer
from agentrl.parallel.placement import Launch, Placement, Rollouts, launch_from_env, place
from agentrl.rollout.async_runner import AsyncEpisodeRunner
from agentrl.rollout.runner import Budgets, EpisodeRunner, RunnerSettings
from sandboxes import SandboxSpec

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
    return float(ro.vllm.tensor_parallel_size if ro.engine == "vllm" else 1)


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
            ("trainer.bf16", cfg.trainer.bf16),
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


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 ``flags``, Arm ``Features``); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


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
    if s.backend == "unisolated":
        options["allow_unisolated"] = s.allow_unisolated
    if s.backend == "docker":
        options["image"] = s.docker_image
    if s.backend == "e2b" and s.e2b_template:
        options["template"] = s.e2b_template
    return SandboxSpec(
        backend=s.backend,
        options=options,
        warm_sessions=s.warm_sessions,
        max_sessions=cfg.rollout.max_concurrent_episodes,  # one session per running episode
    )


def env_class(cfg: Config) -> type[Environment]:
    """The registered environment class ``env.name`` (importing ``env.module`` first)."""
    if cfg.env.module:
        import_environment_module(cfg.env.module)
    if cfg.env.name not in registered():
        make_env(cfg.env.name)  # raises with a did-you-mean and the registered names
    return registered()[cfg.env.name]


def env_factory(cfg: Config) -> Callable[[], Environment]:
    """Makes one fresh environment per episode: ``env.options`` and the run's sandbox."""
    env_class(cfg)
    return functools.partial(make_env, cfg.env.name, sandbox=sandbox_spec(cfg), **cfg.env.options)


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


def local_engine(cfg: Config, model: torch.nn.Module | None, tokenizer: Any, path: str) -> Engine:
    """A generation engine in this process, in ``rollout.dtype``. The HF engine gets its own copy of
    the weights (of ``model``, or read from ``path`` when the trainer's model is sharded), synced
    after each update through ``load_weights`` exactly like vLLM's, so both paths behave the same."""
    if cfg.rollout.engine == "hf":
        dtype = cfg.rollout.dtype or cfg.model.dtype
        if model is None:
            engine_model = load_model(cfg, path, dtype=dtype)[0]
        else:
            engine_model = copy.deepcopy(model).to(torch_dtype(dtype))
        engine_model.eval()
        for p in engine_model.parameters():
            p.requires_grad_(False)
        return HFEngine(
            engine_model,
            tokenizer=tokenizer,
            device=device_of(cfg),
            poll_every=cfg.rollout.poll_every,
            cpu_gemm=cfg.rollout.cpu_gemm,
        )
    return vllm_engine(cfg, path)


def vllm_device(cfg: Config) -> str:
    """Where a vLLM engine runs: the GPU unless ``run.device`` is cpu or none is available."""
    return "cuda" if torch.cuda.is_available() and cfg.run.device != "cpu" else "cpu"


def engine_dtype(cfg: Config) -> torch.dtype:
    """The dtype the rollout engine holds its weights in, so the one a weight sync sends them in:
    ``rollout.dtype``, else ``model.dtype``; a vLLM engine on the CPU always float32. The same on
    every rank and in every Ray worker (the same config), as a collective gather needs."""
    if cfg.rollout.engine == "vllm" and vllm_device(cfg) == "cpu":
        return torch.float32
    return torch_dtype(cfg.rollout.dtype or cfg.model.dtype)


def vllm_engine(cfg: Config, path: str) -> VLLMEngine:
    """The vLLM engine (the optional vllm extra) of ``rollout.vllm``, on the GPU unless ``run.device``
    is cpu or none is available."""
    from agentrl.engines.vllm import VLLMEngine

    v = cfg.rollout.vllm
    device = vllm_device(cfg)
    if cfg.rollout.colocate.sleep and device == "cpu":  # load_config says so first; this is the fallback
        raise ConfigError(
            "rollout.colocate.sleep needs a GPU: vLLM's sleep mode runs on CUDA and ROCm only, and "
            f"this run's engine would run on the CPU (run.device={cfg.run.device!r}, CUDA available: "
            f"{torch.cuda.is_available()}); set rollout.colocate.sleep=false"
        )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return VLLMEngine(
        path,
        **vllm_distributed(v.tensor_parallel_size, world),
        dtype=(cfg.rollout.dtype or cfg.model.dtype) if device == "cuda" else "float32",
        device=device,
        seed=cfg.run.seed,
        gpu_memory_utilization=v.gpu_memory_utilization,
        tensor_parallel_size=v.tensor_parallel_size,
        enforce_eager=v.enforce_eager or device == "cpu",
        kv_cache_space_gib=v.kv_cache_space_gib,
        enable_sleep_mode=cfg.rollout.colocate.sleep,
        # the longest sequence a rollout makes; left unset, vLLM takes the model's whole context
        # (131,072 positions for Qwen2.5-32B) and refuses to start when one such sequence's KV
        # cache does not fit its share (agentrl plan counts exactly this)
        max_model_len=cfg.rollout.max_episode_tokens,
    )


def vllm_distributed(tp: int, world: int) -> dict[str, Any]:
    """How a vLLM engine joins this run's processes. Under torchrun (``world`` > 1) every rank's
    engine joins the ranks through vLLM's ``external_launcher``: the engine runs in the rank's own
    process on its ``LOCAL_RANK`` GPU, reuses torch's process group, and with tp > 1 forms its
    tensor-parallel groups from tp consecutive ranks (``parallel/engine_group.py`` keeps their calls
    in step). In one process with tp > 1 (a Ray worker given tp GPUs, ``rollout.worker_gpus``),
    vLLM's multiprocessing executor starts one process per GPU among those Ray made visible (its Ray
    executor would start actors of its own outside the worker's bundle). Otherwise vLLM's default,
    one process."""
    if world > 1:
        return {"distributed_executor_backend": "external_launcher"}
    if tp > 1:
        return {"distributed_executor_backend": "mp"}
    return {}


def sampling_params(cfg: Config, seed: int | None = None, temperature: float | None = None) -> SamplingParams:
    return SamplingParams(
        temperature=cfg.rollout.temperature if temperature is None else temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        stop=tuple(cfg.rollout.stop),
        seed=seed,
    )


def runner_settings(cfg: Config, seed: int | None = None, temperature: float | None = None) -> RunnerSettings:
    """The one settings record every episode runner takes, from ``rollout`` and ``timeouts``."""
    ro, t = cfg.rollout, cfg.timeouts
    return RunnerSettings(
        budgets=Budgets(
            ro.max_turns, ro.max_tokens_per_turn, ro.max_episode_tokens, ro.max_tool_output_tokens
        ),
        sampling=sampling_params(cfg, seed, temperature),
        max_concurrent_episodes=ro.max_concurrent_episodes,
        request_timeout_s=t.engine_request_s,
        env_timeout_s=t.env_step_s,
        agent_timeout_s=t.agent_run_s,
        history=ro.history,
        tools_prompt=ro.tools_prompt,
        env_stop=ro.env_stop,
    )


def endpoint(cfg: Config, host: str | None = None, port: int | None = None) -> Endpoint:
    """The agent runner's endpoint, from ``proxy`` (``host`` and ``port`` override it)."""
    from agentrl.rollout.agent_runner import Endpoint  # the endpoint's module: openai, http.server

    p = cfg.proxy
    return Endpoint(host or p.host, p.port if port is None else port, p.model_name, p.on_drift)


def local_runner(
    cfg: Config, engine: Engine, tokenizer: Any, seed: int | None = None, temperature: float | None = None
) -> EpisodeRunner:
    """The EpisodeRunner of ``rollout.runner`` (lockstep or async) over ``engine``; the agent runner
    when the environment is an agent."""
    settings = runner_settings(cfg, seed, temperature)
    if issubclass(env_class(cfg), AgentEnvironment):
        from agentrl.rollout.agent_runner import AgentRunner

        return AgentRunner(engine, tokenizer, env_factory(cfg), settings, endpoint(cfg))
    if cfg.rollout.runner == "async":
        return AsyncEpisodeRunner(engine, tokenizer, env_factory(cfg), settings)
    return EpisodeRunner(engine, tokenizer, env_factory(cfg), settings)
