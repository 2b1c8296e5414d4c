"""The environment registry: ``@register``, a user's module imported by ``env.module``, the installed
packages' ``agentrl.environments`` entry points (loaded once, a broken one reported, not raised), and
``make_env``."""

from __future__ import annotations

import difflib
import inspect
import threading
from collections.abc import Mapping
from typing import Any

from agentrl.env.base import Environment

_REGISTRY: dict[str, type[Environment]] = {}


def register(cls: type[Environment]) -> type[Environment]:
    """Class decorator: add an environment under ``cls.name``; duplicate names are refused."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name` to be registered")
    prev = _REGISTRY.get(cls.name)
    if prev is not None and prev is not cls and not _same_definition(prev, cls):
        raise ValueError(
            f"environment name {cls.name!r} is already registered by {prev.__module__}.{prev.__qualname__}"
        )
    _REGISTRY[cls.name] = cls
    return cls


def import_environment_module(spec: str) -> None:
    """Import a user's environment module (``pkg.module``) or file (``path/to/env.py``) so that its
    ``@register`` decorators run. Importing the same file twice is a no-op."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    if spec.endswith(".py"):
        path = Path(spec).resolve()
        if not path.exists():
            raise FileNotFoundError(f"env.module: no such file {spec!r}")
        name = f"agentrl_user_env_{path.stem}_{abs(hash(str(path))) % 10**8}"
        if name in sys.modules:
            return
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        importlib.import_module(spec)


def _same_definition(a: type, b: type) -> bool:
    """The same class statement imported twice under two module names (e.g. a test module imported
    both as ``tests.x`` and ``x``): not a name clash."""
    try:
        return a.__qualname__ == b.__qualname__ and inspect.getsourcefile(a) == inspect.getsourcefile(b)
    except TypeError:
        return False


ENTRY_POINT_GROUP = "agentrl.environments"
"""The entry-point group installed packages declare their environments in (``name = "pkg.mod:Class"``,
or a module whose ``@register`` decorators run on import). The built-in environments are declared
there too (pyproject.toml)."""
_PLUGINS_LOCK = threading.Lock()
_PLUGINS_LOADED = False
_PLUGIN_ERRORS: dict[str, str] = {}


def registered() -> dict[str, type[Environment]]:
    """Every environment: those of the installed packages' ``agentrl.environments`` entry points, and
    those registered by modules imported so far (``env.module``, a test's classes)."""
    _load_entry_points()
    return dict(_REGISTRY)


def entry_point_errors() -> dict[str, str]:
    """Entry point name -> why it could not be loaded (its package raised on import, or it does not
    name an environment); such an environment is missing from ``registered()``."""
    _load_entry_points()
    return dict(_PLUGIN_ERRORS)


def _load_entry_points() -> None:
    global _PLUGINS_LOADED
    with _PLUGINS_LOCK:
        if _PLUGINS_LOADED:
            return
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            where = f"entry point {ep.name} = {ep.value!r} ({ENTRY_POINT_GROUP})"
            try:
                obj = ep.load()
            except Exception as e:  # one broken package must not hide the others
                _PLUGIN_ERRORS[ep.name] = f"{where} cannot be imported: {type(e).__name__}: {e}"
                continue
            if isinstance(obj, type) and issubclass(obj, Environment):
                if obj.name != ep.name:
                    _PLUGIN_ERRORS[ep.name] = f"{where} names a class whose name is {obj.name!r}"
                    continue
                register(obj)
            elif not inspect.ismodule(obj):
                _PLUGIN_ERRORS[ep.name] = f"{where} is neither an Environment subclass nor a module"
        _PLUGINS_LOADED = True


def _unknown(name: str, envs: Mapping[str, Any]) -> str:
    """Why ``name`` is not an environment, for error messages: a close name, or a failed entry point."""
    broken = _PLUGIN_ERRORS.get(name)
    if broken:
        return f"environment {name!r} is installed but could not be loaded: {broken}"
    hint = difflib.get_close_matches(name, list(envs), n=1)
    did = f" Did you mean {hint[0]!r}?" if hint else ""
    return f"unknown environment {name!r}.{did} Registered: {', '.join(sorted(envs))}"


def make_env(name: str, **options: Any) -> Environment:
    envs = registered()
    if name not in envs:
        raise KeyError(_unknown(name, envs))
    return envs[name](**options)
