"""shop: multi-turn tool use with several typed JSON tools and many valid call sequences.

``Order: 3 apple, 2 pen. What is the total price?`` The prices are hidden in the shop: the model
must call tools, ``<tool_call>{"name": "lookup_price", "arguments": {"item": "apple"}}</tool_call>``.
Three tools with typed arguments: ``lookup_price(item: str)``, ``add_to_cart(item: str, qty: int)``
and ``cart_total()``. Either strategy works (look prices up and multiply, or fill the cart and ask
for its total), with calls in any order, several per turn or one per turn; the final answer is the
total in ``\\boxed{}``. Knobs: ``num_items`` (2), ``max_qty`` (5), ``max_price`` (9), ``cents``
(False: whole-dollar prices), ``num_distractors`` (2 other items on sale).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar

from agentrl.env import Environment, Message, Reward, Task, ToolFeedback, register, tool
from agentrl.tools import format_tool_call
from environments.generators import Draw, demo_rng, sample_tasks
from environments.math_equiv import extract_answer
from environments.rewards import correct, has_answer, num_tool_calls

_ITEMS = ("apple", "pen", "cup", "book", "lamp", "sock", "soap", "egg", "hat", "bag", "jam", "tea")


def money(cents: int) -> str:
    """``400`` -> ``4``, ``450`` -> ``4.50``: whole dollars stay integers (short for tiny models)."""
    return str(cents // 100) if cents % 100 == 0 else f"{cents // 100}.{cents % 100:02d}"


def make_order(
    rng: random.Random,
    num_items: int = 2,
    max_qty: int = 5,
    max_price: int = 9,
    cents: bool = False,
    num_distractors: int = 2,
) -> Draw:
    names = rng.sample(_ITEMS, num_items + num_distractors)
    prices = {
        n: rng.randint(1, max_price) * 100 + (rng.choice((0, 25, 50, 75)) if cents else 0) for n in names
    }
    order = [(n, rng.randint(1, max_qty)) for n in names[:num_items]]
    total = sum(q * prices[n] for n, q in order)
    prompt = "Order: " + ", ".join(f"{q} {n}" for n, q in order) + ". What is the total price?"
    key = "shop|" + "|".join(f"{n}:{q}" for n, q in sorted(order))  # the prompt, not the hidden prices
    return key, prompt, money(total), {"family": "shop", "order": order, "prices_cents": prices}


@register
class Shop(Environment):
    name = "shop"
    system_prompt = "Use the tools to find prices. Give the total as \\boxed{N}."
    tool_format = "json"
    max_turns: ClassVar[int] = 6

    def reset(self, task: Task, seed: int) -> list[Message]:
        self.prices: dict[str, int] = dict(task.metadata["prices_cents"])
        self.cart: dict[str, int] = {}
        return super().reset(task, seed)

    def final_answer(self, text: str) -> str | None:
        return extract_answer(text)

    def _check_item(self, item: str) -> None:
        if item not in self.prices:
            raise ToolFeedback(f"no item {item!r} in the shop; items: {', '.join(sorted(self.prices))}")

    @tool
    def lookup_price(self, item: str) -> str:
        """Price of one unit of an item, in dollars.

        Args:
            item: the item's name, e.g. "apple".
        """
        self._check_item(item)
        return money(self.prices[item])

    @tool
    def add_to_cart(self, item: str, qty: int) -> str:
        """Put some units of an item in the cart.

        Args:
            item: the item's name, e.g. "apple".
            qty: how many units to add (1 or more).
        """
        self._check_item(item)
        if qty < 1:
            raise ToolFeedback(f"qty must be at least 1, got {qty}")
        self.cart[item] = self.cart.get(item, 0) + qty
        return f"added {qty} {item}"

    @tool
    def cart_total(self) -> str:
        """Total price of everything in the cart, in dollars."""
        return money(sum(q * self.prices[n] for n, q in self.cart.items()))

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
        """Orders with hidden prices; knobs go to ``make_order``."""
        return sample_tasks("shop", lambda rng: make_order(rng, **knobs), split, n, seed)

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        """A random strategy per task (all lookups in one turn, one lookup per turn, or the cart)
        with calls in random order; tool outputs come from running the environment itself."""
        return [_demo(cls(), task, demo_rng(seed, task), seed) for task in tasks]

    def rewards(self) -> list[Reward]:
        return [
            Reward("correct", correct, 1.0),
            Reward("has_answer", has_answer, 0.0),
            Reward("num_tool_calls", num_tool_calls, 0.0),
        ]


def _demo(env: Shop, task: Task, rng: random.Random, seed: int) -> list[Message]:
    order = rng.sample(list(task.metadata["order"]), len(task.metadata["order"]))
    strategy = rng.choice(("lookup_together", "lookup_each", "cart"))
    if strategy == "cart":
        turns = [
            [format_tool_call("add_to_cart", {"item": n, "qty": q}) for n, q in order],
            [format_tool_call("cart_total", {})],
        ]
    else:
        calls = [format_tool_call("lookup_price", {"item": n}) for n, _ in order]
        turns = [calls] if strategy == "lookup_together" else [[c] for c in calls]
    msgs = env.reset(task, seed)
    for calls in turns:
        action = "\n".join(calls)
        msgs.append({"role": "assistant", "content": action})
        msgs.extend(env.step(action).observation)
    final = f"\\boxed{{{task.answer}}}" if strategy == "cart" else _sum_text(order, env.prices, rng)
    msgs.append({"role": "assistant", "content": final})
    env.close()
    return msgs


def _sum_text(order: list[tuple[str, int]], prices: dict[str, int], rng: random.Random) -> str:
    """``3*4=12`` per item (factors in random order), the running sum, then the boxed total."""
    lines, acc = [], 0
    for n, q in order:
        a, b = (str(q), money(prices[n])) if rng.random() < 0.5 else (money(prices[n]), str(q))
        lines.append(f"{a}*{b}={money(q * prices[n])}")
    for i, (n, q) in enumerate(order):
        value = q * prices[n]
        if i:
            lines.append(f"{money(acc)}+{money(value)}={money(acc + value)}")
        acc += value
    return "\n".join([*lines, f"\\boxed{{{money(acc)}}}"])
