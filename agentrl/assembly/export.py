"""``agentrl export``: any checkpoint as a plain HF-format model, for evaluation and serving.

Checkpoints come in three kinds (``agentrl.training.checkpoint``): full HF weights (``ddp``, one process), a
LoRA adapter on a recorded base model, and DCP shards (``fsdp2``, full weights or adapters). All of
them load here in one process, without a process group: DCP shards are read into the whole tensors
(whatever number of ranks wrote them), and adapters are merged into the base (W + (α/r)·B A), so the
result is one ``model.safetensors`` that transformers, vLLM or ``agentrl eval`` load directly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.assembly.components import meta_model
from agentrl.config import ConfigError
from agentrl.config.schema import LoraConfig
from agentrl.models import load_policy, torch_dtype
from agentrl.models.gguf import plain_modes
from agentrl.models.tokenizer import load_tokenizer
from agentrl.models.tool_template import wants_wrapper, with_tools
from agentrl.parallel import sharding
from agentrl.training import lora
from agentrl.training.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_state,
    read_dcp,
    weights_record,
)


def find_checkpoint(path: str | Path, step: int | None = None) -> Path:
    """A checkpoint directory: ``path`` itself, or in the run directory ``path`` the one of ``step``
    (default the newest)."""
    path = Path(path)
    if (path / "trainer_state.pt").exists():
        return path
    found = list_checkpoints(path)
    if not found:
        raise ConfigError(f"{path} is neither a checkpoint nor a run directory with checkpoints")
    if step is None:
        return latest_checkpoint(path)  # type: ignore[return-value]
    for ckpt in found:
        if ckpt.name == f"step_{step}":
            return ckpt
    raise ConfigError(f"{path} has no checkpoint of step {step}; it has {[c.name for c in found]}")


def checkpoint_model(ckpt: Path, dtype: str = "float32") -> tuple[torch.nn.Module, Any]:
    """The policy a checkpoint holds, as a plain transformers model on the CPU, and its tokenizer."""
    record = weights_record(load_state(ckpt))
    settings = record["lora"]
    if record["format"] == "hf" and not settings:
        return load_policy(ckpt, dtype=dtype)
    tokenizer = load_tokenizer(str(ckpt))
    if settings:
        lora.check_identity(record["base"], record["base"]["path"], str(ckpt))
        base, _ = load_policy(record["base"]["path"], dtype="float32")
        model: Any = lora.apply(base, LoraConfig(**settings), seed=0)
        if record["format"] == "hf":
            lora.load_adapter(model, ckpt / lora.ADAPTER_DIR)
        else:
            trainable = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
            _read_dcp(ckpt, trainable)
        return model.merge_and_unload().to(torch_dtype(dtype)), tokenizer
    full: Any = meta_model(str(ckpt), "float32")
    sharding.materialize(full, torch.device("cpu"), None, broadcast=False)
    _read_dcp(ckpt, dict(full.state_dict()))
    return full.to(torch_dtype(dtype)), tokenizer


def _read_dcp(ckpt: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Fill ``tensors`` in place with the model entries of the DCP checkpoint (resharded to whole)."""
    read_dcp(ckpt, {"model": tensors}, alone=True)


def export(
    path: str | Path,
    out: str | Path,
    step: int | None = None,
    dtype: str = "float32",
    log: Callable[[str], None] = print,
) -> Path:
    """Write the checkpoint's policy (merged, whole) and its tokenizer to ``out`` in HF format, with a
    chat template that shows tools as training did (``training_chat_template``)."""
    ckpt = find_checkpoint(path, step)
    model, tokenizer = checkpoint_model(ckpt, dtype)
    training_chat_template(ckpt, tokenizer, log)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)  # type: ignore[operator]
    tokenizer.save_pretrained(out)
    plain_modes(out)  # model.safetensors is written 0600, the rest 0644
    return ckpt


PROBE_TOOLS = [{"type": "function", "function": {"name": "probe", "description": "d", "parameters": {}}}]


def training_chat_template(ckpt: Path, tokenizer: Any, log: Callable[[str], None]) -> None:
    """When training wrote the tools into the system message (``rollout.tools_prompt: system``, or
    ``auto`` on a template with no tools section), give ``tokenizer`` the template that does the
    same (``models/tool_template.py``), so ``apply_chat_template(messages, tools=...)`` on the export
    renders the prompts the policy was trained on. Read from the run's ``config.yaml`` (the
    checkpoint's run directory); without one the model's own template is kept, and the log says so."""
    run = ckpt.parent.parent
    if not (run / "config.yaml").exists():
        log(f"note: no config.yaml in {run}: the export keeps the model's own chat template")
        return
    from agentrl.assembly.components import env_class
    from agentrl.config import load_config

    try:
        cfg = load_config(str(run / "config.yaml"))
        tool_format = env_class(cfg).tool_format
    except Exception as e:  # the run's environment module moved, a data file gone: say so, keep going
        log(f"note: the run's config could not be read ({e}): the export keeps the model's own chat template")
        return
    if tokenizer.chat_template and wants_wrapper(
        tokenizer, cfg.rollout.tools_prompt, PROBE_TOOLS, tool_format
    ):
        tokenizer.chat_template = with_tools(tokenizer.chat_template, tool_format)
        log(
            f"chat template: tools go into the system message, as in training (rollout.tools_prompt="
            f"{cfg.rollout.tools_prompt}, calls in the {tool_format} format)"
        )
