"""docs/examples/sql_env.py, the own-tool-task page's environment (docs/own-tool-task.md): its
contract on its own JSONL, the tool on the episode's thread, and the task file it writes."""

from __future__ import annotations

import sys

from agentrl.cli import main
from tests.helpers import ROOT

EXAMPLE = ROOT / "docs" / "examples" / "sql_env.py"
TASKS = ROOT / "docs" / "examples" / "sql_tasks.jsonl"


def _module():
    from agentrl.env import import_environment_module, registered

    import_environment_module(str(EXAMPLE))  # as env.module imports it (once per process)
    return sys.modules[registered()["sql_lookup"].__module__]


def test_the_sql_example_passes_its_check_on_its_own_tasks(capsys):
    assert main(["envs", "check", "sql_lookup", "--module", str(EXAMPLE), "--data", str(TASKS)]) == 0
    out = capsys.readouterr().out
    assert "360 tasks from" in out and "32 of 32 solver demonstrations replay and score > 0" in out, out


def test_the_task_file_is_what_the_example_writes_and_queries_answer_it(tmp_path):
    module = _module()
    module.write_tasks(str(tmp_path / "tasks.jsonl"))
    assert (tmp_path / "tasks.jsonl").read_text() == TASKS.read_text()
    from agentrl.env import Task

    env = module.SqlLookup()
    env.reset(Task(id="P007-price", prompt="What is the price of product P007?", answer="0"), 0)
    try:
        assert env.sql("SELECT price FROM products WHERE name = 'P007'") == str(module.products()[7][1])
        assert env.sql("SELECT name FROM products WHERE name = 'nope'") == "(no rows)"
    finally:
        env.close()
