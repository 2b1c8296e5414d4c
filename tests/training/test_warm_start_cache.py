"""The warm start's cache key covers what the warm start reads, by content (issue 66, item 1): the
user's environment module, the data file, the demonstrations file and the base model. Before, the key
held their names only, so a user who edited the solver or the JSONL (the normal way to iterate)
silently trained on the old warm start. A reuse says which inputs matched."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest

from agentrl.assembly import build
from agentrl.config import load_config

ENV = """
from agentrl.env import Environment, Task, register


@register
class Env(Environment):
    name = "{name}"

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        return [Task(f"t{{i}}", f"say {{i}}", answer=str(i)) for i in range(n or 4)]

    def demonstrations(self, task):  # the solver
        return [[{{"role": "user", "content": task.prompt}}, {{"role": "assistant", "content": task.answer}}]]
"""


@pytest.fixture
def inputs(tmp_path, tiny_model_dir):
    """A run's files: its own environment module, a task file, a demonstrations file, a copy of the
    tiny model; and the config that warm-starts from them."""
    name = f"ws_env_{uuid.uuid4().hex[:8]}"
    (tmp_path / "env.py").write_text(ENV.format(name=name))
    (tmp_path / "tasks.jsonl").write_text(
        "".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(6))
    )
    demo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    (tmp_path / "demos.jsonl").write_text(json.dumps({"messages": demo}) + "\n")
    shutil.copytree(tiny_model_dir, tmp_path / "model")
    overrides = [
        f"model.path={tmp_path / 'model'}",
        f"env.name={name}",
        f"env.module={tmp_path / 'env.py'}",
        "data.source=file",
        f"data.path={tmp_path / 'tasks.jsonl'}",
        "sft.enabled=true",
        f"sft.demos={tmp_path / 'demos.jsonl'}",
        f"run.output_dir={tmp_path / 'run'}",
    ]
    return tmp_path, load_config(None, overrides)


def key(cfg) -> str:
    return build.warm_start_key(cfg, cfg.model.path)


@pytest.mark.parametrize(
    ("edited", "how"),
    [
        ("env.py", lambda t: t + "\n# the solver, changed\n"),
        ("tasks.jsonl", lambda t: t.replace('"q0"', '"q0 (edited)"')),
        ("demos.jsonl", lambda t: t.replace('"a"', '"a better answer"')),
        ("model/config.json", lambda t: t.replace('"rms_norm_eps"', '"rms_norm_eps_"')),
    ],
)
def test_editing_an_input_the_warm_start_reads_changes_its_key(inputs, edited, how):
    root, cfg = inputs
    before = key(cfg)
    assert key(cfg) == before  # nothing changed: the same key
    path = root / edited
    path.write_text(how(path.read_text()))
    assert key(cfg) != before, f"editing {edited} left the warm start's key as it was"


def test_a_reused_warm_start_says_which_inputs_matched(inputs, monkeypatch):
    root, cfg = inputs
    trained: list[str] = []

    def fake_sft(cfg, base, out, log=print):  # the SFT loop is tested elsewhere; here only the cache
        trained.append(str(out))
        shutil.copytree(base, out)

    monkeypatch.setattr(build, "run_sft", fake_sft)
    said: list[str] = []
    first = build.policy_path(cfg, log=said.append)
    assert len(trained) == 1 and build.policy_path(cfg, log=said.append) == first and len(trained) == 1
    (line,) = [s for s in said if s.startswith("warm start: using cached SFT model")]
    for name in ("model", "environment code", "env.module file", "data file", "demonstrations file"):
        assert f"the same {name} " in line or f", {name} " in line, (name, line)
    (root / "tasks.jsonl").write_text(
        (root / "tasks.jsonl").read_text() + json.dumps({"prompt": "q9", "answer": "9"}) + "\n"
    )
    assert build.policy_path(cfg, log=said.append) != first and len(trained) == 2  # trained anew
