"""What a warm start depends on besides its settings, each as a content digest: the base model, the
environment's code, the data file and the demonstrations file. ``build.warm_start_key`` hashes them
with the settings, so editing a solver, a JSONL of tasks or of demonstrations (the normal way to
iterate) trains a new warm start instead of silently reusing the old one; a reuse names the inputs
that matched (``describe``)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
from pathlib import Path
from typing import Any

from agentrl.config import DataConfig
from agentrl.training import lora


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes, 16 hex digits; ``missing`` when there is no such file."""
    p = Path(path)
    if not p.is_file():
        return "missing"
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def warm_start_inputs(
    base: str, env_cls: type[Any], env_module: str | None, data: DataConfig, demos: str | None
) -> dict[str, str]:
    """Name -> digest of each input a warm start from ``base`` reads: ``model`` (its config and
    safetensors headers, ``lora.identity``), ``environment`` (the source file of ``env_cls``, and
    agentrl's version for a built-in one), ``env.module`` (a user's module file), ``data`` (the task
    file, when tasks come from one), ``demos`` (``sft.demos``)."""
    out = {"model": lora.identity(base)["fingerprint"]}
    source = inspect.getsourcefile(env_cls)
    out["environment"] = f"{env_cls.__module__}:{file_digest(source) if source else 'unknown'}"
    if env_cls.__module__.startswith(("environments.", "agentrl.")):  # built in: its helpers too
        out["environment"] += f"@agentrl {importlib.metadata.version('agentrl')}"
    module: str = env_module or ""
    if module.endswith(".py"):
        out["env.module"] = file_digest(module)
    path: str = data.path or ""
    if data.source == "file" and path:
        out["data"] = file_digest(path.replace("{split}", data.train_split))
    if demos:
        out["demos"] = file_digest(demos)
    return out


def describe(inputs: dict[str, str]) -> str:
    """``the same model (fingerprint ...), environment ..., data file ...``: what a reused warm
    start matched, for the log line that says it is reused."""
    return ", ".join(f"{NAMES.get(k, k)} {v}" for k, v in inputs.items())


NAMES = {
    "model": "model",
    "environment": "environment code",
    "env.module": "env.module file",
    "data": "data file",
    "demos": "demonstrations file",
}
"""How the log names each input."""
