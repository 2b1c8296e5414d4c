"""No setting that does nothing: every config key is read by the code (a static walk of the schema
against the attribute chains in agentrl/, environments/ and sandboxes/), and the keys that were once
accepted and ignored now act."""

from __future__ import annotations

import ast
import json

import pytest

from agentrl import dataclass_tree
from agentrl.algorithms import WEIGHTINGS
from agentrl.assembly import components, make_trainer
from agentrl.config import Config, load_config
from agentrl.engines.registry import ENGINES
from sandboxes import SANDBOXES
from tests.helpers import ROOT
from tests.helpers.configs import small_config

PRODUCT = [ROOT / d for d in ("agentrl", "environments", "sandboxes")]
NOT_USES = {"schema_runtime.py", "loading.py", "describe.py", "dataclass_tree.py"}
"""The schema's sections outside ``schema.py`` (whose readers, ``output_dir`` and the weighting's,
do read keys), its loader, its reference page and its generic machinery: they validate and
describe every key, which is not using it."""


def _section_types() -> dict[str, str]:
    """Config section class name -> its dotted path (``StareConfig`` -> ``algorithm.stare``)."""
    out = {"Config": ""}

    def walk(cls: type, prefix: str) -> None:
        for name in dataclass_tree.field_names(cls):
            tp = dataclass_tree.key_type(cls, name)
            if dataclass_tree.is_section(tp):
                out[tp.__name__] = prefix + name
                walk(tp, prefix + name + ".")

    walk(Config, "")
    return out


def _section_properties() -> set[str]:
    """The schema's own derived values: a section's properties (``trainer.computes_bf16``)."""
    import agentrl.config.schema as schema

    out = set()
    for name, path in _section_types().items():
        cls = getattr(schema, name, None)
        for attr, value in vars(cls).items() if cls else ():
            if isinstance(value, property):
                out.add(f"{path}.{attr}".lstrip("."))
    return out


def record_reads() -> set[str]:
    """Keys the product reads through a registry record rather than by name: a sandbox backend's
    ``keys`` (``components.sandbox_spec``) and an engine's settings section (``components.engine_spec``
    hands it whole to the builder)."""
    out = {
        f"sandbox.{k}"
        for r in SANDBOXES.values()
        if r.builder.__module__ == "sandboxes.factory"
        for k in r.keys.values()
    }
    sections = {
        f"rollout.{r.settings}." for r in ENGINES.values() if isinstance(r.builder, str) and r.settings
    }
    return out | {p for p in dataclass_tree.leaf_paths(Config) if any(p.startswith(s) for s in sections)}


def read_paths() -> set[str]:
    """Dotted config paths the product code reads. A chain is resolved from a root the code types:
    a name or ``self.<name>`` annotated (or assigned) with a config class (``cfg: Config``,
    ``s: StareConfig``), or a local bound to such a chain (``t = cfg.trainer``; ``a, t = ...``)."""
    sections = _section_types()
    trees = [
        ast.parse(p.read_text()) for root in PRODUCT for p in root.rglob("*.py") if p.name not in NOT_USES
    ]
    records = _records(trees, sections)
    found: set[str] = set()
    for tree in trees:
        found |= _paths_in(tree, sections, records=records)
    return found


def _records(trees: list[ast.AST], sections: dict[str, str]) -> dict[str, dict[str, str]]:
    """Settings records: a class with fields annotated by config sections (``LearnerSettings``:
    ``algorithm: AlgorithmConfig``) -> {field: the section's path}; a part reading
    ``settings.algorithm.clip_low`` reads ``algorithm.clip_low``."""
    out: dict[str, dict[str, str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                fields = {
                    ast.unparse(f.target): sections[name]
                    for f in node.body
                    if isinstance(f, ast.AnnAssign)
                    and (name := ast.unparse(f.annotation).split(".")[-1].strip("'\"")) in sections
                }
                if fields and node.name not in sections:
                    out[node.name] = fields
    return out


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _paths_in(
    tree: ast.AST,
    sections: dict[str, str],
    inherited: dict[str, str] | None = None,
    records: dict[str, dict[str, str]] | None = None,
) -> set[str]:
    """Paths read in a scope (the module, a class, a function body), then in the scopes nested in it.
    A nested scope inherits its parent's roots (a closure sees ``cfg``); a class's methods share the
    ``self.<name>`` roots any of them binds (``self.cfg = cfg`` in ``__init__``)."""
    roots, records = dict(inherited or {}), records or {}
    nodes = list(_own_nodes(tree))
    for node in [tree, *nodes]:
        for arg, ann in _annotated(node):
            _root(roots, arg, ann, sections, records)
    _bind_locals(nodes, roots)
    if isinstance(tree, ast.ClassDef):  # self.* roots bound in any method hold in all of them
        for method in (n for n in tree.body if isinstance(n, SCOPES)):
            inner = dict(roots)
            for node in [method, *_own_nodes(method)]:
                for arg, ann in _annotated(node):
                    _root(inner, arg, ann, sections, records)
            _bind_locals(list(_own_nodes(method)), inner)
            roots.update({k: v for k, v in inner.items() if k.startswith("self.")})
    found = {r for node in nodes if isinstance(node, ast.Attribute) and (r := _resolve(node, roots))}
    for child in (n for n in ast.walk(tree) if isinstance(n, SCOPES) and n is not tree):
        if _parent_scope(tree, child):
            found |= _paths_in(child, sections, roots, records)
    return found


def _root(
    roots: dict[str, str],
    arg: str,
    ann: ast.AST,
    sections: dict[str, str],
    records: dict[str, dict[str, str]],
) -> None:
    """``arg`` annotated with a section is a root; with a settings record, each of its section fields is."""
    name = ast.unparse(ann).split(".")[-1].strip("'\"")
    if name in sections:
        roots[arg] = sections[name]
    for field, path in records.get(name, {}).items():
        roots[f"{arg}.{field}"] = path


def _bind_locals(nodes: list[ast.AST], roots: dict[str, str]) -> None:
    """Locals bound to a chain: ``t = cfg.trainer``, ``a, b = x, y``, ``self.cfg = cfg``."""
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target, value in _assign_pairs(node):
                resolved = _resolve(value, roots)
                if resolved is not None and isinstance(target, (ast.Name, ast.Attribute)):
                    roots[ast.unparse(target)] = resolved
                if isinstance(target, (ast.Name, ast.Attribute)):  # a record bound whole: its fields
                    v, t = ast.unparse(value), ast.unparse(target)
                    roots.update(
                        {t + k[len(v) :]: p for k, p in list(roots.items()) if k.startswith(v + ".")}
                    )


def _parent_scope(scope: ast.AST, child: ast.AST) -> bool:
    """``child`` is nested directly in ``scope`` (no other function or class between them)."""
    return any(n is child for n in _own_nodes_and_scopes(scope))


def _own_nodes_and_scopes(scope: ast.AST):
    for child in ast.iter_child_nodes(scope):
        yield child
        if not isinstance(child, SCOPES):
            yield from _own_nodes_and_scopes(child)


def _own_nodes(scope: ast.AST):
    """The nodes of a scope, not those of the functions and classes nested in it."""
    for child in ast.iter_child_nodes(scope):
        if isinstance(child, SCOPES):
            continue
        yield child
        yield from _own_nodes(child)


def _annotated(node: ast.AST):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
            if a.annotation is not None:
                yield a.arg, a.annotation
    if isinstance(node, ast.AnnAssign):
        yield ast.unparse(node.target), node.annotation


def _assign_pairs(node: ast.Assign):
    for target in node.targets:
        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
            yield from zip(target.elts, node.value.elts)
        else:
            yield target, node.value


def _resolve(node: ast.AST, roots: dict[str, str]) -> str | None:
    """The config path of an attribute chain whose base is a known root, else None."""
    text = ast.unparse(node)
    for base in sorted(roots, key=len, reverse=True):
        if text == base:
            return roots[base]
        if text.startswith(base + ".") and _is_chain(node):
            rest = text[len(base) + 1 :]
            return ".".join(p for p in (roots[base], rest) if p)
    return None


def _is_chain(node: ast.AST) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def product_leaves() -> set[str]:
    """Every key of the schema, less the sections of methods registered outside the product (tests
    register their own)."""
    foreign = {n for n, w in WEIGHTINGS.items() if not w.compute.__module__.startswith("agentrl.")}
    return {p for p in dataclass_tree.leaf_paths(Config) if p.split(".")[:2][-1] not in foreign}


def test_every_config_key_is_read_by_the_code():
    leaves = product_leaves()
    reads = read_paths() | record_reads()
    unread = sorted(p for p in leaves if p not in reads)
    assert unread == [], f"config keys nothing reads (wire them or delete them): {unread}"


def test_every_config_chain_in_the_code_is_a_key():
    """The other way: a chain the code reads is a real key or section (a typo is not silently None)."""
    leaves = set(dataclass_tree.leaf_paths(Config))
    sections = set(_section_types().values())
    known = leaves | sections | {p.rsplit(".", 1)[0] for p in leaves} | _section_properties()
    bogus = sorted(p for p in read_paths() if p and p not in known and not p.startswith("algorithm.settings"))
    assert bogus == [], bogus


def test_the_walk_can_see_an_unread_key():
    tree = ast.parse("def f(cfg: Config):\n    t = cfg.trainer\n    return t.lr, cfg.run.seed\n")
    assert _paths_in(tree, _section_types()) >= {"trainer.lr", "run.seed", "trainer"}
    assert "trainer.total_steps" not in _paths_in(tree, _section_types())
    cls = ast.parse(
        "class T:\n    def __init__(self, cfg: Config):\n        self.cfg, self.n = cfg, 1\n"
        "    def g(self):\n        a = self.cfg.algorithm\n        return a.kl_coef, self.cfg.eval.k\n"
    )
    assert _paths_in(cls, _section_types()) >= {"algorithm.kl_coef", "eval.k"}


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_attn_implementation_reaches_the_model(tiny_model_dir, impl):
    cfg = load_config(
        None, [f"model.path={tiny_model_dir}", f"model.attn_implementation={impl}", "run.device=cpu"]
    )
    model, _ = components.load_model(cfg, str(tiny_model_dir))
    assert model.config._attn_implementation == impl


@pytest.mark.slow
def test_log_every_thins_the_console_and_tensorboard(tmp_path, tiny_model_dir, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = small_config(tmp_path, tiny_model_dir, "trainer.total_steps=4", "logging.log_every=3",
                       "logging.tensorboard=true")  # fmt: skip
    make_trainer(cfg, log=lambda *_: None).train()
    progress = [x for x in capsys.readouterr().err.splitlines() if x.startswith("step ")]
    assert len(progress) == 2, progress  # steps 0 and 3 (the last)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # the JSONL keeps every step
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward/mean")] == [0, 3]
