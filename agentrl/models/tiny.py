"""Tiny local policies: a randomly initialised Qwen2-architecture model (``PRESETS``) and a byte-level
BPE tokenizer trained on the synthetic corpus, built once and cached under ``$AGENTRL_CACHE``. The
package's docstring says why the tokenizer is Qwen2's pipeline and which ids the special tokens take."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from agentrl.models.corpus import generate_corpus
from agentrl.models.tokenizer import TINY_MARKER, load_tokenizer

PAD_TOKEN, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
"""Control tokens; ``skip_special_tokens`` removes them when decoding."""
ADDED_TOKENS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
"""Single tokens that are ordinary text (kept by ``skip_special_tokens``), as in Qwen2.5."""
TINY_FORMAT = 1
"""Bumped whenever the corpus, template or build changes, so stale caches are not reused."""
CHAT_TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "assets" / "chat_template.jinja"
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
"""Qwen2's pre-tokenizer split: ``\\p{N}`` alone makes each digit a separate pre-token."""

console = Console(stderr=True)


@dataclass(frozen=True)
class TinyShape:
    """Architecture dials of a tiny Qwen2 model; grouped-query attention with 2 KV heads."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


PRESETS: dict[str, TinyShape] = {
    "h128-L8": TinyShape(128, 8, 4, 2, 448),  # 2.0 M parameters at vocab 1024
    "h128-L4": TinyShape(128, 4, 4, 2, 448),  # 1.1 M: half the layers (the study's families)
    "h384-L7": TinyShape(384, 7, 6, 2, 1472),  # 15.4 M
    "h640-L12": TinyShape(640, 12, 10, 2, 2048),  # 60.3 M
}


# -- tokenizer ----------------------------------------------------------------------------------
def chat_template() -> str:
    return CHAT_TEMPLATE_PATH.read_text()


def _render_for_corpus(messages: list[dict], tools: list[dict] | None) -> str:
    """Render with the real template (jinja through transformers) so the corpus holds its exact markup."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered = render_jinja_template([messages], tools=tools, chat_template=chat_template())  # type: ignore[arg-type]
    return rendered[0][0]


def train_tokenizer(vocab_size: int = 1024, seed: int = 0, n_docs: int = 3000) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the synthetic corpus (~1 s) and wrap it for transformers.

    Deterministic: the same (vocab_size, seed, n_docs) gives the same vocabulary and merges."""
    return wrap_tokenizer(
        train_bpe(SPECIAL_TOKENS, ADDED_TOKENS, _render_for_corpus, vocab_size, seed, n_docs)
    )


def train_bpe(
    special: Sequence[str],
    added: Sequence[str],
    render_chat: Callable[[list[dict], list[dict] | None], str],
    vocab_size: int = 1024,
    seed: int = 0,
    n_docs: int = 3000,
) -> Tokenizer:
    """Qwen2's pipeline (NFC, its split regex, byte level) trained on the synthetic corpus, whose chats
    ``render_chat`` writes in some template's markup. ``special`` then ``added`` take the first ids;
    ``added`` tokens stay single tokens but decode as ordinary text (Qwen's ``<tool_call>``)."""
    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*special, *added],  # the first ids, never split by the corpus
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(generate_corpus(seed, n_docs, render_chat=render_chat), trainer)
    # The trainer registers every reserved token as special; the added ones are ordinary text.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tok


def wrap_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        padding_side="left",
        model_max_length=8192,
        chat_template=chat_template(),
        clean_up_tokenization_spaces=False,
        **{TINY_MARKER: True},
    )


# -- tiny models --------------------------------------------------------------------------------
def tiny_config(
    shape: TinyShape,
    tokenizer: PreTrainedTokenizerBase,
    tie_word_embeddings: bool = False,
    max_position_embeddings: int = 8192,
) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=int(tokenizer.eos_token_id),  # type: ignore[arg-type]
        pad_token_id=int(tokenizer.pad_token_id),  # type: ignore[arg-type]
        use_sliding_window=False,
        dtype="float32",
    )


def build_tiny_model(
    out_dir: str | os.PathLike,
    preset: str = "h128-L8",
    *,
    hidden_size: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
    seed: int = 0,
    tie_word_embeddings: bool = False,
    max_position_embeddings: int = 8192,
) -> Path:
    """Save a randomly initialised Qwen2ForCausalLM and its tokenizer (HF format) to ``out_dir``.

    Explicit dials override the preset's (e.g. ``preset="h128-L8", num_layers=2`` for fast tests).
    Embeddings are untied by default: vLLM on CPU keeps a stale prepacked ``lm_head`` after a weight
    reload when they are tied (MACHINE.md). Without a tokenizer, one is trained (vocab 1024, seed 0)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny preset {preset!r}; valid: {sorted(PRESETS)}")
    base = PRESETS[preset]
    shape = TinyShape(
        hidden_size or base.hidden_size,
        num_layers or base.num_layers,
        num_heads or base.num_heads,
        num_kv_heads or base.num_kv_heads,
        intermediate_size or base.intermediate_size,
    )
    if tokenizer is None:
        tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir is not None else train_tokenizer()
    config = tiny_config(shape, tokenizer, tie_word_embeddings, max_position_embeddings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")


def ensure_tiny_base(preset: str = "h128-L8", cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached tiny base model for ``preset``, built on first use (seed 0).

    The build happens in a temporary directory next to the target and is renamed into place, so a
    crashed or concurrent build never leaves a half-written model that later runs would load."""
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny preset {preset!r}; valid: {sorted(PRESETS)}")
    root = cache_root(cache_dir) / "tiny"
    target = root / f"{preset}-v{TINY_FORMAT}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    console.log(f"[agentrl] building tiny model {preset} into {target} (first use only)")
    tmp = Path(tempfile.mkdtemp(prefix=f".{preset}-", dir=root))
    try:
        build_tiny_model(tmp, preset, seed=0)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent winner: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    console.log(f"[agentrl] tiny model {preset} ready")
    return target
