"""LoRA: low-rank adapters on the policy's linear layers instead of full fine-tuning (``model.lora``).

With ``model.lora.rank`` r > 0 the learner wraps the policy with peft before sharding it: every target
linear layer y = W x gets y = W x + (α/r)·B A dropout(x), with A [r, in] random and B [out, r] zero at
the start (so step 0's policy is the base model). W stays frozen; only A and B train and enter the
optimizer, so gradients and AdamW states cost r·(in + out) per layer instead of in·out.

The engine samples with the merged weights W + (α/r)·B A (``merged_weights``): only the adapted layers
change, so only they are synced, except into an engine that discarded its weights while it slept
(vLLM's level-2 sleep, ``rollout.colocate.sleep_level: 2``), which gets every weight. Checkpoints hold the adapter in peft's format (``adapter/``) and the
base model's identity (``identity``: its path and a fingerprint of its files); a resume or an
export with another base is refused. With no ``model.ref_path`` the KL reference is the base model
itself: the policy's forward with the adapters disabled, with no second copy of the weights.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from agentrl.config import ConfigError
from agentrl.config.schema import LoraConfig
from agentrl.seeds import mix_seed

ADAPTER_DIR = "adapter"
ADAPTER = "default"  # peft's adapter name


def enabled(settings: LoraConfig) -> bool:
    """Whether ``model.lora`` adds adapters at all (a rank above 0)."""
    return settings.rank > 0


def linear_names(model: nn.Module) -> list[str]:
    """The last part of every linear layer's module name (``q_proj``, ``down_proj``, ``lm_head``...)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})


def check_targets(model: nn.Module, settings: LoraConfig) -> None:
    """Each of ``target_modules`` must name a linear layer of ``model`` (which may be on the meta
    device): a clear error before any work, with the names that would match."""
    valid = linear_names(model)
    missing = [t for t in settings.target_modules if t not in valid]
    if missing or not settings.target_modules:
        raise ConfigError(
            f"model.lora.target_modules: {missing or '[]'} match no linear layer of "
            f"{type(model).__name__}; its linear layers are {valid}"
        )


def apply(model: nn.Module, settings: LoraConfig, seed: int) -> nn.Module:
    """``model`` with adapters on ``settings.target_modules`` (a peft model; ``model`` is changed in
    place). A is drawn from a generator seeded with ``seed``, so every run and every rank starts from
    the same adapters whatever was drawn before."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    check_targets(model, settings)
    peft_config = PeftLoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,  # type: ignore[arg-type]
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft reads transformers' deprecated ``is_gradient_checkpointing`` (a FutureWarning from 5.24 on,
        # on every run with LoRA): peft's call, nothing a user can change, so not shown
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning
        )
        torch.manual_seed(mix_seed(seed, 0, 41))
        return get_peft_model(model, peft_config)  # type: ignore[arg-type]


def adapted_layers(model: nn.Module) -> Iterator[tuple[str, Any]]:
    """(base model's module name, LoRA layer) for every adapted linear layer of a peft model."""
    from peft.tuners.lora import LoraLayer

    inner: Any = model
    for name, module in inner.base_model.model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            yield name, module


def merged_weights(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(name in the base model, W + (α/r)·B A) for every adapted layer, computed in fp32 and returned
    in W's dtype; sharded (FSDP2) tensors are gathered first (collective: every rank calls this)."""
    from agentrl.parallel.sharding import full_tensor

    for name, layer in adapted_layers(model):
        lay: Any = layer
        w = full_tensor(lay.base_layer.weight)
        a = full_tensor(lay.lora_A[ADAPTER].weight).float()
        b = full_tensor(lay.lora_B[ADAPTER].weight).float()
        scale = float(lay.scaling[ADAPTER])
        yield f"{name}.weight", (w.float() + scale * (b @ a)).to(w.dtype)


class _Weight(NamedTuple):
    name: str
    """The engine's name for it (the base model's)."""
    tensor: Tensor
    """The weight (an adapted layer's: its frozen W)."""
    layer: Any = None
    """The LoRA layer whose W + (α/r)·B A it becomes; None: sent as it is."""


def merged_buckets(
    model: nn.Module,
    bucket_bytes: float,
    dtype: torch.dtype | None,
    device: torch.device,
    full: bool = False,
) -> Iterator[list[tuple[str, Tensor]]]:
    """``merged_weights`` in buckets of at most ``bucket_bytes`` (tensors sized in ``dtype``), each
    bucket's tensors gathered together (``parallel/buckets.py``: one collective per dtype, in their
    own dtypes: the merge needs W, A and B as they are), merged as ``merged_weights`` merges, then
    cast to ``dtype`` (None: their own). ``full``: every weight of the base model, the adapted layers
    merged and the rest as they are, for an engine that kept none of its weights (vLLM's level-2
    sleep). Collective under FSDP2: every rank consumes it in step."""
    from agentrl.parallel.buckets import gather_bucket

    adapted = dict(adapted_layers(model))
    weights = (
        _base_weights(model, adapted)
        if full
        else [_Weight(f"{n}.weight", lay.base_layer.weight, lay) for n, lay in adapted.items()]
    )

    def flush(items: list[_Weight]) -> list[tuple[str, Tensor]]:
        parts = []
        for w in items:
            parts.append((w.name, w.tensor))
            if w.layer is not None:
                parts += [
                    (f"{w.name}.lora_A", w.layer.lora_A[ADAPTER].weight),
                    (f"{w.name}.lora_B", w.layer.lora_B[ADAPTER].weight),
                ]
        whole = dict(gather_bucket(parts, None, device))
        out = []
        for w in items:
            t = whole[w.name]
            if w.layer is not None:
                a, b = whole[f"{w.name}.lora_A"].float(), whole[f"{w.name}.lora_B"].float()
                t = (t.float() + float(w.layer.scaling[ADAPTER]) * (b @ a)).to(t.dtype)
            out.append((w.name, t.to(dtype or t.dtype)))
        return out

    bucket: list[_Weight] = []
    size = 0
    for w in weights:
        n = w.tensor.numel() * torch.empty((), dtype=dtype or w.tensor.dtype).element_size()
        if bucket and size + n > bucket_bytes:
            yield flush(bucket)
            bucket, size = [], 0
        bucket.append(w)
        size += n
    if bucket:
        yield flush(bucket)


def _base_weights(model: nn.Module, adapted: dict[str, Any]) -> list[_Weight]:
    """Every weight of the base model under the engine's name: peft's ``q_proj.base_layer.weight``
    is ``q_proj.weight``, merged with its adapter; the adapters themselves are not sent."""
    out = []
    for pname, p in base_model(model).named_parameters():
        if ".lora_" in pname:
            continue
        owner, _, leaf = pname.rpartition(".")
        layer = owner.removesuffix(".base_layer")
        merged = owner.endswith(".base_layer") and leaf == "weight" and layer in adapted
        out.append(_Weight(pname.replace(".base_layer.", "."), p, adapted[layer] if merged else None))
    return out


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft model (the model itself without LoRA)."""
    inner: Any = model
    return inner.base_model.model if hasattr(model, "peft_config") else model  # type: ignore[no-any-return]


def save_adapter(model: nn.Module, out: Path, base_path: str) -> None:
    """The adapter in peft's format (``PeftModel.from_pretrained(base, out)`` loads it)."""
    model.peft_config[ADAPTER].base_model_name_or_path = base_path  # type: ignore[index, union-attr]
    model.save_pretrained(out, safe_serialization=True)  # type: ignore[operator]


def load_adapter(model: nn.Module, adapter_dir: Path) -> None:
    """Load saved adapter tensors into a peft model built with the same settings."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(adapter_dir / "adapter_model.safetensors"))
    result: Any = set_peft_model_state_dict(model, state)  # type: ignore[arg-type]
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(
            f"{adapter_dir}: the adapter does not fit this model (unexpected {result.unexpected_keys[:3]}, "
            f"missing {missing[:3]}); was it trained with other model.lora settings?"
        )


# The key in config.json that names the transformers release which wrote it: the same weights saved
# by another release differ only there (5.24 -> 5.25), so the fingerprint leaves it out.
_WRITER_KEY = "transformers_version"


def identity(path: str) -> dict[str, Any]:
    """What identifies a base model: its path and a fingerprint of its config (without the key naming
    the transformers release that wrote it) and of its weight files (the safetensors headers: names,
    shapes, dtypes and offsets, cheap to read for any size). ``scheme`` 2 marks this fingerprint;
    records without it hold the first one, which hashed config.json's bytes as they were."""
    root = Path(path)
    config = root / "config.json"
    canonical = b""
    if config.exists():
        fields = {k: v for k, v in json.loads(config.read_text()).items() if k != _WRITER_KEY}
        canonical = json.dumps(fields, sort_keys=True).encode()
    return {"path": str(path), "fingerprint": _fingerprint(canonical, _headers(root)), "scheme": 2}


def _headers(root: Path) -> bytes:
    """Each safetensors file's name, header and size, in name order."""
    out = b""
    for f in sorted(root.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            out += f.name.encode() + fh.read(n) + str(f.stat().st_size).encode()
    return out


def _fingerprint(config: bytes, headers: bytes) -> str:
    return hashlib.sha256(config + headers).hexdigest()[:16]


def _first_scheme_matches(saved: str, path: str) -> bool:
    """Whether a record of the first scheme (config.json's raw bytes, writer key included) fits the
    base at ``path``: its config.json as it is, or with the writer key naming any transformers
    release 4.0-5.99 (patch 0-9, and .dev0), since the record does not say which release wrote it."""
    root = Path(path)
    config, headers = root / "config.json", _headers(root)
    if not config.exists():
        return _fingerprint(b"", headers) == saved
    raw = config.read_text()
    if _fingerprint(raw.encode(), headers) == saved:
        return True
    match = re.search(rf'"{_WRITER_KEY}": "([^"]*)"', raw)
    if match is None:
        return False
    for major, minor, patch in itertools.product((4, 5), range(100), range(10)):
        for version in (f"{major}.{minor}.{patch}", f"{major}.{minor}.{patch}.dev0"):
            text = raw[: match.start(1)] + version + raw[match.end(1) :]
            if _fingerprint(text.encode(), headers) == saved:
                return True
    return False


def check_identity(saved: dict[str, Any], path: str, what: str) -> None:
    """A clear error when the adapter in ``what`` was trained on another base than ``path``."""
    now = identity(path)
    if saved.get("scheme") == 2:
        same = saved["fingerprint"] == now["fingerprint"]
    else:
        same = _first_scheme_matches(saved["fingerprint"], path)
    if not same:
        raise ConfigError(
            f"{what} holds a LoRA adapter trained on the base model {saved['path']} (fingerprint "
            f"{saved['fingerprint']}), but this run's base model is {path} (fingerprint "
            f"{now['fingerprint']}): point model.path (and sft) at the original base"
        )


def describe(model: nn.Module) -> str:
    """``LoRA: 1.1 M trainable of 7.6 B parameters (0.01%)``."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return f"LoRA: {trainable:,} trainable of {total:,} parameters ({trainable / max(total, 1):.2%})"


def settings_dict(settings: LoraConfig) -> dict[str, Any]:
    """The adapter's settings as checkpoints record them."""
    return {
        "rank": settings.rank,
        "alpha": float(settings.alpha),
        "dropout": float(settings.dropout),
        "target_modules": sorted(settings.target_modules),
    }
