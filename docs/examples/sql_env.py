"""Your own tool task: a ``sql(query)`` tool over a small sqlite database, tasks from your JSONL.

Each task asks for one field of one product (``sql_tasks.jsonl``: the question, the answer, and in
its metadata the product and the column the solver needs). Each episode opens its own in-memory
copy of the database in ``reset``; a sqlite connection belongs to the thread that opened it, so the
tools run on the episode's thread (``tools_on_episode_thread``, docs/environments.md, "Which thread
runs what"). docs/own-tool-task.md trains SmolLM2-135M on it and measures what it takes.

    agentrl envs check sql_lookup --module docs/examples/sql_env.py --data docs/examples/sql_tasks.jsonl
"""

from __future__ import annotations

import random
import sqlite3

from agentrl.env import Environment, EpisodeState, Reward, Task, ToolFeedback, register, tool
from agentrl.tools import format_tool_call

COLUMNS = ("price", "stock", "rating")


def products(n: int = 120, seed: int = 0) -> list[tuple[str, int, int, int]]:
    """The made-up catalogue: (name, price, stock, rating), the same on every machine."""
    rng = random.Random(seed)
    return [(f"P{i:03d}", rng.randint(2, 400), rng.randint(0, 90), rng.randint(1, 5)) for i in range(n)]


def open_database() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE products (name TEXT PRIMARY KEY, price INTEGER, stock INTEGER, rating INTEGER)")
    db.executemany("INSERT INTO products VALUES (?, ?, ?, ?)", products())
    return db


@register
class SqlLookup(Environment):
    name = "sql_lookup"
    system_prompt = (
        "You answer questions about a shop's products. The table is products(name, price, stock, "
        "rating). Query it with the sql tool, then give the answer as \\boxed{N}."
    )
    max_turns = 3
    tools_on_episode_thread = True  # the connection opened in reset is used by the tool

    def reset(self, task: Task, seed: int):
        self.db = open_database()
        return super().reset(task, seed)

    @tool
    def sql(self, query: str) -> str:
        """Run one read-only SQL query on the shop's database.

        Args:
            query: a SELECT statement, e.g. "SELECT price FROM products WHERE name = 'P007'".
        """
        if not query.lstrip().lower().startswith("select"):
            raise ToolFeedback("only SELECT queries are allowed")
        try:
            rows = self.db.execute(query).fetchmany(20)
        except sqlite3.Error as e:
            raise ToolFeedback(f"SQL error: {e}") from None
        return "\n".join(", ".join(str(v) for v in row) for row in rows) or "(no rows)"

    def close(self) -> None:
        db = getattr(self, "db", None)
        if db is not None:
            db.close()

    def rewards(self):
        return [Reward("correct", correct), Reward("queried", queried, weight=0.0)]  # weight 0: logged

    @classmethod
    def demonstrations(cls, tasks, seed=0):
        demos = []
        for t in tasks:
            query = f"SELECT {t.metadata['column']} FROM products WHERE name = '{t.metadata['product']}'"
            demos.append(
                [
                    {"role": "system", "content": cls.system_prompt},
                    {"role": "user", "content": t.prompt},
                    {"role": "assistant", "content": format_tool_call("sql", {"query": query})},
                    {"role": "tool", "name": "sql", "content": str(t.answer)},
                    {"role": "assistant", "content": f"\\boxed{{{t.answer}}}"},
                ]
            )
        return demos


def correct(task: Task, state: EpisodeState) -> float:
    return float(state.info.get("answer") == str(task.answer))


def queried(task: Task, state: EpisodeState) -> float:
    return float(any(m["role"] == "tool" for m in state.messages))


def write_tasks(path: str) -> None:
    """``sql_tasks.jsonl``: one question per (product, column), shuffled."""
    import json

    rows = []
    for name, *values in products():
        for col, value in zip(COLUMNS, values):
            question = f"What is the {col} of product {name}?"
            rows.append(
                {
                    "id": f"{name}-{col}",
                    "question": question,
                    "answer": str(value),
                    "product": name,
                    "column": col,
                }
            )
    random.Random(1).shuffle(rows)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    write_tasks("docs/examples/sql_tasks.jsonl")
