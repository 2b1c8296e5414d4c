"""Every third-party module that agentrl/, environments/ and sandboxes/ import is declared in
pyproject.toml, in the core dependencies or an extra, with a lower bound: an install from the
package alone has what the code needs."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys

import pytest

from tests.helpers import ROOT

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

FIRST_PARTY = {"agentrl", "environments", "sandboxes", "tests"}
# Modules of packages that may be absent from this environment (the vllm extra lives in its own
# virtual environment; wandb is an extra), so packages_distributions() cannot name them.
NOT_INSTALLED = {"vllm": "vllm", "wandb": "wandb"}
# Packages that cannot be declared: verifiers 0.4.0 pins mcp==2.0.0, against the core's mcp>=2.3, so
# no extra of this project can hold it; scripts/test_verifiers.sh installs it in its own environment.
OWN_ENVIRONMENT = {"verifiers": "scripts/test_verifiers.sh"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imports() -> dict[str, set[str]]:
    """Top-level third-party module -> the files that import it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for package in ("agentrl", "environments", "sandboxes"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif _required(node):
                    names = [_required(node)[0]]  # type: ignore[index]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in FIRST_PARTY | {"__future__"}:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def _required(node: ast.AST) -> tuple[str, str] | None:
    """(module, extra) of an adapter's lazy import, ``require("module", "extra", env)``."""
    if not (
        isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require" and len(node.args) >= 2
    ):
        return None
    module, extra = node.args[:2]
    if isinstance(module, ast.Constant) and isinstance(extra, ast.Constant):
        return module.value, extra.value
    return None


def _requires() -> list[tuple[str, str, str]]:
    """(module, extra, file) for every ``require`` call with literal arguments."""
    out = []
    for path in (ROOT / "environments").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            found = _required(node)
            if found:
                out.append((*found, str(path.relative_to(ROOT))))
    return out


def _declared() -> dict[str, str]:
    """Normalised distribution name -> its requirement string, core and every extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    out = {}
    for req in reqs:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
        assert name, req
        out[_normal(name.group())] = req
    return out


def test_every_third_party_import_is_declared_with_a_lower_bound():
    dists = md.packages_distributions()
    declared = _declared()
    problems = []
    for module, files in sorted(_imports().items()):
        if module in OWN_ENVIRONMENT:
            continue
        names = dists.get(module) or ([NOT_INSTALLED[module]] if module in NOT_INSTALLED else [])
        if not names:
            problems.append(
                f"{module} (imported by {sorted(files)[0]}): no installed distribution provides it"
            )
            continue
        reqs = [declared.get(_normal(n)) for n in names]
        req = next((r for r in reqs if r), None)
        if req is None:
            problems.append(f"{module} (imported by {sorted(files)[0]}): {names[0]} is not in pyproject.toml")
        elif ">=" not in req and "==" not in req:
            problems.append(f"{module}: {req!r} has no lower bound")
    assert not problems, "\n".join(problems)


def test_the_scan_sees_imports_inside_functions():
    """The lazy imports (sandboxes, wandb, the MCP client) are the ones most easily left undeclared."""
    found = _imports()
    assert "sandboxes/e2b.py" in found["e2b_code_interpreter"]
    assert "agentrl/training/metrics.py" in found["wandb"]


def test_every_adapter_names_an_extra_that_brings_its_package():
    """``require(module, extra, env)`` tells the user to ``pip install 'agentrl[extra]'``: that
    extra exists and holds the distribution that provides ``module``."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dists = md.packages_distributions()
    calls = _requires()
    assert {m for m, _, _ in calls} >= {"reasoning_gym", "textarena"}
    problems = []
    for module, extra, path in calls:
        if extra not in extras:
            problems.append(f"{path}: require({module!r}, {extra!r}): pyproject.toml has no extra {extra!r}")
            continue
        held = {_normal(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r).group()) for r in extras[extra]}  # type: ignore[union-attr]
        providers = {_normal(d) for d in dists.get(module.split(".")[0], [])}
        if providers and not providers & held:
            problems.append(
                f"{path}: {module} comes from {sorted(providers)}, not in extra {extra!r}: {sorted(held)}"
            )
    assert not problems, "\n".join(problems)


def test_the_metadata_builds_without_a_deprecation_warning():
    """setuptools 77 deprecates ``project.license`` as a table (``{text = ...}``), with a warning on every
    install: the license is an SPDX expression, and the build asks for a setuptools that reads one."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(meta["project"]["license"], str) and meta["project"]["license"] == "Apache-2.0"
    assert not any("License ::" in c for c in meta["project"].get("classifiers", []))  # refused beside SPDX
    (setuptools,) = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    assert setuptools == "setuptools>=77"
