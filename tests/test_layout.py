"""The package's shape (docs/architecture.md): agentrl's subpackages and core modules, the built-in
environments and the sandboxes sit on floors, and a module imports only from its own floor's unit or
from floors below. Every import counts: inside functions (a cycle hidden in a function is still a
cycle) and under ``if TYPE_CHECKING:`` (an annotation that names a higher layer is a climb too). No
private name (``_x``) is imported from another unit, and no module cycle exists."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT

TREES = ("agentrl", "environments", "sandboxes")

FLOORS: list[tuple[str, ...]] = [  # bottom to top; each entry a unit: a core module or a package
    ("agentrl",),  # the package's own __init__
    ("agentrl.errors",),
    ("agentrl.seeds",),
    ("agentrl.timeouts",),
    ("agentrl.dataclass_tree",),
    ("agentrl.episode",),
    ("agentrl.transcripts",),
    ("agentrl.tools",),
    ("agentrl.models.stopping",),
    ("sandboxes",),
    ("agentrl.serve",),
    ("agentrl.algorithms",),
    ("agentrl.models",),
    ("agentrl.env", "agentrl.agents"),  # agents.py: the documented ``agentrl.agents`` import
    ("environments",),
    ("agentrl.sync.registry",),  # the weight transports' names and needs, read by the config
    ("agentrl.engines.registry",),  # the engines' names and what each supports, read by the config
    ("agentrl.config",),
    ("agentrl.engines",),
    ("agentrl.parallel",),
    ("agentrl.sync",),
    ("agentrl.rollout",),
    ("agentrl.training",),
    ("agentrl.assembly",),
    ("agentrl.plan",),  # agentrl plan: reads the whole Config, like the assembly below it
    ("agentrl.views",),
    ("agentrl.study",),
    ("agentrl.cli",),
]
RANK = {unit: i for i, units in enumerate(FLOORS) for unit in units}


def unit_of(module: str) -> str:
    """The floor unit a module belongs to: its longest prefix that names a unit."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANK:
            return ".".join(parts[:n])
    raise KeyError(f"{module} is on no floor: add it (or its package) to FLOORS in tests/test_layout.py")


def _where(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def modules(trees: tuple[str, ...] = TREES) -> dict[str, Path]:
    files = {}
    for tree in trees:
        for p in (ROOT / tree).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return files


def imports(files: dict[str, Path]) -> list[tuple[str, str, str, int]]:
    """(importer, imported module, imported name or "", line) for every import of a known module,
    anywhere in the source, ``TYPE_CHECKING`` blocks included."""
    out = []
    for m, p in files.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if sub in files:  # ``from agentrl.env import data``: the submodule
                        out.append((m, sub, "", node.lineno))
                    elif node.module in files:
                        out.append((m, node.module, a.name, node.lineno))
            elif isinstance(node, ast.Import):
                out += [(m, a.name, "", node.lineno) for a in node.names if a.name in files]
    return [(m, t, name, line) for m, t, name, line in out if t != m]


def climbs(files: dict[str, Path]) -> list[str]:
    """Each import of a higher floor, named with file and line."""
    bad = []
    for m, t, _, line in imports(files):
        um, ut = unit_of(m), unit_of(t)
        if um != ut and RANK[ut] > RANK[um]:
            bad.append(f"{_where(files[m])}:{line}: {m} ({um}) imports {t} ({ut}), a higher floor")
    return bad


def private_crossings(files: dict[str, Path]) -> list[str]:
    bad = []
    for m, t, name, line in imports(files):
        private = name.startswith("_") and not name.startswith("__")
        if private and unit_of(m) != unit_of(t):
            bad.append(f"{_where(files[m])}:{line}: {m} imports the private {t}.{name}")
    return bad


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in files}
    for m, t, _, _ in imports(files):
        graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_is_on_a_floor():
    for m in modules():
        unit_of(m)


def test_no_module_imports_a_higher_floor():
    assert climbs(modules()) == []


def test_no_private_name_crosses_a_unit():
    assert private_crossings(modules()) == []


def test_no_import_cycles():
    assert cycles(import_graph(modules())) == []


ASSEMBLY = "agentrl.assembly"
"""The lowest floor that may take the whole ``Config`` and build parts from it; below it, each part
takes its own sections of the config or a settings record of plain values (``LearnerSettings``,
``RunnerSettings``, ``make_strategy(cfg.trainer, ...)``)."""

STILL_TAKING_THE_CONFIG: set[str] = (
    set()
)  # modules below the assembly allowed the whole Config: none; may only stay empty


def whole_config_takers(files: dict[str, Path]) -> list[str]:
    """Each import of the whole ``Config`` below the assembly, by a module not listed as still
    taking it."""
    return [
        f"{_where(files[m])}:{line}: {m} ({unit_of(m)}) takes the whole Config: give it its section or plain values"
        for m, t, name, line in imports(files)
        if t in ("agentrl.config", "agentrl.config.schema")
        and name == "Config"
        and RANK[unit_of(m)] < RANK[ASSEMBLY]
        and unit_of(m) != "agentrl.config"
        and m not in STILL_TAKING_THE_CONFIG
    ]


def test_parts_below_the_assembly_take_their_own_settings():
    assert whole_config_takers(modules()) == []


def test_the_modules_still_taking_the_config_do():
    """A module converted (or moved up) leaves ``STILL_TAKING_THE_CONFIG``: the list only shrinks."""
    files = modules()
    takers = {m for m, t, name, _ in imports(files) if t.startswith("agentrl.config") and name == "Config"}
    assert sorted(STILL_TAKING_THE_CONFIG - takers) == []


def test_at_most_eight_core_modules():
    core = [p.name for p in (ROOT / "agentrl").glob("*.py") if p.name != "__init__.py"]
    assert len(core) <= 8, sorted(core)


@pytest.mark.parametrize(
    "source, finding",
    [
        # a climb under TYPE_CHECKING, and one inside a function
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agentrl.training.trainer import Trainer\n",
         "imports agentrl.training.trainer (agentrl.training), a higher floor"),
        ("def f():\n    from agentrl.cli import build_parser\n", "imports agentrl.cli (agentrl.cli), a higher floor"),
        ("from agentrl.models.chat import _internal\n", "imports the private agentrl.models.chat._internal"),
        ("from agentrl.config import Config\n", "takes the whole Config"),
    ],
)  # fmt: skip
def test_the_checks_catch_a_planted_violation(tmp_path, source, finding):
    """A module planted in the engines floor that climbs, or takes a private name from another unit."""
    files = modules()
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    files["agentrl.engines.planted"] = planted
    found = [
        line
        for line in climbs(files) + private_crossings(files) + whole_config_takers(files)
        if "planted" in line
    ]
    assert len(found) == 1 and finding in found[0], found


def init_code(files: dict[str, Path]) -> list[str]:
    """Each statement of a package's ``__init__.py`` that is not its docstring, an import or
    ``__all__``: a package's code lives in its modules, where it can be found by name."""
    bad = []
    for path in files.values():
        if path.name != "__init__.py":
            continue
        for i, node in enumerate(ast.parse(path.read_text()).body):
            docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            names_all = isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]
            if not (docstring or names_all or isinstance(node, (ast.Import, ast.ImportFrom))):
                bad.append(f"{_where(path)}:{node.lineno}: {type(node).__name__.lower()} in an __init__.py")
    return bad


def test_init_files_hold_re_exports_only():
    assert init_code(modules()) == []


def test_the_init_check_catches_code(tmp_path):
    planted = tmp_path / "__init__.py"
    planted.write_text(
        '"""A package."""\n\nfrom x import y\n\n__all__ = ["y"]\n\n\ndef helper():\n    pass\n'
    )
    assert [line.split(": ", 1)[1] for line in init_code({"planted": planted})] == [
        "functiondef in an __init__.py"
    ]


CLASS_LINES, FUNCTION_LINES = 300, 60
DECLARATIVE = {  # tables, not logic: one entry a line, so exempt from the limit; each may only shrink
}


def sizes(kind: type, limit: int) -> dict[str, int]:
    out = {}
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if kind is ast.FunctionDef else (kind,)
            if isinstance(node, kinds) and (n := node.end_lineno - node.lineno + 1) > limit:  # type: ignore[operator]
                out[f"{path.relative_to(ROOT)}:{node.name}"] = n
    return out


def test_no_class_over_300_lines():
    assert sizes(ast.ClassDef, CLASS_LINES) == {}


def test_no_function_over_60_lines_outside_declarative_tables():
    long = sizes(ast.FunctionDef, FUNCTION_LINES)
    grown = {k: (n, DECLARATIVE.get(k)) for k, n in long.items() if n > DECLARATIVE.get(k, FUNCTION_LINES)}
    assert grown == {}, f"over {FUNCTION_LINES} lines (or a table longer than when listed): {grown}"


# -- the tests' own layout ----------------------------------------------------------------------------
TEST_FOLDERS_BESIDES_PACKAGES = {"helpers", "data", "core"}  # shared code, fixtures' data, core modules


def test_test_folders_mirror_the_packages():
    """tests/<name>/ holds the tests of agentrl/<name>/ (or of sandboxes/, environments/); core modules'
    tests are in tests/core/, what crosses every package (layout, docs, the newcomer's path) at the top."""
    packages = {p.name for p in (ROOT / "agentrl").iterdir() if (p / "__init__.py").exists()}
    packages |= {"sandboxes", "environments"}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders - packages - TEST_FOLDERS_BESIDES_PACKAGES == set()


def test_no_test_file_imports_another():
    """Tests share code only through tests/helpers, imported one way (``from tests.helpers...``)."""
    bad = []
    for p in (ROOT / "tests").rglob("*.py"):
        if "data" in p.relative_to(ROOT / "tests").parts:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                if name.startswith("tests") and not name.startswith("tests.helpers") and name != "tests":
                    bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: imports {name}")
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: a relative import")
            touches_path = (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and getattr(node.value, "id", "") == "sys"
            )
            if touches_path and (p.name.startswith("test_") or p.name == "conftest.py"):
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: uses sys.path")
    assert bad == []
