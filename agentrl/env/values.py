"""What a reward may be: a finite real number, checked the same way in training and in ``envs check``.

A reward function's value, and an environment step's reward, must be a real number: ``int``,
``float``, ``bool``, or a one-element NumPy or torch number; and finite. A string is refused, not
coerced (``"1.0"`` would pass ``float()`` and ``"zero"`` fail only in training), and so are NaN and
±inf: a non-finite reward would reach the advantages, then the update, and turn every weight into
NaN. The error names the reward and the value; the runner records it as the episode's failure at the
``reward`` boundary, and the step trains on the other episodes."""

from __future__ import annotations

import math
import numbers
from typing import Any


class RewardValueError(ValueError):
    """A reward returned something other than a finite real number."""


def reward_value(name: str, value: Any) -> float:
    """``value`` as a float, or ``RewardValueError`` naming the reward ``name`` and what it returned."""
    number = value
    if not isinstance(value, numbers.Real) and hasattr(value, "item") and _numel(value) == 1:
        number = value.item()  # a one-element array or tensor
    if isinstance(number, str) or not isinstance(number, numbers.Real):
        hint = " (a string is not converted)" if isinstance(value, str) else ""
        raise RewardValueError(
            f"reward {name} returned {_shown(value)} ({type(value).__name__}), not a real number: return a "
            f"float{hint}"
        )
    out = float(number)
    if not math.isfinite(out):
        raise RewardValueError(f"reward {name} returned {out}, not a finite number")
    return out


def _numel(value: Any) -> int:
    n = getattr(value, "numel", None)
    return int(n()) if callable(n) else int(getattr(value, "size", 1))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
