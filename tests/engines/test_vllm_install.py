"""A vLLM install too old for the engine is named when the config is checked, before any work
(``engines/vllm.py`` ``install_problem``; without it such an install started and failed at the first
weight sync with a ModuleNotFoundError). The installed vLLM of the vLLM tier passes the same check
there (tests/engines/test_vllm_engine.py)."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util

import pytest

from agentrl.assembly import preflight
from agentrl.config import ConfigError, load_config
from agentrl.engines import vllm as engine


def fake_install(monkeypatch, root, version: str | None, reload: bool) -> None:
    """A ``vllm`` distribution of ``version`` at ``root``, with or without the reload package."""
    package = root / "vllm"
    (package / "model_executor" / "model_loader").mkdir(parents=True)
    if reload:
        (package / "model_executor" / "model_loader" / "reload").mkdir()
        (package / "model_executor" / "model_loader" / "reload" / "__init__.py").write_text("")
    spec = importlib.machinery.ModuleSpec("vllm", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    real_find = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: spec if name == "vllm" else real_find(name, *a)
    )

    def version_of(dist: str) -> str:
        if dist == "vllm" and version is not None:
            return version
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "version", version_of)


@pytest.mark.parametrize(
    ("version", "reload", "said"),
    [
        ("0.10.2", False, "vLLM 0.10.2 is installed, but agentrl's vLLM engine needs vLLM >= 0.32"),
        (
            "0.31.1+cu130",
            True,
            "vLLM 0.31.1+cu130 is installed, but agentrl's vLLM engine needs vLLM >= 0.32",
        ),
        (None, False, "has no vllm.model_executor.model_loader.reload"),
    ],
)
def test_an_install_without_the_reload_api_is_named(tmp_path, monkeypatch, version, reload, said):
    fake_install(monkeypatch, tmp_path, version, reload)
    assert said in (engine.install_problem() or "")
    cfg = load_config(None, ["rollout.engine=vllm", f"run.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"rollout\.engine=vllm: .*pip install 'vllm>=0\.32'"):
        preflight.check_inputs(cfg, train=True, test=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("version", ["0.32.0", "0.33.1", "1.0.0"])
def test_a_release_with_the_reload_api_passes(tmp_path, monkeypatch, version):
    fake_install(monkeypatch, tmp_path, version, reload=True)
    assert engine.install_problem() is None
