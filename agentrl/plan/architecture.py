"""What the planner knows of a model: its parameter counts and layer shapes, from its config.json
(a local directory, a ``tiny:`` preset, or one of the architectures bundled in
``agentrl/assets/architectures`` for the hub models configs/gpu uses). The model is built on the
meta device and its parameters counted exactly. Nothing is downloaded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl.config import Config, ConfigError

BUNDLED = Path(__file__).resolve().parents[1] / "assets" / "architectures"


@dataclass(frozen=True)
class Architecture:
    """What the planner needs of a model, counted on the meta device."""

    name: str
    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layer_params: int  # one decoder layer
    root_params: int  # everything outside the decoder layers (embeddings, final norm, head)
    largest_tensor: int
    lora_params: int = 0  # adapters for the configured LoRA settings (0 without LoRA)
    max_positions: int = 0  # config.json's max_position_embeddings (0 when it names none)
    lean: bool = False  # the HF engine's lean decode step reproduces it (engines/lean_decode.supports)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def config_json(path: str) -> dict[str, Any]:
    """The config.json of ``model.path``: a local directory, a ``tiny:`` preset, or a bundled
    architecture (``Qwen/Qwen2.5-7B`` -> assets/architectures/Qwen--Qwen2.5-7B.json)."""
    from agentrl.models import PRESETS

    if path.startswith("tiny:"):
        preset = path.removeprefix("tiny:")
        if preset not in PRESETS:
            raise ConfigError(f"unknown tiny preset {preset!r}; valid: {sorted(PRESETS)}")
        s = PRESETS[preset]
        return {
            "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"],
            "hidden_size": s.hidden_size,
            "intermediate_size": s.intermediate_size,
            "num_hidden_layers": s.num_layers,
            "num_attention_heads": s.num_heads,
            "num_key_value_heads": s.num_kv_heads,
            "vocab_size": 1024,
            "tie_word_embeddings": False,
        }
    from agentrl.models import cache_root, gguf

    if gguf.is_gguf(path) or gguf.is_packaged(path):  # the cached conversion (converted on first use)
        path = str(gguf.converted_dir(path, cache_root()))
    local = Path(path) / "config.json"
    if local.exists():
        return json.loads(local.read_text())  # type: ignore[no-any-return]
    bundled = BUNDLED / (path.replace("/", "--") + ".json")
    if bundled.exists():
        return json.loads(bundled.read_text())  # type: ignore[no-any-return]
    known = sorted(p.stem.replace("--", "/") for p in BUNDLED.glob("*.json"))
    raise ConfigError(
        f"no config.json for model.path={path!r} (no download): pass a local model directory, a tiny: "
        f"preset, or one of the bundled architectures {known}"
    )


def architecture(cfg: Config) -> Architecture:
    """Count the configured model's parameters on the meta device (and its LoRA adapters)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.engines import lean_decode
    from agentrl.parallel import sharding
    from agentrl.training import lora

    raw = config_json(cfg.model.path)
    hf_config = AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    layers = sharding.decoder_layers(model)
    params = sum(p.numel() for p in model.parameters())
    layer_params = sum(p.numel() for p in layers[0].parameters())
    lora_params = 0
    if lora.enabled(cfg.model.lora):
        lora.check_targets(model, cfg.model.lora)
        r, targets = cfg.model.lora.rank, set(cfg.model.lora.target_modules)
        lora_params = sum(
            r * (m.in_features + m.out_features)
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in targets
        )
    c = hf_config
    heads = c.num_attention_heads
    return Architecture(
        name=type(model).__name__,
        params=params,
        layers=len(layers),
        hidden=c.hidden_size,
        intermediate=c.intermediate_size,
        heads=heads,
        kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        vocab=c.vocab_size,
        layer_params=layer_params,
        root_params=params - layer_params * len(layers),
        largest_tensor=max(p.numel() for p in model.parameters()),
        lora_params=lora_params,
        max_positions=int(raw.get("max_position_embeddings") or 0),
        lean=lean_decode.supports(model),
    )
