"""Environments from installed packages: the ``agentrl.environments`` entry-point group, which the
built-in environments use too. A package on the path that declares one is enough (no ``env.module``);
one that cannot be loaded is named with the reason, and the others still load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.env import registry as env_mod
from tests.helpers import ROOT

PLUGIN = '''
from agentrl.env import Environment, Reward, Task


class Echo(Environment):
    """Say the word back (a third-party test environment)."""

    name = "plugin_echo"

    @classmethod
    def load_tasks(cls, split, n, seed=0, **knobs):
        return [Task(id=f"echo-{split}-{i}", prompt=f"Say {i}", answer=str(i)) for i in range(n)]

    def rewards(self):
        return [Reward("correct", lambda task, state: 1.0)]
'''


def _install(site: Path, entries: dict[str, str]) -> None:
    """A minimal installed distribution: a module and a dist-info with entry points."""
    (site / "my_envs.py").write_text(PLUGIN)
    info = site / "my_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-envs\nVersion: 0.1\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entries.items())
    (info / "entry_points.txt").write_text(f"[agentrl.environments]\n{lines}")


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(env_mod, "_PLUGINS_LOADED", False)
    monkeypatch.setattr(env_mod, "_PLUGIN_ERRORS", {})
    monkeypatch.setattr(env_mod, "_REGISTRY", dict(env_mod._REGISTRY))
    return tmp_path


def test_builtin_environments_come_from_the_entry_point_group():
    from importlib.metadata import entry_points

    declared = {ep.name for ep in entry_points(group=env_mod.ENTRY_POINT_GROUP)}
    assert {"calculator", "short_cot", "gsm_symbolic", "code_interpreter"} <= declared
    assert declared <= set(env_mod.registered())


def test_an_installed_package_registers_without_env_module(site):
    _install(site, {"plugin_echo": "my_envs:Echo"})
    assert "plugin_echo" in env_mod.registered()
    cfg = load_config(None, ["env.name=plugin_echo"])  # no env.module
    assert cfg.env.name == "plugin_echo" and not cfg.env.module


def test_a_broken_entry_point_is_named_and_the_rest_still_load(site):
    _install(site, {"plugin_echo": "my_envs:Echo", "plugin_gone": "no_such_module:Env",
                    "plugin_misnamed": "my_envs:Echo"})  # fmt: skip
    envs = env_mod.registered()
    assert "plugin_echo" in envs and "calculator" in envs
    errors = env_mod.entry_point_errors()
    assert "no_such_module" in errors["plugin_gone"] and "ModuleNotFoundError" in errors["plugin_gone"]
    assert "'plugin_echo'" in errors["plugin_misnamed"]
    with pytest.raises(ConfigError, match=r"env.name='plugin_gone' is installed but could not be loaded"):
        load_config(None, ["env.name=plugin_gone"])
    with pytest.raises(KeyError, match="no_such_module"):
        env_mod.make_env("plugin_gone")


def test_envs_list_shows_an_installed_package(tmp_path):
    _install(tmp_path, {"plugin_echo": "my_envs:Echo", "plugin_gone": "no_such_module:Env"})
    root = ROOT
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "envs", "list"],
        capture_output=True, text=True, timeout=120, cwd=root,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "plugin_echo" in proc.stdout and "Say the word back" in proc.stdout
    assert "plugin_gone" in proc.stdout and "NOT LOADED" in proc.stdout
