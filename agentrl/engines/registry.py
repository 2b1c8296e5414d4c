"""One record per generation engine: its name (``rollout.engine``), how it is built, and the facts
the rest of the code asks of it instead of comparing names.

This module sits below ``agentrl.config`` (the config's ``rollout.engine`` takes its choices from
``ENGINES``), so it imports nothing heavy: a built-in engine's builder is a ``"module:function"``
path, imported when an engine is built (``agentrl.engines.factory.make_engine``).

Adding an engine: one module that defines ``build(spec, tokenizer, model) -> Engine`` (``spec`` an
``agentrl.engines.factory.EngineSpec``) and registers it, e.g.

    register_engine(EngineRecord("mine", build, label="Mine"))

then ``agentrl train ... rollout.engine=mine`` (with ``env.module`` or an import that runs it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineRecord:
    """An engine: ``builder(spec, tokenizer, model) -> Engine``; ``model`` is the trainer's policy to
    copy, or None to read the checkpoint at ``spec.model_path``."""

    name: str
    builder: str | Callable[..., Any]
    """The builder, or its ``"module:function"`` path (imported at build time)."""
    label: str
    """How placement and logs name it ("HF engine 0", "vLLM tensor parallel 1")."""
    settings: str | None = None
    """The ``rollout.<settings>`` section holding its own settings, handed to it as
    ``EngineSpec.options`` (None: none)."""
    keys: tuple[str, ...] = ()
    """Engine-specific config keys outside that section that it reads; set for another engine, they
    are refused at load time."""
    tensor_parallel: bool = False
    """Spans ``rollout.<settings>.tensor_parallel_size`` GPUs (1 otherwise)."""
    sleeps: bool = False
    """Has a sleep mode on a GPU (``rollout.colocate.sleep``)."""
    cpu_dtype: str | None = None
    """The dtype it always holds its weights in on the CPU, whatever ``rollout.dtype`` says (None:
    the one asked for)."""
    rank_launcher: str | None = None
    """How a colocated engine joins torchrun's ranks, in placement's words (None: it runs inside
    the rank like any module)."""
    reserves_memory: bool = False
    """Takes a fixed share of its GPU up front (``rollout.<settings>.gpu_memory_utilization``, weights
    and KV cache inside it), as vLLM does; else it holds its weights and its running sequences' KV
    cache as it goes, as the HF engine does. ``agentrl plan`` counts its memory by this."""
    install_check: str | Callable[[], str | None] | None = None
    """What the preflight asks before a run: a function (or its ``"module:function"`` path) that
    says why this machine cannot run the engine (a missing or too old package), or None when it can
    (None: nothing to check)."""

    def build(self, spec: Any, tokenizer: Any, model: Any = None) -> Any:
        return _resolved(self.builder)(spec, tokenizer, model)

    def install_problem(self) -> str | None:
        """What ``install_check`` finds wrong with this machine's install (None: nothing)."""
        return None if self.install_check is None else _resolved(self.install_check)()


def _resolved(function: str | Callable[..., Any]) -> Callable[..., Any]:
    """``function``, imported first when it is a ``"module:function"`` path."""
    if isinstance(function, str):
        module, _, name = function.partition(":")
        found: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return found
    return function


ENGINES: dict[str, EngineRecord] = {}


def register_engine(record: EngineRecord) -> EngineRecord:
    """Add an engine; a second record under a taken name is refused."""
    if record.name in ENGINES and ENGINES[record.name] != record:
        raise ValueError(f"an engine named {record.name!r} is already registered")
    ENGINES[record.name] = record
    return record


def engine_record(name: str) -> EngineRecord:
    """The record of engine ``name``; an unknown name's error lists the registered ones."""
    if name not in ENGINES:
        raise ValueError(
            f"unknown engine {name!r} (rollout.engine); registered: {', '.join(sorted(ENGINES))}"
        )
    return ENGINES[name]


register_engine(
    EngineRecord(
        "hf",
        "agentrl.engines.factory:build_hf",
        label="HF",
        keys=("rollout.poll_every", "rollout.cpu_gemm", "rollout.lean_decode"),
    )
)
register_engine(
    EngineRecord(
        "vllm",
        "agentrl.engines.factory:build_vllm",
        label="vLLM",
        settings="vllm",
        tensor_parallel=True,
        sleeps=True,
        cpu_dtype="float32",
        rank_launcher="vLLM external_launcher",
        reserves_memory=True,
        install_check="agentrl.engines.vllm:install_problem",
    )
)
