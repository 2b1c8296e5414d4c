"""The typed config: dataclasses are the schema, YAML files hold presets, the command line overrides.

    cfg = load_config("configs/quickstart.yaml", ["trainer.total_steps=20", "algorithm.name=grpo"])

The schema lives in ``agentrl.config.schema`` (re-exported here), a docstring under every field;
``describe_config()`` turns them into the table in ``docs/configuration.md``. Loading is strict and happens before any work: an unknown key, a wrong
type, an invalid choice or an out-of-range value raises ``ConfigError`` naming the key, what was
expected, and (for typos) the closest valid name. All problems are reported at once.

``algorithm.name`` is a preset: fields that default to ``None`` with "from the preset" in their
docstring take the preset's value (the method's record in ``agentrl.algorithms.registry.METHODS``,
from docs/algorithms.md, "Advantages", "Policy loss", "Token weightings"), unless the user set them. Each token weighting's settings are a
registered section, ``algorithm.<name>``, checked by the rules in its record when it is selected. Derived values (``run.output_dir``, ``model.tokenizer``, the overlong lengths) are filled in
too, so the resolved config saved in the run directory holds concrete values only. Interpolation
(``${...}``) is refused: what can be derived is derived here, in one place.
"""

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
from agentrl.config.schema import (  # noqa: F401  (re-exported: import sections from here)
    AlgorithmConfig,
    Config,
    DataConfig,
    EnvConfig,
    EvalConfig,
    LimitsConfig,
    LoggingConfig,
    ModelConfig,
    OverlongConfig,
    RolloutConfig,
    RunConfig,
    SandboxConfig,
    SFTConfig,
    TrainerConfig,
    VLLMConfig,
)
from agentrl.env import entry_point_errors, import_environment_module, registered
from agentrl.env.demos import load_demonstrations

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


# ------------------------------------------------------------------------------------ public API
def output_dir(cfg: Config) -> Path:
    """The run's directory: ``run.output_dir``, or ``runs/<run.name>`` when that is unset."""
    return Path(cfg.run.output_dir or f"runs/{cfg.run.name}")


def weighting_name(cfg: Config) -> str:
    """The token weighting ``algorithm.name`` trains with (``none`` for the plain surrogate)."""
    return registry.METHODS[cfg.algorithm.name].weighting


def weighting_settings(cfg: Config) -> Any:
    """That weighting's settings section (``cfg.algorithm.stare`` for STARE), or None."""
    return cfg.algorithm.settings.get(weighting_name(cfg))


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


# ------------------------------------------------------------------------------------ the loader
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
        *_cross_checks(cfg),
        *_environment_problems(cfg),
        *_demonstration_problems(cfg),
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
        return []  # said by _environment_problems, with the directory it was looked for in
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
    if ov.max_length is None:
        ov.max_length = min(ro.max_turns * ro.max_tokens_per_turn, ro.max_episode_tokens)
    if ov.cache_length is None:
        ov.cache_length = max(1, ov.max_length // 5)
    if cfg.run.output_dir is None:
        cfg.run.output_dir = f"runs/{cfg.run.name}"


def _cross_checks(cfg: Config) -> Iterator[tuple[str, str]]:
    """Rules that involve more than one key, as ``(key, message)``."""
    yield from _source_problems(cfg)
    yield from _batch_problems(cfg)
    yield from _mode_problems(cfg)
    empty = [i for i, s in enumerate(cfg.rollout.stop) if not s]
    if empty:
        yield "rollout.stop", f"rollout.stop[{empty[0]}] is an empty string: a stop string must hold text"


def _source_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """Where code runs and where the data comes from."""
    if cfg.sandbox.backend == "unisolated" and not cfg.sandbox.allow_unisolated:
        yield (
            "sandbox.backend",
            (
                "sandbox.backend='unisolated' runs model-written code with no isolation; set "
                "sandbox.allow_unisolated=true to accept that risk, or use bwrap, docker or e2b"
            ),
        )
    if cfg.data.source != "builtin" and not cfg.data.path:
        yield "data.source", f"data.path is required when data.source={cfg.data.source!r}"
    if cfg.data.source == "builtin":
        for key in ("path", "test_path", "columns"):
            if getattr(cfg.data, key):
                yield (
                    f"data.{key}",
                    f"data.{key} is set, but data.source=builtin takes the environment's own tasks and ignores "
                    "it: set data.source=file (or hub) to train on that data",
                )


def _batch_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """The shape of a step's batch, its sampling and the warm start's schedule."""
    ro, alg = cfg.rollout, cfg.algorithm
    if ro.max_tokens_per_turn > ro.max_episode_tokens:
        yield (
            "rollout.max_tokens_per_turn",
            (
                f"rollout.max_tokens_per_turn={ro.max_tokens_per_turn} exceeds "
                f"rollout.max_episode_tokens={ro.max_episode_tokens}"
            ),
        )
    if ro.prompts_per_step % cfg.trainer.mini_batches_per_step:
        yield (
            "trainer.mini_batches_per_step",
            (
                f"rollout.prompts_per_step={ro.prompts_per_step} must be divisible by "
                f"trainer.mini_batches_per_step={cfg.trainer.mini_batches_per_step} (mini-batches split the groups evenly)"
            ),
        )
    if alg.dynamic_sampling and ro.group_size < 2:
        yield (
            "rollout.group_size",
            (
                "algorithm.dynamic_sampling needs rollout.group_size >= 2 (a group of one never has a reward spread)"
            ),
        )
    if alg.overlong.enabled and alg.overlong.cache_length >= alg.overlong.max_length:  # type: ignore[operator]
        yield (
            "algorithm.overlong.cache_length",
            (
                f"algorithm.overlong.cache_length={alg.overlong.cache_length} must be below "
                f"algorithm.overlong.max_length={alg.overlong.max_length}"
            ),
        )
    if cfg.sft.weights == "lora" and cfg.model.lora.rank == 0:
        yield (
            "sft.weights",
            "sft.weights=lora trains adapters with model.lora's settings, but model.lora.rank is 0: set "
            "model.lora.rank (e.g. 16) or sft.weights=full",
        )
    for key, value, unset in (("patience", cfg.sft.patience, 0), ("eval_every", cfg.sft.eval_every, 50)):
        if value != unset and cfg.sft.holdout == 0:
            yield (
                f"sft.{key}",
                f"sft.{key}={value} acts on the held-out loss, but sft.holdout=0 holds nothing out: set "
                f"sft.holdout (e.g. 0.1) or leave sft.{key} at {unset}",
            )


def _mode_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """Sync or async, the weight transport, colocation and the method's own rules."""
    ro = cfg.rollout
    if cfg.trainer.chunked_head == "always" and cfg.trainer.strategy == "fsdp2":
        yield (
            "trainer.chunked_head",
            "trainer.chunked_head=always applies the output head outside the model's forward, where FSDP2 "
            "has not gathered it: use trainer.chunked_head=auto (the whole logits under FSDP2) or trainer.strategy=ddp",
        )
    if cfg.trainer.mode == "async" and ro.on_stale == "drop" and ro.max_staleness == 0:
        yield (
            "rollout.on_stale",
            "rollout.on_stale=drop with rollout.max_staleness=0 drops every batch sampled during an update: "
            "use rollout.on_stale=wait (K = 0 then trains exactly like trainer.mode=sync) or max_staleness >= 1",
        )
    if ro.sync.transport != "object_store" and ro.workers == 0:
        yield (
            "rollout.sync.transport",
            f"rollout.sync.transport={ro.sync.transport} sends the weights from the trainer to Ray rollout "
            "workers, but rollout.workers=0 runs the engine in the trainer's process (it takes the tensors "
            "directly): set rollout.workers >= 1 or rollout.sync.transport=object_store",
        )
    yield from _engine_placement_problems(cfg)
    if ro.colocate.sleep:
        yield from _colocate_problems(cfg)
    weighting = registry.WEIGHTINGS[weighting_name(cfg)]
    if weighting.check is not None:  # the selected method's own rules (its record)
        yield from weighting.check(weighting_settings(cfg), cfg.trainer)


def _engine_placement_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """Engine settings that only some engines or placements use: the HF engine's poll interval, the
    workers' GPU share, tensor parallelism's limits."""
    ro = cfg.rollout
    if ro.poll_every is not None and ro.engine != "hf":
        yield (
            "rollout.poll_every",
            f"rollout.poll_every={ro.poll_every} sets the HF engine's decode loop, but rollout.engine="
            f"{ro.engine!r} has its own scheduler: leave rollout.poll_every unset",
        )
    if ro.worker_gpus is not None and ro.workers == 0:
        yield (
            "rollout.worker_gpus",
            f"rollout.worker_gpus={ro.worker_gpus:g} is the GPU share of each Ray rollout worker, but "
            "rollout.workers=0 runs the engine in the trainer's process: set rollout.workers >= 1 or leave "
            "rollout.worker_gpus unset",
        )
    u, w = ro.vllm.gpu_memory_utilization, ro.worker_gpus
    if ro.workers > 0 and ro.engine == "vllm" and w is not None and 0 < w < 1 and u > w:
        yield (
            "rollout.vllm.gpu_memory_utilization",
            f"rollout.vllm.gpu_memory_utilization={u:g} is the share of a GPU each worker's vLLM engine "
            f"reserves, but rollout.worker_gpus={w:g} gives each worker only {w:g} of one (the others on the "
            f"GPU would find no memory): set gpu_memory_utilization <= {w:g}",
        )
    tp = ro.vllm.tensor_parallel_size if ro.engine == "vllm" else 1
    if tp > 1 and ro.sync.verify != "off":
        yield (
            "rollout.sync.verify",
            f"rollout.vllm.tensor_parallel_size={tp}: the weight sync's proof reads whole tensors from the "
            "engine, and each of its GPUs holds a slice: set rollout.sync.verify=off (the gathering read is "
            "not written)",
        )
    if tp > 1 and ro.workers == 0 and cfg.trainer.mode == "async":
        yield (
            "trainer.mode",
            f"trainer.mode=async with a colocated vLLM engine of rollout.vllm.tensor_parallel_size={tp}: the "
            "ranks of a tensor-parallel group follow their leader's generation calls in the trainer's main "
            "thread, which async mode keeps for the update; use trainer.mode=sync, or rollout.workers > 0",
        )


def _colocate_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """``rollout.colocate.sleep`` needs vLLM's sleep mode (GPU only), an engine in the trainer's
    process, and updates that no rollout overlaps."""
    ro, problems = cfg.rollout, []
    if ro.engine != "vllm":
        problems.append(
            "rollout.colocate.sleep needs an engine with sleep mode, rollout.engine=vllm on a GPU; "
            f"rollout.engine={ro.engine!r} has none: set rollout.colocate.sleep=false"
        )
    if cfg.trainer.mode == "async":
        problems.append(
            "rollout.colocate.sleep puts the engine to sleep for every update, but trainer.mode=async "
            "generates during updates: use trainer.mode=sync, or rollout.colocate.sleep=false"
        )
    if ro.workers > 0:
        problems.append(
            "rollout.colocate.sleep acts on the engine in the trainer's process, but "
            f"rollout.workers={ro.workers} runs the engines in Ray workers (no sleep/wake there): set "
            "rollout.workers=0 or rollout.colocate.sleep=false"
        )
    if cfg.run.device in ("cpu", "auto"):
        import torch

        if cfg.run.device == "cpu" or not torch.cuda.is_available():
            where = "run.device=cpu" if cfg.run.device == "cpu" else "run.device=auto found no GPU here"
            problems.append(
                "rollout.colocate.sleep needs a GPU: vLLM's sleep mode runs on CUDA and ROCm only, and "
                f"{where}; set rollout.colocate.sleep=false on CPU"
            )
    for message in problems:
        yield "rollout.colocate.sleep", message


def _environment_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """``env.module`` imports and ``env.name`` is registered: checked with the rest of the config,
    before any work (a typo must not cost a warm start first)."""
    if cfg.env.module:
        try:
            import_environment_module(cfg.env.module)
        except FileNotFoundError:
            yield (
                "env.module",
                f"env.module={cfg.env.module!r}: no such file (a relative path is resolved against the "
                f"current directory, {os.getcwd()})",
            )
            return
        except Exception as e:  # ModuleNotFoundError, or the user's module itself raising
            yield "env.module", f"env.module={cfg.env.module!r} cannot be imported: {type(e).__name__}: {e}"
            return
    envs = registered()
    broken = entry_point_errors().get(cfg.env.name)
    if broken:
        yield "env.name", f"env.name={cfg.env.name!r} is installed but could not be loaded: {broken}"
        return
    if cfg.env.name not in envs:
        guess = difflib.get_close_matches(cfg.env.name, list(envs), n=1)
        did = f" — did you mean '{guess[0]}'?" if guess else "."
        hint = (
            ""
            if cfg.env.module
            else " If it is defined in your own file or package, set env.module to that .py file or "
            "module name so it is imported first."
        )
        yield (
            "env.name",
            f"unknown environment env.name={cfg.env.name!r}{did} Registered: {', '.join(sorted(envs))}.{hint}",
        )


def _demonstration_problems(cfg: Config) -> Iterator[tuple[str, str]]:
    """``sft.demos`` exists and every line is a conversation (read once, before any work)."""
    if not (cfg.sft.enabled and cfg.sft.demos):
        return
    if not Path(cfg.sft.demos).is_file():
        yield (
            "sft.demos",
            f"sft.demos={cfg.sft.demos!r}: no such file (the current directory is {os.getcwd()})",
        )
        return
    try:
        load_demonstrations(cfg.sft.demos)
    except ValueError as e:
        yield "sft.demos", f"sft.demos: {e}"


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


# --------------------------------------------------------------------------------- documentation
_PRESET_NOTE = "from the preset"
DOC_BEGIN = "<!-- BEGIN GENERATED by `python -m agentrl.config --write-doc docs/configuration.md` -->"
DOC_END = "<!-- END GENERATED -->"


def describe_config() -> str:
    """Markdown: every key with its type, default and docstring, then the table of presets."""
    preset_keys = {f"algorithm.{k}" for k in registry.GRPO}

    def default_text(path: str, default: Any) -> str | None:
        return f"*{_PRESET_NOTE}*" if path in preset_keys else None

    table = dataclass_tree.describe_table(Config, default_text)
    methods = list(registry.METHODS.values())
    head = "| `algorithm.name` | " + " | ".join(f"`{m.name}`" for m in methods) + " |"
    rows = [head, "|---" * (len(methods) + 1) + "|"]
    for key in registry.GRPO:
        cells = " | ".join(dataclass_tree._yaml_scalar(m.preset[key]) for m in methods)
        rows.append(f"| `algorithm.{key}` | {cells} |")
    rows.append("| token weighting | " + " | ".join(m.weighting for m in methods) + " |")
    return f"{table}\n\n### Presets\n\n" + "\n".join(rows)


def _generated_block() -> str:
    return f"{DOC_BEGIN}\n\n{describe_config()}\n\n{DOC_END}"


def write_doc(path: str | Path) -> None:
    """Replace the generated part of ``docs/configuration.md`` (between the markers)."""
    p = Path(path)
    text = p.read_text()
    start, end = text.index(DOC_BEGIN), text.index(DOC_END) + len(DOC_END)
    p.write_text(text[:start] + _generated_block() + text[end:])
