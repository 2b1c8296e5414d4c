"""``agentrl plan``: the memory one GPU needs for a config, term by term, in the budget each term
must fit, and whether every budget holds (``budgets.py``: the budgets; ``terms.py``: the terms and
their formulas)."""

from agentrl.plan.architecture import Architecture, architecture
from agentrl.plan.budgets import Budget, Plan, plan, render, verdict
from agentrl.plan.engine_terms import hf_engine_terms
from agentrl.plan.terms import CHUNK_COPIES, GIB, Term, sizes

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
