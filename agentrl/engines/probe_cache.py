"""Measurements of this machine that choose a default (``rollout.cpu_gemm: auto``), kept on disk so
that a run does not repeat them: ``$AGENTRL_CACHE/probes/<name>.json``, one entry per CPU model and
flags, torch version, thread count and the measurement's own key.

A measurement taken while the machine was busy stays until the file is deleted: ``agentrl`` prints
where each choice came from (a fresh measurement or this file), so a surprising one can be traced
and measured again by removing the file."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def cache_file(name: str) -> Path:
    """Where the measurements called ``name`` are kept."""
    root = Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")
    return root / "probes" / f"{name}.json"


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 ``flags``, Arm ``Features``); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_key() -> str:
    """The CPU model, a digest of its feature flags (one model name can hide other instruction
    sets on a VM), and torch's version and thread count: what decides a product's speed."""
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:8]
    return f"{cpu_model()} (flags {flags}) | torch {torch.__version__} | {torch.get_num_threads()} threads"


def measured(
    name: str, key: str, measure: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], Path | None]:
    """The measurement ``key`` of ``name`` on this machine: from the cache file, or ``measure()``d now
    and written there (with its date). Returns it and the file it came from (None when measured now).
    A cache that cannot be read or written is measured around, never an error."""
    path = cache_file(name)
    full = f"{machine_key()} | {key}"
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        entries = {}
    if isinstance(entries, dict) and isinstance(entries.get(full), dict):
        return entries[full], path
    value = {**measure(), "measured": time.strftime("%Y-%m-%d", time.gmtime())}
    entries = entries if isinstance(entries, dict) else {}
    entries[full] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(f.name, path)
    except OSError:
        pass
    return value, None
