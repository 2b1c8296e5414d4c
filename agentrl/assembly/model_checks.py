"""The model and tokenizer locations a config names, checked before a run loads them."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from agentrl.config import CONFIG_FILE, Config
from agentrl.models import gguf

HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""``org/name``: what a hub model name looks like (a path that does not exist locally)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def model_problems(cfg: Config) -> Iterator[str]:
    """``model.path``, ``model.tokenizer``, and ``model.ref_path`` when the KL term reads it."""
    m = cfg.model
    yield from path_problems("model.path", m.path, tokenizer=m.tokenizer is None)
    if m.tokenizer:
        yield from path_problems("model.tokenizer", m.tokenizer, weights=False)
    if cfg.algorithm.kl_coef > 0 and m.ref_path:
        yield from path_problems("model.ref_path", m.ref_path, tokenizer=False)


def path_problems(key: str, value: str, weights: bool = True, tokenizer: bool = True) -> Iterator[str]:
    """A model (``weights``) or tokenizer location: ``tiny:PRESET``, a local directory holding
    config.json (and tokenizer files), or a hub name that exists in the local cache or on the hub."""
    from agentrl.models import PRESETS

    if value.startswith("tiny:"):
        if value.removeprefix("tiny:") not in PRESETS:
            yield f"{key}={value!r}: no such tiny preset; valid: {', '.join('tiny:' + p for p in PRESETS)}"
        return
    if gguf.is_packaged(value) or gguf.is_gguf(value):
        try:
            file = gguf.packaged_file(value) if gguf.is_packaged(value) else Path(value).expanduser()
        except gguf.ModelFileError as e:
            yield str(e)
            return
        problem = gguf.gguf_problem(file)
        if problem:
            yield f"{key}={value!r}: {problem}"
        return
    path = Path(value).expanduser()
    if path.is_dir():
        yield from _directory_problems(key, path, weights, tokenizer)
    elif path.exists():
        yield f"{key}={value!r} is a file; a model is a directory with config.json, the weights and the tokenizer"
    elif HUB_NAME.fullmatch(value) and not value.startswith("."):
        yield from _hub_problems(key, value)
    else:
        yield (
            f"{key}={value!r}: no such directory (relative paths start from {os.getcwd()}). Give a local "
            "model directory (config.json, weights, tokenizer), a hub name such as Qwen/Qwen2.5-0.5B-Instruct, "
            "or tiny:h128-L8"
        )


def _directory_problems(key: str, path: Path, weights: bool, tokenizer: bool) -> Iterator[str]:
    if (path / CONFIG_FILE).is_file() and (path / "checkpoints").is_dir():
        yield (
            f"{key}={str(path)!r} is an agentrl run directory: use one of its checkpoints "
            f"({path}/checkpoints/step_N), or `agentrl export {path} OUT` and OUT"
        )
        return
    if weights and (path / "adapter").is_dir() and not (path / "model.safetensors").exists():
        yield (
            f"{key}={str(path)!r} is a LoRA checkpoint (adapters only): `agentrl export {path} OUT` merges "
            "them into the base model; use OUT"
        )
        return
    if weights:
        yield from _config_json_problems(key, path)
    if tokenizer:
        yield from _tokenizer_problems(key, path)


def _config_json_problems(key: str, path: Path) -> Iterator[str]:
    config = path / "config.json"
    if not config.is_file():
        yield f"{key}={str(path)!r} has no config.json: not a Hugging Face model directory"
        return
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (ValueError, AttributeError) as e:
        yield f"{key}: {config} is not a JSON object ({e})"
        return
    if not model_type:
        yield f"{key}: {config} has no model_type, so transformers cannot tell the architecture"


def _tokenizer_problems(key: str, path: Path) -> Iterator[str]:
    """The tokenizer files, and a chat template: agentrl renders every episode with it."""
    if not any((path / f).exists() for f in TOKENIZER_FILES):
        yield (
            f"{key}={str(path)!r} holds no tokenizer ({', '.join(TOKENIZER_FILES)}): save the tokenizer "
            "there, or name its directory in model.tokenizer"
        )
        return
    config = path / "tokenizer_config.json"
    try:
        in_config = config.is_file() and bool(json.loads(config.read_text()).get("chat_template"))
    except ValueError as e:
        yield f"{key}: {config} is not valid JSON ({e})"
        return
    if not (in_config or (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file()):
        yield (
            f"{key}={str(path)!r}: its tokenizer has no chat template, and agentrl renders every episode with "
            "one. Save a Jinja template as chat_template.jinja in that directory (or as chat_template in "
            "tokenizer_config.json), e.g. the model family's own; or point model.tokenizer at a tokenizer "
            "directory that has one"
        )


def _hub_problems(key: str, name: str) -> Iterator[str]:
    """A hub name: fine when its config.json is in the local hub cache or can be fetched."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    try:
        from transformers import AutoConfig

        AutoConfig.from_pretrained(name)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        yield (
            f"{key}={name!r}: no such local directory, and the hub did not give it "
            f"({type(e).__name__}: {first[:200]}). Give a local model directory, or check the name and "
            "the network (HF_HUB_OFFLINE=1 means the hub cache only)"
        )
