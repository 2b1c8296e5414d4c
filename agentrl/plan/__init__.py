"""``agentrl plan``: the memory one GPU needs for a config, term by term, in the budget each term
must fit, and whether every budget holds.

``architecture.py`` counts the model; ``terms.py`` and ``engine_terms.py`` estimate what each part
holds; ``budgets.py`` puts the terms into the shares of a GPU and checks them; ``rendering.py``
writes what ``agentrl plan`` prints."""

from agentrl.plan.architecture import Architecture, architecture
from agentrl.plan.budgets import Budget, Plan, plan
from agentrl.plan.engine_terms import hf_engine_terms
from agentrl.plan.rendering import render, verdict
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
