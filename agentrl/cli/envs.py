"""``agentrl envs``: list the registered environments, show one, check them (``envs check``)."""

from __future__ import annotations

import argparse
import difflib
import json
import sys


def cmd_envs(args: argparse.Namespace) -> int:
    from agentrl.env import entry_point_errors, import_environment_module, registered

    if args.module:
        try:
            import_environment_module(args.module)
        except Exception as e:  # FileNotFoundError, ModuleNotFoundError, the module itself raising
            print(f"--module {args.module!r} cannot be imported: {type(e).__name__}: {e}", file=sys.stderr)
            return 2

    envs = registered()
    if args.action == "list":
        for name, cls in sorted(envs.items()):
            doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
            print(f"{name:20s} {doc[0] if doc else ''}")
        for name, why in sorted(entry_point_errors().items()):
            print(f"{name:20s} NOT LOADED: {why}")
        return 0
    from agentrl.cli.env_tasks import given_tasks
    from agentrl.config import ConfigError
    from agentrl.env.check import check_environment, format_report

    config, *overrides = args.config or [None]  # --config FILE [key=value ...]
    try:
        given = given_tasks(config, overrides, args.data)
    except (ConfigError, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    envs = registered()  # --config may have imported env.module
    names = args.names or given.names or (sorted(envs) if args.all else [])
    problem = _env_names_problem(args, names, envs) or _env_options_problem(args, names, envs)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    options = json.loads(args.options) if args.options else given.options
    failed = 0
    for name in names:
        report = check_environment(
            name, options, limit_s=args.timeout_s, tasks=given.tasks, source=given.source
        )
        report.calls.close()  # its helper thread
        if args.all and report.missing:  # an adapter whose package is not installed
            print(f"environment {name!r}: SKIPPED: {report.missing}")
            continue
        print(format_report(report))
        failed += not report.ok
    return 1 if failed else 0


def _env_names_problem(args: argparse.Namespace, names: list[str], envs: dict[str, type]) -> str | None:
    """Why ``agentrl envs check`` cannot check these names (none given, unknown, not loaded), or None."""
    from agentrl.env import entry_point_errors

    if not names:
        return "name an environment, or pass --all"
    broken = entry_point_errors()
    for name in names:
        if name in broken:
            return f"environment {name!r} is installed but could not be loaded: {broken[name]}"
        if name not in envs:
            guess = difflib.get_close_matches(name, list(envs), n=1)
            did = f" — did you mean '{guess[0]}'?" if guess else "."
            hint = (
                ""
                if args.module
                else " If it is defined in your own file or package, pass --module path/to/file.py (or pkg.module)."
            )
            return f"unknown environment {name!r}{did} Registered: {', '.join(sorted(envs))}.{hint}"
    return None


def _env_options_problem(args: argparse.Namespace, names: list[str], envs: dict[str, type]) -> str | None:
    """Why ``--options`` does not fit these environments (not JSON, not an object, an unknown key), or None."""
    from agentrl.env import option_problem

    try:
        options = json.loads(args.options) if args.options else {}
    except json.JSONDecodeError as e:
        return f"--options must be a JSON object, e.g. '{{\"max_turns\": 4}}': {e}"
    for name in names:
        problem = (
            option_problem(envs[name], options)
            if isinstance(options, dict)
            else "--options is not a JSON object"
        )
        if problem:
            return f"--options: {problem}"
    return None
