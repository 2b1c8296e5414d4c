"""The one place a generation engine is built: ``make_engine(spec, tokenizer, model)`` from an
``EngineSpec`` of plain values, by the builder of the record named ``spec.name``
(``engines/registry.py``). The built-in builders are here; the trainer's process and every Ray
rollout worker build their engines through it."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from agentrl.engines.base import Engine
from agentrl.engines.registry import engine_record
from agentrl.models import load_policy, torch_dtype

if TYPE_CHECKING:
    from agentrl.engines.hf import HFEngine
    from agentrl.engines.vllm import VLLMEngine


@dataclass(frozen=True)
class EngineSpec:
    """What an engine is built from: plain values, picklable into a process that has imported no
    config."""

    name: str
    """``rollout.engine``."""
    model_path: str
    """The checkpoint an engine reads when it is given no model to copy."""
    dtype: str = "float32"
    """``rollout.dtype``, else ``model.dtype``."""
    device: str = "cpu"
    """The run's device (``run.device`` resolved; on CUDA this rank's GPU)."""
    tokenizer: str | None = None
    """From ``model.tokenizer``."""
    attn_implementation: str | None = None
    """From ``model.attn_implementation``."""
    seed: int = 0
    """From ``run.seed``."""
    max_model_len: int | None = None
    """From ``rollout.max_episode_tokens``: the longest sequence a rollout makes."""
    poll_every: int | None = None
    """From ``rollout.poll_every``."""
    cpu_gemm: str = "auto"
    """From ``rollout.cpu_gemm``."""
    lean_decode: bool | None = None
    """From ``rollout.lean_decode`` (``auto``: None)."""
    sleep: bool = False
    """From ``rollout.colocate.sleep``."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The engine's own section (its record's ``settings``, e.g. ``rollout.vllm``) as a dict."""


def make_engine(spec: EngineSpec, tokenizer: Any = None, model: torch.nn.Module | None = None) -> Engine:
    """The engine ``spec.name``, holding a copy of ``model``'s weights, or the checkpoint's when
    ``model`` is None."""
    return engine_record(spec.name).build(spec, tokenizer, model)


def host_device(spec: EngineSpec) -> str:
    """Where an engine of ``spec`` computes: ``cuda`` when its device is a GPU and one is available,
    else ``cpu``."""
    return "cuda" if spec.device.startswith("cuda") and torch.cuda.is_available() else "cpu"


def weight_dtype(spec: EngineSpec) -> torch.dtype:
    """The dtype the engine holds its weights in, so the one a weight sync sends them in:
    ``spec.dtype``, except on the CPU for an engine whose record fixes one there (``cpu_dtype``)."""
    fixed = engine_record(spec.name).cpu_dtype
    return torch_dtype(fixed if fixed and host_device(spec) == "cpu" else spec.dtype)


def build_hf(spec: EngineSpec, tokenizer: Any, model: torch.nn.Module | None) -> HFEngine:
    """The HF engine with its own copy of the weights (of ``model``, or read from the checkpoint
    straight into its dtype on its device), synced after each update through ``load_weights``
    exactly like vLLM's, so both paths behave the same."""
    from agentrl.engines.hf import HFEngine

    engine_model: torch.nn.Module
    if model is None:
        extra = {"attn_implementation": spec.attn_implementation} if spec.attn_implementation else {}
        engine_model = load_policy(
            spec.model_path, dtype=spec.dtype, device=spec.device, tokenizer=spec.tokenizer, **extra
        )[0]
    else:
        engine_model = copy.deepcopy(model).to(torch_dtype(spec.dtype))
    engine_model.eval()
    from agentrl.engines.lean_decode import supports

    if spec.lean_decode and not supports(engine_model):
        raise ValueError(
            f"rollout.lean_decode=true: the lean decode step does not reproduce {type(engine_model).__name__} "
            "(it takes Qwen2/Llama models with full attention in every layer): set it to auto or false"
        )
    for p in engine_model.parameters():
        p.requires_grad_(False)
    return HFEngine(
        engine_model,
        tokenizer=tokenizer,
        device=spec.device,
        poll_every=spec.poll_every,
        cpu_gemm=spec.cpu_gemm,
        lean_decode=spec.lean_decode,
    )


def build_vllm(spec: EngineSpec, tokenizer: Any, model: torch.nn.Module | None) -> VLLMEngine:
    """The vLLM engine (the optional vllm extra); it reads the checkpoint itself (``model`` unused),
    on the GPU unless the spec's device is the CPU or none is available."""
    from agentrl.engines.vllm import VLLMEngine

    v, device = spec.options, host_device(spec)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return VLLMEngine(
        spec.model_path,
        **vllm_distributed(v["tensor_parallel_size"], world),
        dtype=spec.dtype if device == "cuda" else "float32",
        device=device,
        seed=spec.seed,
        gpu_memory_utilization=v["gpu_memory_utilization"],
        tensor_parallel_size=v["tensor_parallel_size"],
        enforce_eager=v["enforce_eager"] or device == "cpu",
        kv_cache_space_gib=v["kv_cache_space_gib"],
        enable_sleep_mode=spec.sleep,
        # left unset, vLLM takes the model's whole context and refuses to start when one such
        # sequence's KV cache does not fit its share (agentrl plan counts exactly this)
        max_model_len=spec.max_model_len,
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
