"""Loading: defaults ← a YAML file ← dotted overrides, each source checked on its own, merged, built into
the ``Config`` dataclasses, presets and derived values resolved, then the rules of ``checks``; and the
resolved config written back (``save_config``)."""

from __future__ import annotations

import copy
import difflib
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from agentrl import dataclass_tree
from agentrl.algorithms import registry
from agentrl.config.checks import cross_checks, demonstration_problems, environment_problems
from agentrl.config.schema import Config, weighting_name
from agentrl.env import import_environment_module

CONFIG_FILE = "config.yaml"
"""Name of the resolved config inside a run directory."""

RENAMED: dict[str, str] = {
    "sandbox.pool_size": "sandbox.warm_sessions",
    "rollout.max_weight_lag": "rollout.max_staleness",
}
"""Old key -> new key. An old key still works for one release, with a warning naming the new one."""


class ConfigError(ValueError):
    """A config that cannot be used; the message names every bad key and what was expected."""

    def __init__(self, errors: str | Sequence[str]) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        if len(self.errors) == 1:
            msg = self.errors[0]
        else:
            msg = f"{len(self.errors)} problems in the config:\n" + "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(msg)


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    """Defaults ← the YAML file (a run directory means its ``config.yaml``) ← ``key=value`` overrides,
    validated, with presets and derived values resolved. Raises ``ConfigError`` on any problem."""
    sources: list[tuple[str, Any]] = []
    if path is not None:
        file = _config_file(Path(path))
        sources.append((f"in {file}", _read_yaml(file)))
    sources += [(f"from override {o!r}", _parse_override(o)) for o in overrides]
    return _from_sources(sources)


def config_from_dict(data: Mapping[str, Any], overrides: Sequence[str] = ()) -> Config:
    """Like ``load_config`` for a nested mapping instead of a file."""
    return _from_sources(
        [("in the given mapping", data)] + [(f"from override {o!r}", _parse_override(o)) for o in overrides]
    )


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dicts (tuples become lists), ready for YAML or JSON. Of the token weightings'
    settings sections, only the selected method's is kept: the others have no effect on this run,
    and a method registered by some other module must not make the saved config unloadable where
    that module is not imported."""
    tree = _plain(dataclass_tree.to_tree(cfg))
    keep = weighting_name(cfg)
    for name in registry.settings_types():
        if name != keep:
            tree["algorithm"].pop(name, None)
    return tree


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True)


def save_config(cfg: Config, run_dir: str | Path, keep_previous: bool = False) -> Path:
    """Write the resolved config to ``run_dir/config.yaml`` atomically (a temporary file renamed over
    it: a crash leaves the old or the new one, never half); ``load_config(run_dir)`` reads it back.
    ``keep_previous``: a config it replaces with a different one is kept as ``config.prev.yaml``."""
    from agentrl.config.run_history import PREVIOUS_CONFIG

    out = Path(run_dir) / CONFIG_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    text = (
        "# Resolved agentrl config: every value concrete. Load with agentrl.config.load_config.\n"
        + config_to_yaml(cfg)
    )
    if keep_previous and out.is_file() and out.read_text() != text:
        out.with_name(PREVIOUS_CONFIG).write_text(out.read_text())  # a copy: config.yaml is never missing
    tmp = out.with_name(f".{CONFIG_FILE}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    return out


def _from_sources(sources: Sequence[tuple[str, Any]]) -> Config:
    """Check each source on its own (so a message can say where a bad value came from), merge them
    over the defaults, build the dataclasses, resolve presets and derived values, check ranges and
    the rules that tie keys together."""
    merged = dataclass_tree.to_tree(Config())
    origin: dict[str, str] = {}
    errors: list[str] = _import_env_module_early(sources)
    for where, raw in sources:
        raw, errs = _renamed_keys(raw, where)
        errors += errs
        checked, errs = dataclass_tree.check_tree(raw, Config, where)
        errors += errs
        _deep_merge(merged, checked)
        origin.update(dict.fromkeys(_paths(checked), where))
    if errors:
        raise ConfigError(errors)
    cfg: Config = dataclass_tree.build(Config, merged)
    _resolve(cfg)
    problems = [
        *dataclass_tree.check_ranges(cfg),
        *cross_checks(cfg),
        *environment_problems(cfg),
        *demonstration_problems(cfg),
    ]
    if problems:
        raise ConfigError([f"{msg} [{origin[p]}]" if p in origin else msg for p, msg in problems])
    return cfg


def _import_env_module_early(sources: Sequence[tuple[str, Any]]) -> list[str]:
    """Import ``env.module`` (the last source that sets it) before the keys are checked: a user's
    module may register methods as well as environments, and ``algorithm.name`` must see them.
    Returns the problem when the import fails (a missing file is reported with the other rules)."""
    spec, where = None, ""
    for src, raw in sources:
        env = raw.get("env") if isinstance(raw, Mapping) else None
        if isinstance(env, Mapping) and isinstance(env.get("module"), str):
            spec, where = env["module"], src
    if not spec:
        return []
    try:
        import_environment_module(spec)
    except FileNotFoundError:
        return []  # said by checks.environment_problems, with the directory it was looked for in
    except Exception as e:  # ModuleNotFoundError, or the user's module itself raising
        return [f"env.module={spec!r} cannot be imported: {type(e).__name__}: {e} [{where}]"]
    return []


def _renamed_keys(raw: Any, where: str) -> tuple[Any, list[str]]:
    """Move keys listed in ``RENAMED`` to their new names, with a warning; both set is an error."""
    if not isinstance(raw, Mapping):
        return raw, []
    raw, errors = copy.deepcopy(dict(raw)), []
    for old, new in RENAMED.items():
        *old_sections, old_leaf = old.split(".")
        parent = raw
        for section in old_sections:
            parent = parent.get(section) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or old_leaf not in parent:
            continue
        value = parent.pop(old_leaf)
        *new_sections, new_leaf = new.split(".")
        target = raw
        for section in new_sections:
            target = target.setdefault(section, {})
        if new_leaf in target:
            errors.append(f"'{old}' is the old name of '{new}'; set only '{new}' [{where}]")
            continue
        target[new_leaf] = value
        warnings.warn(f"config key '{old}' is deprecated, use '{new}' [{where}]", FutureWarning, stacklevel=2)
    return raw, errors


def _resolve(cfg: Config) -> None:
    """Fill the preset fields the user left at None, and the derived values."""
    alg = cfg.algorithm
    for key, value in registry.METHODS[alg.name].preset.items():
        section, _, leaf = key.rpartition(".")
        target = getattr(alg, section) if section else alg
        if getattr(target, leaf) is None:
            setattr(target, leaf, value)
    ro, ov = cfg.rollout, alg.overlong
    if alg.void_turn_masking is None:  # SimpleTIR's mask is for multi-turn tool use
        alg.void_turn_masking = ro.max_turns > 1
    if ov.max_length is None:
        ov.max_length = min(ro.max_turns * ro.max_tokens_per_turn, ro.max_episode_tokens)
    if ov.cache_length is None:
        ov.cache_length = max(1, ov.max_length // 5)
    if cfg.run.output_dir is None:
        cfg.run.output_dir = f"runs/{cfg.run.name}"


def _config_file(path: Path) -> Path:
    """A run directory means its resolved ``config.yaml``; a missing file suggests its neighbours."""
    if path.is_dir():
        path = path / CONFIG_FILE
    if path.is_file():
        return path
    siblings = sorted(p.name for p in path.parent.glob("*.y*ml")) if path.parent.is_dir() else []
    guess = difflib.get_close_matches(path.name, siblings, n=1)
    did = f" — did you mean '{path.parent / guess[0]}'?" if guess else ""
    listing = f" YAML files in {path.parent}: {', '.join(siblings)}" if siblings else ""
    raise ConfigError(f"config file not found: '{path}'{did}{listing}")


def _read_yaml(path: Path) -> Any:
    try:
        plain = yaml.safe_load(path.read_text())
        loaded = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and OmegaConf's own errors: report them the same way
        raise ConfigError(f"cannot parse {path}: {e}") from e
    if not isinstance(loaded, DictConfig) or not isinstance(plain, (dict, type(None))):  # empty: defaults
        found = type(plain).__name__
        raise ConfigError(f"{path} must hold a mapping of sections (run:, model:, ...), not a {found}")
    return OmegaConf.to_container(loaded, resolve=False)


def _parse_override(text: str) -> dict[str, Any]:
    """``a.b.c=value`` → ``{"a": {"b": {"c": value}}}``; the value is YAML (``20``, ``1e-5``,
    ``true``, ``null``, ``[1, 2]``, ``{k: v}``), anything else is a string."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts):
        raise ConfigError(f"override {text!r} must look like key=value, e.g. trainer.total_steps=20")
    try:  # OmegaConf's YAML reading also knows 1e-5 is a float
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))
    except Exception as e:
        raise ConfigError(f"override {text!r}: cannot parse the value: {e}") from e
    assert isinstance(parsed, dict)
    value: Any = parsed["v"]
    for part in reversed(parts):
        value = {part.strip(): value}
    return value


def _deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> None:
    """Mappings merge key by key (``env.options.b=2`` keeps ``a``); an empty mapping replaces what
    was there (``data.options={}`` clears the preset's knobs)."""
    for key, value in update.items():
        if isinstance(value, Mapping) and value and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def _paths(tree: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        yield prefix + key
        if isinstance(value, Mapping):
            yield from _paths(value, f"{prefix}{key}.")


def _plain(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
