"""One record per method: everything about an advantage estimator, a loss aggregation or a token
weighting lives in its record, in the method's own module, and every other part reads it from here.

Who reads the records:
- the config loader: valid names of ``algorithm.name``, ``algorithm.advantage`` and
  ``algorithm.loss_agg``; the settings section ``algorithm.<weighting>`` and its rules (``check``);
  the preset that fills ``algorithm.*`` when a method is chosen;
- the trainer: which weighting to call and with what (``arguments``), its state between steps and in
  checkpoints (``state``);
- docs/configuration.md (the generated table and the presets), and the test matrix.

Adding a token weighting (docs/algorithms.md, "Adding a method"), anywhere, e.g. in your own module:

    @dataclass
    class MySettings:
        alpha: float = knob(0.5, gt=0)
        \"\"\"How strongly ...\"\"\"

    def my_weights(inputs: WeightingInputs, *, alpha: float) -> TokenWeights: ...

    register_weighting(TokenWeighting(
        "mine", my_weights, settings=MySettings,
        arguments=lambda s, step: {"alpha": s.alpha},
    ))

and ``agentrl train ... algorithm.name=mine algorithm.mine.alpha=0.3``. Registering a weighting also
registers the method of the same name, with the GRPO-ds preset unless the record names another.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor

from agentrl.algorithms.token_weights import TokenWeights, WeightingInputs

GRPO: Mapping[str, Any] = {
    "advantage": "grpo",
    "loss_agg": "seq-mean-token-mean",
    "clip_low": 0.2,
    "clip_high": 0.2,
    "ratio_clip": True,
    "dynamic_sampling": False,
    "overlong.enabled": False,
}
"""GRPO's ``algorithm.*`` values (keys relative to ``algorithm``)."""
GRPO_DS: Mapping[str, Any] = {**GRPO, "loss_agg": "token-mean", "clip_high": 0.28, "dynamic_sampling": True}
"""STARE's base ("GRPO-ds"): GRPO with DAPO's loss (clip-higher, token-mean) and dynamic sampling;
the preset of every token weighting unless its record says otherwise."""


@dataclass(frozen=True)
class StepContext:
    """What a token weighting may need each step besides its settings."""

    seed: int
    """This step's seed for random selections (the same when the step is re-run after a resume)."""
    row_groups: list[list[int]]
    """The micro-batches the update will run, as rows of the batch (every rank's, in order)."""
    state: Any = None
    """What the weighting returned as ``TokenWeights.state`` last step (None at the first step)."""


class UpdateShape(Protocol):
    """What a weighting's ``check`` may read of the trainer's settings (``cfg.trainer``): how each
    step's batch is cut into updates."""

    epochs_per_step: int
    mini_batches_per_step: int
    micro_batch_size: int


@dataclass(frozen=True)
class TokenWeighting:
    """A token weighting: ``compute(inputs, **arguments(settings, step)) -> TokenWeights``."""

    name: str
    compute: Callable[..., TokenWeights]
    """``fn(WeightingInputs, **kwargs) -> TokenWeights``; pure, over the whole batch, detached."""
    settings: type | None = None
    """Dataclass of its settings: the config section ``algorithm.<name>`` (None: no settings)."""
    arguments: Callable[[Any, StepContext], Mapping[str, Any]] | None = None
    """``(settings, step) -> keyword arguments of compute`` (None: no arguments)."""
    state: type | None = None
    """Class of the state it carries between steps (``to_dict``/``from_dict``, checkpointed)."""
    preset: Mapping[str, Any] = field(default_factory=lambda: dict(GRPO_DS))
    """``algorithm.*`` defaults when ``algorithm.name`` is this weighting."""
    needs_phi: bool = False
    """Whether ``compute`` reads ``WeightingInputs.phi`` and ``share``: the π_old pass then also
    computes φ (two more reductions over the vocabulary, no extra pass)."""
    check: Callable[[Any, UpdateShape], Iterable[tuple[str, str]]] | None = None
    """``(settings, trainer) -> (key, problem)`` rules involving more than one key, checked at load
    time when the method is selected; ``trainer`` is the config's ``trainer`` section."""

    def kwargs(self, settings: Any, step: StepContext) -> dict[str, Any]:
        return dict(self.arguments(settings, step)) if self.arguments else {}

    @property
    def summary(self) -> str:
        return _first_line(self.compute)


@dataclass(frozen=True)
class Method:
    """A value of ``algorithm.name``: the preset it fills ``algorithm.*`` with and its weighting."""

    name: str
    preset: Mapping[str, Any]
    weighting: str = "none"


@dataclass(frozen=True)
class AdvantageEstimator:
    """``compute(rewards [B], group_ids [B]) -> advantages [B]``."""

    name: str
    compute: Callable[..., Tensor]

    @property
    def summary(self) -> str:
        return _first_line(self.compute)


@dataclass(frozen=True)
class LossAggregation:
    """``Agg(X, m) = numerator(X, m) / normaliser(whole-batch mask, max_len)``: the numerator is summed
    over micro-batches, the normaliser is computed once for the whole batch."""

    name: str
    numerator: Callable[[Tensor, Tensor], Tensor]
    normaliser: Callable[[Tensor, int | None], float]
    summary: str = ""


WEIGHTINGS: dict[str, TokenWeighting] = {}
METHODS: dict[str, Method] = {}
ADVANTAGES: dict[str, AdvantageEstimator] = {}
AGGREGATIONS: dict[str, LossAggregation] = {}


def register_weighting(record: TokenWeighting, method: bool = True) -> TokenWeighting:
    """Add a token weighting and (``method=True``) the ``algorithm.name`` of the same name."""
    _add(WEIGHTINGS, record.name, record, "token weighting", record.compute)
    if method:
        register_method(Method(record.name, dict(record.preset), record.name))
    return record


def register_method(record: Method) -> Method:
    """Add an ``algorithm.name`` (a preset, and the weighting it trains with)."""
    if record.weighting not in WEIGHTINGS:
        raise ValueError(f"method {record.name!r}: no token weighting {record.weighting!r} is registered")
    unknown = set(record.preset) - set(GRPO)
    if unknown:
        raise ValueError(f"method {record.name!r}: preset keys {sorted(unknown)} are not preset fields")
    return _add(METHODS, record.name, record, "method", WEIGHTINGS[record.weighting].compute)


def register_advantage(record: AdvantageEstimator) -> AdvantageEstimator:
    return _add(ADVANTAGES, record.name, record, "advantage estimator", record.compute)


def register_aggregation(record: LossAggregation) -> LossAggregation:
    return _add(AGGREGATIONS, record.name, record, "loss aggregation", record.numerator)


def compute_weights(name: str, inputs: WeightingInputs, **params: Any) -> TokenWeights:
    """The one place a weighting is chosen by name."""
    if name not in WEIGHTINGS:
        raise ValueError(f"unknown token weighting {name!r}; choose one of {sorted(WEIGHTINGS)}")
    return WEIGHTINGS[name].compute(inputs, **params)


def settings_types() -> dict[str, type]:
    """``algorithm.<name>`` sections: every registered weighting that has settings."""
    return {n: w.settings for n, w in WEIGHTINGS.items() if w.settings is not None}


def _add(table: dict[str, Any], name: str, record: Any, kind: str, fn: Callable) -> Any:
    """Refuse a second record under a taken name, unless it is the same definition imported twice
    (a test module imported under two names)."""
    prev = table.get(name)
    if prev is not None and prev != record and not _same_source(prev, record, fn):
        raise ValueError(f"a {kind} named {name!r} is already registered")
    table[name] = record
    return record


def _same_source(prev: Any, record: Any, fn: Callable) -> bool:
    old = getattr(prev, "compute", None) or getattr(prev, "numerator", None)
    try:
        return old is not None and (old.__qualname__, inspect.getsourcefile(old)) == (
            fn.__qualname__,
            inspect.getsourcefile(fn),
        )
    except TypeError:
        return False


def _first_line(fn: Callable) -> str:
    return (inspect.getdoc(fn) or "").split("\n", 1)[0]
