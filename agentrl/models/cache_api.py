"""How a transformers forward takes and returns its KV cache, across the versions agentrl meets.

transformers 5.24 renamed the forward's ``past_key_values`` argument and output field to ``cache``
(the old name still works until 5.40, with a ``FutureWarning`` on every call); the GPU machine's
5.17 knows only ``past_key_values``. These helpers use whichever name the installed model class
declares, so no call of ours warns."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

_NAMES: dict[type, str] = {}


def _cache_name(model_class: type[nn.Module]) -> str:
    if model_class not in _NAMES:
        params = inspect.signature(model_class.forward).parameters
        _NAMES[model_class] = "cache" if "cache" in params else "past_key_values"
    return _NAMES[model_class]


def cache_kwargs(model: nn.Module, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model``'s forward: ``cache=`` where the transformers model inside it
    (through DDP's ``module`` and peft's ``base_model.model``, which pass keywords on) has that
    argument, else ``past_key_values=``."""
    inner: Any = model
    while True:
        if isinstance(getattr(inner, "module", None), nn.Module):
            inner = inner.module
        elif isinstance(getattr(getattr(inner, "base_model", None), "model", None), nn.Module):
            inner = inner.base_model.model
        else:
            return {_cache_name(type(inner)): cache}


def returned_cache(out: Any) -> Any:
    """The KV cache a forward returned (``out.cache``, or ``out.past_key_values`` before 5.24);
    None when it returned none."""
    if "cache" in getattr(type(out), "__dataclass_fields__", {}):
        return out.cache
    return getattr(out, "past_key_values", None)
