"""``agentrl plan``: the memory one GPU needs for a config, term by term, in the budget each term
must fit, and whether every budget holds (``budgets.py``'s docstring: the terms and their formulas)."""

from agentrl.plan.architecture import Architecture, architecture
from agentrl.plan.budgets import (
    CHUNK_COPIES,
    GIB,
    Budget,
    Plan,
    Term,
    hf_engine_terms,
    plan,
    render,
    sizes,
    verdict,
)

__all__ = [
    "CHUNK_COPIES",
    "GIB",
    "Architecture",
    "Budget",
    "Plan",
    "Term",
    "architecture",
    "hf_engine_terms",
    "plan",
    "render",
    "sizes",
    "verdict",
]
